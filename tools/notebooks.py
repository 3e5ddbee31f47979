"""The committed notebooks as a reader opens them in JupyterLab, kept in step with their prose.

    python -m tools.notebooks sync [--check]          # the reader cells below, in every notebook
    python -m tools.notebooks refresh [NOTEBOOK ...]  # execute in place with the `quick` profile, then sync
    python -m tools.notebooks times PROFILE NB ...    # record how long papermill took for each chapter
    python -m tools.notebooks execute OUTDIR [--profile paper] [--seeds 0,1] [--jobs 2]   # the book's chapters

`sync` makes each notebook of `notebooks/` what a JupyterLab reader needs, and the book leaves out:

- a line under the chapter's title that links the rerun page (`RERUN_LINE`);
- no papermill `injected-parameters` cell (papermill writes executed copies to `book/chapters/`
  only), and the parameters cell tagged `remove-cell`, so the book shows no parameters;
- under the title, a note for the JupyterLab reader (tagged out of the book): the stored outputs
  are the small `quick` test profile; one edit gives the book's numbers without computing; what
  Run All costs in each profile (from `data/chapter_times.json`); the chapter's reading copy;
- after each paragraph that quotes glued numbers (`{glue:text}`), a cell tagged out of the book
  that shows those numbers after the words that lead to them (`notebook_glue.glued`), placed
  after the last cell that computes them.

`--check` changes nothing and exits 1 when a notebook is not in step (the test suite runs it).
`refresh` runs each notebook with papermill and no parameters (so nothing is injected) and
records its `quick` time; `times` records the times of executed chapters. The times live in one
place, `data/chapter_times.json`.

`execute` is how `make book` and `make test` run the chapters: each notebook is executed exactly as
a reader who edits its parameters cell would (the cell's `profile = ...` and `seeds = ...` lines
rewritten, nothing injected), `--jobs` at a time, into OUTDIR (`--record-times`: its time
recorded). With
FEDSTEER_NO_COMPUTE=1 in the environment (`make test`) a chapter that would compute a run or a
measurement fails, so the book that `make test` builds is the committed results' own.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
TIMES = ROOT / "data" / "chapter_times.json"
NOTE_TAG, NUMBERS_TAG = "jupyterlab-note", "jupyterlab-numbers"
RERUN_LINE = "*How to rerun this chapter, alone or with the book's own numbers: {doc}`../rerun`.*"
GLUE_TEXT = re.compile(r"\{glue:text\}`([\w:.-]+?)(?::[^`]*)?`")
ROLE = re.compile(r"\{[\w:-]+\}`([^`]*)`")

__all__ = ["chapters", "sync_notebook", "note_text", "numbers_cells", "record_times"]


def chapters() -> list[Path]:
    """The chapter notebooks, in file order."""
    return sorted(p for p in NOTEBOOKS.glob("*.ipynb") if p.stem[0].isalnum() and p.stem != "index")


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _tags(cell: dict) -> list[str]:
    return cell.setdefault("metadata", {}).setdefault("tags", [])


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "not measured yet"
    return f"about {max(1, round(seconds / 60))} min" if seconds >= 90 else f"about {round(seconds)} s"


def note_text(stem: str, times: dict) -> str:
    """The JupyterLab reader's note at the top of chapter `stem`."""
    from tools.reading_copy import copy_name

    t = times.get(stem, {})
    where = {p: t.get(p, {}).get("cpu") for p in ("quick", "paper")}
    cost = (f"Run All takes {_duration(t.get('quick', {}).get('seconds'))} with `quick` once its runs are cached "
            f"(a fresh checkout computes them first, as `make test` does) and "
            f"{_duration(t.get('paper', {}).get('seconds'))} with `paper`"
            + (f" (measured on {where['paper'] or where['quick']})" if where['paper'] or where['quick'] else "") + ".")
    return ("**You are reading the notebook itself, not the book's page.** Its stored outputs come from the small "
            "`quick` test profile (one seed, five rounds, γ = 0.9): every code path at a small size, not the book's "
            "results.\n\n"
            "**For the book's numbers**, change the parameters cell below to `profile = \"paper\"` and Run All: "
            "the chapter then reads the committed results in `data/results/` and computes nothing. " + cost + "\n\n"
            f"The chapter as the book prints it (numbers, citations and links in place): "
            f"[as-in-the-book/{copy_name(stem)}](<as-in-the-book/{copy_name(stem)}>).")


