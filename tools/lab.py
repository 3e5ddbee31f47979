"""`make lab`: what JupyterLab opens on. Into the lab's root (notebooks/) it writes

- `index.ipynb`, where JupyterLab opens: the chapters in the book's order (book/_toc.yml) under
  their titles, numbered as in the book, each with its reading copy and the notebook to run, and
  the pages on rerunning (`PAGES`: the rerun page, Appendix B on the numbers, the Flower page);
- `as-in-the-book/NN_name (as in the book).ipynb`: a reading copy of each executed chapter, whose
  text shows the numbers, figures, citations and links as the book prints them (`reading_copy`);
- `as-in-the-book/rerun (as in the book).ipynb`, ...: those pages, likewise.

A copy's file name says what it is, so its tab never reads like the tab of the notebook it was
made from. `make lab` writes them anew each time.

    python -m tools.lab NOTEBOOKS_DIR CHAPTER.ipynb ...
"""
from __future__ import annotations

import json
import posixpath
import sys
from pathlib import Path

from tools.reading_copy import REPO_ROOT, bibliography, copy_name, read_book, reading_copy, toc_parts

__all__ = ["COPIES_DIR", "INDEX", "PAGES", "write_lab"]

COPIES_DIR = "as-in-the-book"
INDEX = "index.ipynb"
PAGES = ("book/rerun", "book/numerics", "book/flower")  # the prose pages a reader of the notebooks needs
METADATA = {"kernelspec": {"display_name": "Python 3 (fedsteer)", "language": "python", "name": "python3"},
            "language_info": {"name": "python"}}


def _notebook(cells: list[str], metadata: dict) -> dict:
    return {"cells": [{"cell_type": "markdown", "id": f"cell-{i}", "metadata": {}, "source": text}
                      for i, text in enumerate(cells)],
            "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}


def _write(path: Path, nb: dict) -> Path:
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf8")
    return path


def _link(text: str, target: str) -> str:
    return f"[{text}](<{target}>)"


def index_notebook(book, chapters: list[Path]) -> dict:
    """The lab's first page: every page with a copy, part by part, in the book's order."""
    stems = {p.stem for p in chapters}
    lines = ["# FedSteer Book in JupyterLab", "",
             "Each chapter is here twice. **As in the book**: a reading copy of the chapter as `make lab` "
             "found it executed, with its numbers, figures, citations and links as the book prints them "
             f"(in `{COPIES_DIR}/`; rerunning a copy does not change its text). **To run**: the notebook "
             "itself, to edit and rerun; its Markdown shows the book's roles and directives as written.", "",
             f"This page is written by `make lab` (`tools/lab.py`), which rewrites it and the copies each time."]
    for caption, docs in toc_parts():
        rows = []
        for doc in docs:
            if doc not in book.copies:
                continue
            stem = posixpath.basename(doc)
            row = f"- {_link(book.titles[doc], f'{COPIES_DIR}/{book.copies[doc]}')}"
            rows.append(row + (f" (to run: {_link(f'{stem}.ipynb', f'{stem}.ipynb')})" if stem in stems else ""))
        if rows:
            lines += ["", f"## {caption or 'The book'}", "", *rows]
    return _notebook(["\n".join(lines)], METADATA)


def write_lab(root: Path, chapters: list[Path]) -> list[Path]:
    """Write the index, the chapters' reading copies and the copies of `PAGES` under `root`."""
    copies = root / COPIES_DIR
    copies.mkdir(parents=True, exist_ok=True)
    book, bib = read_book(chapters, PAGES), bibliography()
    written = []
    for path in chapters:
        nb = json.loads(path.read_text(encoding="utf8"))
        profile = nb.get("metadata", {}).get("papermill", {}).get("parameters", {}).get("profile")
        run = f"executed with `profile = \"{profile}\"`" if profile else "with its committed outputs"
        note = (f"*Reading copy of [../{path.name}](../{path.name}) {run}: its text shows the numbers, "
                f"citations and links as the book prints them. Rerunning it here does not change "
                f"the text; edit and rerun the chapter itself. `make lab` rewrites this copy.*")
        doc = next((d for d in book.copies if posixpath.basename(d) == path.stem), f"book/chapters/{path.stem}")
        written.append(_write(copies / copy_name(doc), reading_copy(nb, doc, book, bib, note)))
    for doc in PAGES:
        page = _notebook([(REPO_ROOT / f"{doc}.md").read_text(encoding="utf8")], METADATA)
        note = f"*The book's page `{doc}.md` as the book prints it. `make lab` rewrites this copy.*"
        written.append(_write(copies / copy_name(doc), reading_copy(page, doc, book, bib, note)))
    written.append(_write(root / INDEX, index_notebook(book, chapters)))
    return written


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for path in write_lab(Path(argv[0]), [Path(a) for a in argv[1:]]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
