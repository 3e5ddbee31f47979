"""What the Makefile does to a chapter after papermill executed it: papermill writes the profile it
was given into an extra "injected-parameters" cell under the notebook's own parameters cell, so
the page would show the parameters twice. That cell is tagged `remove-cell` (Jupyter Book leaves
it out; the notebook file keeps it, so the executed copy still says how it was run).

    python -m tools.executed_notebooks CHAPTER.ipynb [...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["hide_injected_parameters"]


def hide_injected_parameters(path: str | Path) -> int:
    """Tag papermill's injected-parameters cells of the notebook at `path` `remove-cell`
    (in place); returns how many cells were tagged."""
    path = Path(path)
    nb = json.loads(path.read_text())
    tagged = 0
    for cell in nb["cells"]:
        tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
            tagged += 1
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return tagged


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        hide_injected_parameters(arg)