def _plain(text: str) -> str:
    """Prose as a JupyterLab reader can quote it: glued numbers as "…", other roles as their text."""
    text = GLUE_TEXT.sub("…", text)
    return re.sub(r"\*\*|(?<!\w)[*_](?!\s)|(?<!\s)[*_](?!\w)", "", ROLE.sub(lambda m: m.group(1), text))


def _words_before(text: str, start: int, count: int = 7) -> str:
    """The last `count` words of the paragraph before position `start`."""
    words = _plain(text[:start].split("\n\n")[-1]).split()
    return " ".join(words[-count:]).rstrip(" (:") or "it"


def numbers_cells(cells: list[dict]) -> list[tuple[int, dict]]:
    """(insert after this cell index, the numbers cell) for every markdown cell that quotes glued
    numbers: placed after the last code cell that names any of them (or the markdown cell itself
    when they are all computed above it)."""
    out = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown" or NOTE_TAG in _tags(cell):
            continue
        text = _source(cell)
        items = [(_words_before(text, m.start()), m.group(1)) for m in GLUE_TEXT.finditer(text)]
        if not items:
            continue
        keys = {k for _, k in items}

        def names(j: int, k: str) -> bool:
            c = cells[j]
            return c["cell_type"] == "code" and (f'"{k}"' in _source(c) or f"'{k}'" in _source(c))

        sites = [max((j for j in range(len(cells)) if names(j, k)), default=None) for k in keys]
        after = max([i, *sites]) if None not in sites else len(cells) - 1  # a key glued under a computed name: the end
        paragraph = next((p for p in text.split("\n\n") if GLUE_TEXT.search(p)), text)
        lead = " ".join(_plain(paragraph).split()[:8])
        heading = "" if after == i else ",\n       heading=" + json.dumps(f"The paragraph that begins “{lead}…”",
                                                                       ensure_ascii=False)
        body = ",\n       ".join(f"({json.dumps(w, ensure_ascii=False)}, {json.dumps(k)})" for w, k in items)
        source = ("# The numbers the prose above quotes (the book prints them in the prose; JupyterLab shows keys).\n"
                  f"from fedsteer_lib.book.notebook_glue import glued\n\nglued({body}{heading})")
        out.append((after, {"cell_type": "code", "execution_count": None, "id": f"numbers-{i}",
                            "metadata": {"tags": ["remove-cell", NUMBERS_TAG]}, "outputs": [], "source": source}))
    return out


def sync_notebook(nb: dict, stem: str, times: dict) -> dict:
    """`nb` with its reader cells in step (see the module docstring); the other cells untouched."""
    cells = [c for c in nb["cells"] if "injected-parameters" not in _tags(c) and NOTE_TAG not in _tags(c)
             and NUMBERS_TAG not in _tags(c)]
    for c in cells:
        if "parameters" in _tags(c):
            c["metadata"]["tags"] = [t for t in _tags(c) if t not in ("hide-cell", "remove-cell")] + ["remove-cell"]
    title = cells[0] = dict(cells[0])
    lines = _source(title).split("\n")
    if RERUN_LINE not in lines:
        title["source"] = "\n".join([lines[0], "", RERUN_LINE, *lines[1:]])
    for after, cell in sorted(numbers_cells(cells), key=lambda x: -x[0]):
        old = {c.get("id"): c for c in nb["cells"]}.get(cell["id"])
        if old is not None and _source(old) == cell["source"]:
            cell = old  # keep its outputs
        cells.insert(after + 1, cell)
    note = {"cell_type": "markdown", "id": "jupyterlab-note", "metadata": {"tags": ["remove-cell", NOTE_TAG]},
            "source": note_text(stem, times)}
    cells.insert(1, note)
    return {**nb, "cells": cells}


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf8"))


def _write(path: Path, nb: dict) -> None:
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf8")


def _times() -> dict:
    return json.loads(TIMES.read_text()) if TIMES.is_file() else {}


def sync(check: bool = False) -> int:
    times, stale = _times(), []
    for path in chapters():
        nb = _read(path)
        synced = sync_notebook(nb, path.stem, times)
        if synced != nb:
            stale.append(path.name)
            if not check:
                _write(path, synced)
    if check and stale:
        print(f"not in step with their prose: {', '.join(stale)} (run: python -m tools.notebooks sync)",
              file=sys.stderr)
        return 1
    return 0


