"""Which runs each chapter loads, and which of the paper profile's runs are cached.

`main_configs` / `ablation_configs` only *build* the run configurations of a `Book` (Table 1's
grid of chapters 6 and 9, the ablation groups of chapters 7 and 9, on the book's seeds);
`tuning_evidence` and `remaining_runs` look into a results cache (which runs exist) without
computing anything (chapter 10). The run groups themselves are defined in `fedsteer_lib.experiments.groups`.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterable, Sequence

import pandas as pd

from ..experiments.config import RunConfig, get_profile, paper_methods
from ..experiments.groups import FEW_SEED_GROUPS, GROUP_SETS, ablation_grid
from ..experiments.sweep import grid, missing
from .methods import role
from .paper import DATASET_NAMES

__all__ = ["SWEEP_COMMAND", "main_configs", "ablation_configs", "tuning_evidence", "remaining_runs"]

SWEEP_COMMAND = "python -m fedsteer_lib sweep --profile paper --dataset {dataset} --device cuda"


def main_configs(book, roles: Iterable[str] | None = None) -> list[RunConfig]:
    """The paper grid (Table 1) of a `Book`'s data set, profile and seeds, optionally only the
    runs of some `ROLES` (all FedStale βs for "fedstale")."""
    methods = paper_methods(book.dataset)
    if roles is not None:
        keep = set(roles)
        methods = [m for m in methods if role(m, book.dataset) in keep]
    return grid(book.dataset, methods, book.profile, device=book.device)


def ablation_configs(book) -> dict[str, list[RunConfig]]:
    """`groups.ablation_grid` for a `Book`: the profile's grids with the book's seeds (the
    Fig. 5 grid keeps only the first `ablation_seeds` of them)."""
    groups = ablation_grid(book.dataset, book.profile.name, book.device)
    if tuple(get_profile(book.profile.name).seeds) == tuple(book.seeds):
        return groups
    out = {}
    for name, configs in groups.items():
        seeds = book.seeds[: book.profile.ablation_seeds] if name in FEW_SEED_GROUPS else book.seeds
        first = min(c.seed for c in configs)
        protos = [c for c in configs if c.seed == first]
        out[name] = [replace(c, seed=s) for s in seeds for c in protos]
    return out


def tuning_evidence(dataset: str = "fmnist", root=None) -> tuple[pd.DataFrame | None, str]:
    """The FedAvg-only tuning runs found under `root` (the paper profile's cache), and a
    Markdown sentence: what `tuning.select` picks and whether `config.TUNED` holds it, or that
    the runs are (partly) not computed yet. Never raises for missing runs."""
    from ..experiments.config import TUNED
    from ..experiments.results import has_run
    from ..experiments.tuning import GRID, select, tuning_configs, tuning_table

    configs = tuning_configs(dataset)
    present = [c for c in configs if has_run(c, root)]
    if not present:
        return None, (f"The tuning runs are **not computed yet** (0 of {len(configs)} in the results cache); "
                      f"`python -m fedsteer_lib tune --dataset {dataset}` computes them.")
    table = tuning_table(present, root)
    if len(present) < len(configs):
        return table, (f"The tuning runs are **not complete yet**: {len(present)} of {len(configs)} are in the results "
                       "cache; the selection is made when all are there.")
    pick = select(table)
    frozen = TUNED[dataset]
    agrees = (math.isclose(pick["client_lr"], frozen.client_lr) and pick["local_epochs"] == frozen.local_epochs)
    text = (f"`tuning.select` picks client lr {pick['client_lr']:g} and E = {pick['local_epochs']} "
            f"(mean validation accuracy over the last rounds {pick['val_accuracy_last10']:.3f}); `config.TUNED` holds "
            f"client lr {frozen.client_lr:g} and E = {frozen.local_epochs}: "
            + ("**they agree**." if agrees else "**they differ: config.TUNED is not the tuned choice**."))
    edges = [name for name, key in (("client lr", "client_lr"), ("E", "local_epochs"))
             if pick[key] in (min(GRID[key]), max(GRID[key]))]
    if edges:
        text += (f" The chosen {' and '.join(edges)} {'lies' if len(edges) == 1 else 'lie'} at the edge of the "
                 "tuning grid, so a better value may lie outside it.")
    collapsed = table[table["collapsed"]]
    if not collapsed.empty:
        text += " Collapsed grid points: " + "; ".join(
            f"lr {r.client_lr:g}, E={r.local_epochs}, γ={r.gamma:g}" for r in collapsed.itertuples()) + "."
    return table, text


def remaining_runs(root=None, datasets: Sequence[str] = ("fmnist", "emnist", "cifar10")) -> pd.DataFrame:
    """For the paper profile: per data set and run group (`experiments.groups.GROUP_SETS`, the
    same groups `status` and `sweep` iterate), how many runs are in the results cache under
    `root`, how many are missing, and the command that computes them."""
    rows = []
    for ds in datasets:
        for what, build in GROUP_SETS.items():
            for name, configs in build(ds, "paper", "cpu").items():
                todo = len(missing(configs, root))
                cmd = (f"python -m fedsteer_lib tune --dataset {ds}" if what == "tuning" else
                       f"python -m fedsteer_lib sweep --profile paper --dataset {ds} --what {what}"
                       + (" --device cuda" if ds != "fmnist" else ""))
                rows.append({"data set": DATASET_NAMES[ds], "group": name, "runs": len(configs),
                             "cached": len(configs) - todo, "missing": todo, "command": cmd if todo else ""})
    return pd.DataFrame(rows)
