"""The library's import graph (issue 56): no cycle, not even through a function-level import;
no module imports another module's private name; no module over 400 lines; importing the
library changes nothing in the process."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedsteer_lib"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str]]:
    """(module, imported name) of every import in the file, at any depth, relative ones resolved;
    `from package import module` counts as importing that module."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out += [(f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
    return out


def test_no_import_cycle_and_no_private_name_across_modules():
    modules = _modules()
    edges = {name: set() for name in modules}
    private = []
    for name, path in modules.items():
        for module, imported in _imports(name, path, modules):
            if module in modules and module != name:
                edges[name].add(module)
            if module.startswith("fedsteer_lib") and module != name and imported.startswith("_"):
                private.append(f"{name} imports {module}.{imported}")

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in edges[node]:
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [c for c in (cycle_from(m) for m in sorted(modules)) if c]
    assert not cycles, "import cycles (function-level imports included): " + "; ".join(" -> ".join(c) for c in cycles)
    assert not private, private


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf8").splitlines())) > 400}
    assert not long, long


def test_the_book_helpers_hold_at_most_2000_lines():
    """fedsteer_lib/book/ holds only what several chapters share (tooling lives in tools/)."""
    lines = sum(len(p.read_text(encoding="utf8").splitlines()) for p in (PACKAGE / "book").rglob("*.py"))
    assert lines <= 2000, f"fedsteer_lib/book/ has {lines} lines"


def test_importing_the_library_changes_nothing_in_the_process():
    code = """
import os, sys, torch
import flwr.serverapp  # a Flower user's own import (Flower sets GRPC_VERBOSITY itself)
before = (dict(os.environ), torch.get_num_threads(), torch.backends.mkldnn.enabled, torch._C._get_nnpack_enabled())
import fedsteer_lib, fedsteer_lib.flower, fedsteer_lib.book, fedsteer_lib.experiments.cli
from fedsteer_lib import numerics
after = (dict(os.environ), torch.get_num_threads(), torch.backends.mkldnn.enabled, torch._C._get_nnpack_enabled())
assert before == after, [k for k in set(before[0]) | set(after[0]) if before[0].get(k) != after[0].get(k)] or (before[1:], after[1:])
assert numerics.selected() is None and os.environ.get("MKL_CBWR") is None
print("unchanged", torch.backends.cpu.get_cpu_capability())
"""
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("FEDSTEER_KERNELS", "MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "unchanged" in proc.stdout, proc.stderr