def record_times(profile: str, executed: list[Path]) -> None:
    """Write each executed chapter's papermill duration for `profile` into `data/chapter_times.json`."""
    from fedsteer_lib.numerics import cpu_model

    times = _times()
    for path in executed:
        seconds = _read(path).get("metadata", {}).get("papermill", {}).get("duration")
        # papermill's duration covers the kernel's start too: what a reader's Run All costs
        if seconds is None:
            continue
        stem = path.stem.lstrip(".")
        times.setdefault(stem, {})[profile] = {"seconds": round(float(seconds), 1), "cpu": cpu_model(),
                                                "date": _dt.date.today().isoformat()}
    TIMES.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")


PARAMETER_LINE = re.compile(r"^(profile|seeds) = .*$", re.M)


def with_parameters(nb: dict, profile: str, seeds: list[int] | None) -> dict:
    """`nb` with its parameters cell edited to `profile` (and `seeds`), as a reader would edit it."""
    values = {"profile": json.dumps(profile), "seeds": "None" if seeds is None else repr(list(seeds))}
    cells = []
    for cell in nb["cells"]:
        if "parameters" in _tags(cell):
            cell = {**cell, "source": PARAMETER_LINE.sub(lambda m: f"{m.group(1)} = {values[m.group(1)]}", _source(cell))}
        cells.append(cell)
    return {**nb, "cells": cells}


def _execute_one(args: tuple[Path, Path, str, list[int] | None]) -> tuple[str, float, str | None]:
    import time

    import papermill

    path, out_dir, profile, seeds = args
    edited = out_dir / f".{path.name}"
    nb = with_parameters(_read(path), profile, seeds)
    nb.setdefault("metadata", {})["fedsteer"] = {  # how this copy was executed (tests/test_paper_chapters.py)
        "profile": profile, "seeds": seeds, "parameters": "edited",
        "no_compute": os.environ.get("FEDSTEER_NO_COMPUTE") == "1"}
    _write(edited, nb)
    start = time.monotonic()
    try:
        papermill.execute_notebook(str(edited), str(edited), cwd=str(NOTEBOOKS), kernel_name="python3",
                                   progress_bar=False, log_output=False)
    except Exception as err:  # papermill's PapermillExecutionError names the cell; keep the executed copy
        return path.name, time.monotonic() - start, str(err).strip().splitlines()[-1] if str(err).strip() else repr(err)
    edited.replace(out_dir / path.name)
    return path.name, time.monotonic() - start, None


def execute(out_dir: Path, profile: str, seeds: list[int] | None, jobs: int, paths: list[Path],
            record: bool = False) -> int:
    """Execute the chapters into `out_dir` (see the module docstring); 1 when one failed. With
    `record`, each chapter's time goes into `data/chapter_times.json` (the JupyterLab notes quote it)."""
    from concurrent.futures import ProcessPoolExecutor

    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [(p, out_dir, profile, seeds) for p in (paths or chapters())]
    failed = []
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        for name, seconds, error in pool.map(_execute_one, todo):
            print(f"{name}: {'failed: ' + error if error else 'done'} ({seconds:.0f} s)", flush=True)
            if error:
                failed.append(name)
            elif record and seeds is None:
                record_times(profile, [out_dir / name])
    if failed:
        print(f"{len(failed)} chapter(s) failed: {', '.join(failed)} (their executed copies are in {out_dir}, "
              "named with a leading dot)", file=sys.stderr)
    return 1 if failed else 0


def refresh(paths: list[Path]) -> None:
    import papermill

    for path in paths or chapters():
        print(f"executing {path.name} (quick)", flush=True)
        papermill.execute_notebook(str(path), str(path), cwd=str(NOTEBOOKS), kernel_name="python3",
                                   progress_bar=False, log_output=False)
        record_times("quick", [path])
    sync()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.notebooks", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sync").add_argument("--check", action="store_true")
    sub.add_parser("refresh").add_argument("notebooks", nargs="*", type=Path)
    t = sub.add_parser("times")
    t.add_argument("profile")
    t.add_argument("executed", nargs="+", type=Path)
    e = sub.add_parser("execute")
    e.add_argument("out_dir", type=Path)
    e.add_argument("notebooks", nargs="*", type=Path)
    e.add_argument("--profile", default="paper")
    e.add_argument("--seeds", default="", help="comma-separated seeds (default: the profile's)")
    e.add_argument("--jobs", type=int, default=1)
    e.add_argument("--record-times", action="store_true", help="write each chapter's time to data/chapter_times.json")
    args = parser.parse_args(argv)
    if args.command == "execute":
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
        return execute(args.out_dir, args.profile, seeds, args.jobs, args.notebooks, args.record_times)
    if args.command == "sync":
        return sync(args.check)
    if args.command == "refresh":
        refresh(args.notebooks)
        return 0
    record_times(args.profile, args.executed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
