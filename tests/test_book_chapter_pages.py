"""What every chapter page keeps (issue 17): its parameters cell hidden, figures glued (never
shown by plt.show) and each glued figure shown by a {glue:figure} directive with alt text, and
every citation a key of book/references.bib."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_every_chapter_is_checked():
    assert len(CHAPTERS) == 10


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name[:2])
def test_parameters_hidden_and_figures_glued_with_alt_text(path):
    cells = _cells(path)
    params = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1 and "hide-cell" in params[0]["metadata"]["tags"]
    code = "\n".join(_source(c) for c in cells if c["cell_type"] == "code")
    markdown = "\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")
    assert "plt.show(" not in code, "figures are glued and shown with a caption, not plt.show()"
    glued = set(re.findall(r'glue\("([^"]+)", (?:fig|figures\.)', code))
    shown = dict(re.findall(r"```\{glue:figure\} (\S+)\n(:alt: .*)", markdown))
    assert glued and glued <= set(shown), f"glued figures without a {{glue:figure}}: {glued - set(shown)}"
    for name, alt in shown.items():
        assert len(alt) > 40 and ".png" not in alt, f"{name}: alt text must describe the figure"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name[:2])
def test_citations_are_keys_of_the_bibliography(path):
    keys = set(re.findall(r"^@\w+\{([^,]+),", (ROOT / "book" / "references.bib").read_text(), flags=re.M))
    markdown = "\n".join(_source(c) for c in _cells(path) if c["cell_type"] == "markdown")
    cited = {k.strip() for group in re.findall(r"\{cite(?::[pt])?\}`([^`]+)`", markdown) for k in group.split(",")}
    assert cited <= keys, cited - keys


