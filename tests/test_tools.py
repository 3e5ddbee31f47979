"""The build and rerun tooling lives in tools/, beside the Makefile that calls it, not in the
library: fedsteer_lib/book/ holds only what the chapters share (issue 56). Nothing in fedsteer_lib
imports tools; the tools import one another without a cycle, function-level imports included;
no module imports another's private name; every module stays small."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
MOVED = ("lab", "provenance", "precision_report")


def _imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from X import name` and (module, "") of every `import X` in the
    file, at any depth (function-level imports too), with relative imports made absolute."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out += [(module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
    return out


def test_the_tooling_left_the_library():
    assert sorted(p.stem for p in TOOLS.glob("*.py") if p.stem in MOVED) == sorted(MOVED)
    assert not [m for m in MOVED if (ROOT / "fedsteer_lib" / "book" / f"{m}.py").exists()]
    for path in (ROOT / "fedsteer_lib").rglob("*.py"):
        assert not [m for m, _ in _imports(path) if m == "tools" or m.startswith("tools.")], path


def test_tools_have_no_import_cycle_and_import_no_private_name():
    modules = {p.stem: p for p in TOOLS.glob("*.py") if p.stem != "__init__"}
    assert set(MOVED) <= set(modules), f"tools/ lacks {sorted(set(MOVED) - set(modules))}"
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges[name] = set()
        for module, imported in _imports(path):
            target = module.removeprefix("tools.") if module.startswith("tools.") else imported if module == "tools" else None
            if target in modules:
                edges[name].add(target)
            if module.startswith(("tools", "fedsteer_lib")):
                assert not imported.startswith("_"), f"tools/{name}.py imports {module}.{imported}"

    def reach(start: str, node: str, seen: set[str]) -> bool:
        return any(n == start or (n not in seen and not seen.add(n) and reach(start, n, seen)) for n in edges[node])

    cycles = sorted(name for name in modules if reach(name, name, set()))
    assert not cycles, f"import cycles through {cycles}: {edges}"


def test_tools_are_small_and_called_by_the_makefile():
    for path in TOOLS.glob("*.py"):
        assert len(path.read_text(encoding="utf8").splitlines()) <= 400, path
    makefile = (ROOT / "Makefile").read_text(encoding="utf8")
    for module in ("notebooks", "generated", "lab"):
        assert re.search(rf"\$\(PY\) -m tools\.{module}\b", makefile), module
