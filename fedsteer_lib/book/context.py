"""What the notebooks share: the profile, where its results live, and computing missing runs.

Every notebook starts from its own parameters cell (papermill) and calls `setup(...)`; there
is no state shared between notebooks other than the results cache on disk. Every chapter uses
it (`Book.runs` for the result tables of chapters 6, 7, 9, 10; `Book.curves` for Fig. 4, 6, 7;
`Book.ensure` for the diagnostics runs of chapters 2, 5, 8).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import matplotlib
import pandas as pd
import seaborn as sns

from .. import numerics
from ..experiments.cli_checks import device_problem, kernels_problem
from ..experiments.config import DATASET_DEFAULTS, PROFILES, ConfigError, Profile, RunConfig, get_profile
from ..experiments.groups import IN_PROGRESS
from ..experiments.results import history_table, results_root, runs_table
from ..experiments.seeds import check_seeds
from ..experiments.sweep import missing, run_grid

REPO_ROOT = Path(__file__).resolve().parents[2]
# Set to 1, a chapter that would compute a missing run or measurement fails instead (the test that
# a chapter executed with the paper profile reads committed results only).
NO_COMPUTE_ENV = "FEDSTEER_NO_COMPUTE"


class ComputeForbidden(RuntimeError):
    """A chapter was asked to compute while FEDSTEER_NO_COMPUTE=1."""

__all__ = ["REPO_ROOT", "NO_COMPUTE_ENV", "ComputeForbidden", "Book", "setup", "results_root"]


@dataclass
class Book:
    """A notebook's context: its profile, dataset, seeds, device and results cache."""

    profile: Profile
    dataset: str
    seeds: tuple[int, ...]
    device: str
    workers: int
    root: Path

    def ensure(self, configs: Sequence[RunConfig], desc: str = "runs") -> list[RunConfig]:
        """Compute the runs whose results are missing (with a progress bar); return the configs."""
        todo = missing(configs, self.root)
        if todo:
            where = self.root.relative_to(REPO_ROOT) if self.root.is_relative_to(REPO_ROOT) else self.root
            if os.environ.get(NO_COMPUTE_ENV) == "1":
                raise ComputeForbidden(f"{len(todo)} of {len(configs)} runs of {desc} are not in {where}, and "
                                       f"{NO_COMPUTE_ENV}=1 forbids computing them")
            print(f"{len(configs) - len(todo)} of {len(configs)} runs cached in {where}; computing {len(todo)}",
                  file=sys.stderr)
        run_grid(configs, self.root, workers=self.workers, desc=desc)
        return list(configs)

    def runs(self, configs: Sequence[RunConfig], desc: str = "runs") -> pd.DataFrame:
        """One row per run (computing the missing ones first), with one column per method parameter."""
        return runs_table(self.ensure(configs, desc), self.root)

    def available(self, configs: Sequence[RunConfig], group: str, desc: str = "runs") -> tuple[list[RunConfig], int]:
        """(the configs whose runs can be shown, how many cannot). For a group of the committed
        paper-profile results that is still being computed (`experiments.groups.IN_PROGRESS`):
        the cached runs and the count of the missing ones, which the chapter states; a book
        build never starts those hours of computing (`python -m fedsteer_lib sweep --what ...`
        does). Any other group, or any other profile, computes what is missing first."""
        configs = list(configs)
        if group in IN_PROGRESS and self.profile.name == "paper":
            lacking = {c.key() for c in missing(configs, self.root)}
            return [c for c in configs if c.key() not in lacking], len(lacking)
        return self.ensure(configs, desc), 0

    def curves(self, configs: Sequence[RunConfig]) -> pd.DataFrame:
        """One row per (run, round) (the runs must exist)."""
        return history_table(configs, self.root)


def _data_problem(dataset: str) -> str | None:
    """Why `dataset` cannot be read on this machine (its files are in none of the searched
    folders and downloading is not allowed), or None: a notebook learns it at `setup`, not at its
    first compute."""
    from ..simulator.data import find_dataset, search_dirs

    split = DATASET_DEFAULTS[dataset].get("split", "balanced")
    if os.environ.get("FEDSTEER_ALLOW_DOWNLOAD") == "1" or find_dataset(dataset, split) is not None:
        return None
    return (f"dataset {dataset!r}: its files are not on this machine (looked in "
            f"{', '.join(map(str, search_dirs(dataset)))}); `python -m fedsteer_lib doctor` says how to get them")


def setup(profile: str = "quick", dataset: str = "fmnist", seeds: Sequence[int] | None = None,
          device: str = "cpu", workers: int = 1) -> Book:
    """Validate a notebook's parameters, set the plotting style and return its context. Every
    parameter is checked here, before anything computes: a bad one is a ConfigError whose one
    line is what the failing cell shows (`ConfigError._render_traceback_`), the data set's files
    must be on this machine (or FEDSTEER_ALLOW_DOWNLOAD=1), the device must be one torch has
    here, and $FEDSTEER_KERNELS, when set, a kernel mode."""
    if not isinstance(profile, str) or profile not in PROFILES:
        raise ConfigError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
    prof = get_profile(profile)
    if not isinstance(dataset, str) or dataset not in DATASET_DEFAULTS:
        raise ConfigError(f"dataset must be one of {sorted(DATASET_DEFAULTS)}, got {dataset!r}")
    if not (isinstance(workers, int) and not isinstance(workers, bool) and workers >= 1):
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    problem = device_problem(device, option="device") or kernels_problem(None) or _data_problem(dataset)
    if problem:
        raise ConfigError(problem)
    seeds = prof.seeds if seeds is None else check_seeds(seeds)
    if prof.seeds != seeds:
        prof = replace(prof, seeds=seeds)
    if numerics.selected() is None:  # the notebook's process: its profile's kernels, before torch computes
        numerics.select_kernels(os.environ.get(numerics.ENV_VAR) or prof.kernels)
    matplotlib.rcParams.update({"figure.dpi": 110, "savefig.dpi": 110, "figure.figsize": (7.0, 4.0)})
    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    return Book(prof, dataset, seeds, device, workers, results_root(prof))
