"""The rerun page's generated files: `make book` writes them into `book/_generated/` (not
committed) from the committed results, and `book/rerun.md` includes the tables and links the CSVs:
the runtime and environment tables and `runs.csv` (`provenance`), what `verify` found
(`provenance`), the cost of the pinned kernels (`provenance`), bfloat16 against float32
(`precision_report`) and the claims ledger (`fedsteer_lib.book.ledger`).

    python -m tools.generated book/_generated
"""
from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path
from typing import Sequence

from fedsteer_lib.book import ledger
from fedsteer_lib.book.context import setup
from fedsteer_lib.experiments.groups import run_groups
from fedsteer_lib.experiments.results import results_root
from tools.precision_report import precision_markdown
from tools.provenance import (all_runs_table, cost_markdown, runtime_markdown, runtime_table, verify_breakdown,
                              verify_markdown, verify_table)

__all__ = ["write_generated"]


def _write_if_changed(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text(encoding="utf8") != text:
        path.write_text(text, encoding="utf8")


def write_generated(out_dir: str | os.PathLike, dataset: str = "fmnist", profile: str = "paper",
                    root: str | os.PathLike | None = None, claims: bool | None = None) -> dict[str, Path]:
    """Write `runtime.md` (`runtime_markdown` of every run group), `runs.csv` (`all_runs_table`),
    the verify, numerics-cost and precision tables and (for the profile's own cache, or when
    `claims`) the claims ledger into `out_dir` from the results under `root` (the profile's cache
    by default). Files are rewritten only when their content changes. Returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    root_given = root
    root = results_root(profile) if root is None else Path(root)
    groups = run_groups(dataset, profile, root=root)
    paths = {"runtime": out / "runtime.md", "runs": out / "runs.csv", "verify": out / "verify.md",
             "verify_groups": out / "verify_groups.md", "verify_methods": out / "verify_methods.md",
             "cost": out / "numerics_cost.md", "precision": out / "precision.md"}
    _write_if_changed(paths["runtime"], runtime_markdown(runtime_table(groups, root)))
    _write_if_changed(paths["runs"], all_runs_table(groups, root).to_csv(index=False))
    _write_if_changed(paths["verify"], verify_markdown(verify_table(root / "verify")))
    for by in ("group", "method"):
        _write_if_changed(paths[f"verify_{by}s"], verify_markdown(verify_breakdown(groups, root / "verify", by)))
    _write_if_changed(paths["cost"], cost_markdown(root / "bench" / "numerics_cost.json"))
    _write_if_changed(paths["precision"], precision_markdown(dataset, profile, root, root / "bench" / "precision.json"))
    if claims if claims is not None else root_given is None:  # the ledger of the profile's own cache
        paths["claims"] = ledger.write(ledger.build(setup(profile, dataset)), out)
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.generated", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder for the generated files (the Makefile: book/_generated)")
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--profile", default="paper")
    args = parser.parse_args(argv)
    with warnings.catch_warnings(record=True) as caught:  # stale results: counted below, not listed
        warnings.simplefilter("always")
        paths = write_generated(args.out_dir, args.dataset, args.profile)
    stale = {str(w.message) for w in caught}
    note = f" ({len(stale)} stored results not counted: see `python -m fedsteer_lib status`)" if stale else ""
    print(f"wrote {', '.join(str(p) for p in paths.values())}{note}")


if __name__ == "__main__":
    main()
