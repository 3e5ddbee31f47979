"""The book's helpers live in fedsteer_lib/book/ and are imported in one direction: nothing outside
the package imports it, figure modules import the table modules but never the reverse, every
module stays small, and no two public functions share a name."""
from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "fedsteer_lib"
BOOK = LIB / "book"


def _imports(path: Path) -> set[str]:
    """The fedsteer_lib modules a file imports, as dotted names relative to fedsteer_lib."""
    package = path.relative_to(LIB).parent.parts
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            mod = node.module.split(".") if node.module else []
            if not node.level:
                if mod[:1] != ["fedsteer_lib"]:
                    continue
                mod = mod[1:]
            name = ".".join(base + mod)
            out.add(name)
            out.update(f"{name}.{a.name}".strip(".") for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix("fedsteer_lib.") for a in node.names if a.name.startswith("fedsteer_lib"))
    return out


def test_only_the_notebooks_import_the_book_helpers():
    for path in LIB.glob("*.py"):
        assert not any(m == "book" or m.startswith("book.") for m in _imports(path)), path.name


def test_table_modules_never_import_figures():
    for path in BOOK.glob("*.py"):
        assert not any(m.startswith("book.figures") for m in _imports(path)), path.name


def test_modules_are_small_and_public_names_unique():
    seen: dict[str, str] = {}
    for path in sorted(BOOK.rglob("*.py")):
        assert len(path.read_text().splitlines()) <= 400, path
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                where = str(path.relative_to(BOOK))
                assert node.name not in seen, f"{node.name} in {seen.get(node.name)} and {where}"
                seen[node.name] = where


def test_a_chapter_is_executed_with_its_parameters_cell_edited_not_injected():
    import json
    import sys

    sys.path.insert(0, str(LIB.parent))
    from tools.notebooks import with_parameters

    cells = [{"cell_type": "code", "metadata": {"tags": ["parameters", "remove-cell"]},
              "source": 'profile = "quick"\ndataset = "fmnist"\nseeds = None'},
             {"cell_type": "code", "metadata": {}, "source": 'profile = "quick"  # not the parameters cell'}]
    edited = with_parameters({"cells": cells}, "paper", [0, 1])
    assert edited["cells"][0]["source"] == 'profile = "paper"\ndataset = "fmnist"\nseeds = [0, 1]'
    assert edited["cells"][1] == cells[1] and len(edited["cells"]) == 2  # no injected cell
    makefile = (LIB.parent / "Makefile").read_text()
    assert "-m tools.notebooks execute book/chapters" in makefile and "papermill -p" not in makefile
