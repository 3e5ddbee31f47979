"""What every chapter page keeps (issues 17, 55, 57): its parameters cell out of the book (the
JupyterLab reader edits it), every figure drawn in view by a hide-input cell that displays it
exactly once, with myst-nb's caption, name and alt text in the cell's metadata (no {glue:figure}
directive, which JupyterLab shows as code), and every citation a key of book/references.bib."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) + sorted((ROOT / "notebooks").glob("[A-Z]_*.ipynb"))


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _images(cell: dict) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def test_every_chapter_is_checked():
    assert [p.name[:2] for p in CHAPTERS] == ["01", "02", "03", "04", "05", "06", "07", "08", "09", "A_"]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name[:2])
def test_parameters_out_of_the_book_and_figures_in_view_with_captions(path):
    cells = _cells(path)
    params = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1 and "remove-cell" in params[0]["metadata"]["tags"]
    markdown = "\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")
    assert "{glue:figure}" not in markdown, "a figure is displayed by its cell, not glued"
    figures = [c for c in cells if c["cell_type"] == "code" and "figure" in c["metadata"].get("mystnb", {})]
    assert figures, "every chapter shows at least one figure"
    for cell in figures:
        meta = cell["metadata"]["mystnb"]
        name = meta["figure"].get("name", "")
        assert name.startswith("fig-") and len(meta["figure"].get("caption", "")) > 40, name
        alt = meta.get("image", {}).get("alt", "")
        assert len(alt) > 40 and ".png" not in alt, f"{name}: alt text must describe the figure"
        assert "hide-input" in cell["metadata"].get("tags", []), f"{name}: its code is one click away"
        assert _images(cell) == 1, f"{name}: the stored outputs show the figure {_images(cell)} times, not once"
    uncaptioned = [i for i, c in enumerate(cells) if _images(c) and c not in figures]
    assert not uncaptioned, f"cells {uncaptioned} show a figure without a caption"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name[:2])
def test_citations_are_keys_of_the_bibliography(path):
    keys = set(re.findall(r"^@\w+\{([^,]+),", (ROOT / "book" / "references.bib").read_text(), flags=re.M))
    markdown = "\n".join(_source(c) for c in _cells(path) if c["cell_type"] == "markdown")
    cited = {k.strip() for group in re.findall(r"\{cite(?::[pt])?\}`([^`]+)`", markdown) for k in group.split(",")}
    assert cited <= keys, cited - keys


