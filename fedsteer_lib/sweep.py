"""Grids of runs, computed only where the results cache lacks them, resumable after any crash.

Each finished run is written atomically as soon as it ends, so a sweep killed at any moment
(even with SIGKILL) and restarted loses no finished run and yields the same table.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path
from typing import Iterable, Sequence

import torch
from tqdm.auto import tqdm

from .config import DATASET_DEFAULTS, PROFILES, TUNED, Diagnostics, FLSystem, MethodSpec, RunConfig, method, paper_methods
from .engine import SimData, prepare, run
from .results import has_run, save_run

__all__ = ["grid", "run_grid", "paper_grid", "ablation_grid", "missing"]


def grid(dataset: str, methods: Sequence[MethodSpec], gammas: Iterable[float], seeds: Iterable[int], *,
         rounds: int | None = None, device: str = "cpu", system: FLSystem | None = None,
         diagnostics: Diagnostics | None = None) -> list[RunConfig]:
    """The cross product methods x gammas x seeds, with the frozen (tuned) training settings."""
    training = TUNED[dataset]
    if rounds is not None:
        training = training.__class__(**{**training.__dict__, "rounds": rounds})
    base_system = system or FLSystem()
    configs = []
    for gamma in gammas:
        sys_g = base_system.__class__(**{**base_system.__dict__, "gamma": gamma})
        for seed in seeds:
            for m in methods:
                configs.append(RunConfig(dataset=dataset, method=m, system=sys_g, training=training, seed=seed,
                                         diagnostics=diagnostics or Diagnostics(), device=device,
                                         emnist_split=DATASET_DEFAULTS[dataset].get("split", "balanced")).validate())
    return configs


def paper_grid(dataset: str = "fmnist", profile: str = "paper", device: str = "cpu") -> list[RunConfig]:
    """Table 1 / Fig. 4: every method of the paper, both gammas, all seeds of the profile."""
    p = PROFILES[profile]
    return grid(dataset, paper_methods(dataset), p["gammas"], p["seeds"], rounds=p["rounds"], device=device)


def ablation_grid(dataset: str = "fmnist", profile: str = "paper", device: str = "cpu") -> dict[str, list[RunConfig]]:
    """The ablations of the book's chapter 7, by name."""
    p = PROFILES[profile]
    dd = DATASET_DEFAULTS[dataset]
    k, lam = dd["core_size"], dd["lam"]
    seeds = p["seeds"]
    few = seeds[: max(1, len(seeds) // 4)]  # Fig. 5's grid uses fewer seeds (stated in the book)
    sizes = (10, 20, 40, 80) if profile == "paper" else (5, 20)
    kw = dict(rounds=p["rounds"], device=device)
    return {
        "coreset_lambda": grid(dataset, [method("fedsteer", core_size=s, lam=l, refresh_every=5) for s in sizes for l in (0.0, 0.5)],
                               p["gammas"], few, **kw),
        "subsampled": grid(dataset, [method("fedsteer", core_size=k, lam=lam, subsample=20)], p["gammas"], seeds, **kw),
        "random_core": grid(dataset, [method("fedsteer", core_size=k, lam=lam, selection="random")], p["gammas"], seeds, **kw),
        "ordering": grid(dataset, [method("fedsteer", core_size=k, lam=lam, ordering="as_written")], p["gammas"], seeds, **kw),
        "fair_start": grid(dataset, [method("fedvarp", warmup_cycles=5), method("mifa", warmup_cycles=5)], p["gammas"], seeds, **kw),
    }


def missing(configs: Iterable[RunConfig], root: str | os.PathLike | None = None) -> list[RunConfig]:
    return [c for c in configs if not has_run(c, root)]


def _run_and_save(args: tuple[RunConfig, str | None, int]) -> str:
    config, root, threads = args
    torch.set_num_threads(threads)
    global _SIM
    if _SIM is None or not _same_data(_SIM.config, config):
        _SIM = prepare(config)
    result = run(config, progress=False, sim=_SIM)
    save_run(result, config, root)
    return config.key()


_SIM: SimData | None = None


def _same_data(a: RunConfig, b: RunConfig) -> bool:
    return (a.dataset, a.system, a.seed, a.emnist_split, a.device) == (b.dataset, b.system, b.seed, b.emnist_split, b.device)


def run_grid(configs: Sequence[RunConfig], root: str | os.PathLike | None = None, *, workers: int = 1,
             progress: bool = True, desc: str = "runs") -> int:
    """Compute every config whose result is missing; returns how many were computed.

    workers > 1 runs that many processes, each with its share of the CPU threads.
    Runs are ordered so that consecutive runs share data (same dataset, gamma and seed).
    """
    todo = sorted(missing(configs, root), key=lambda c: (c.dataset, c.system.gamma, c.seed))
    if not todo:
        return 0
    root_s = None if root is None else str(root)
    bar = tqdm(total=len(todo), desc=desc, disable=not progress)
    if workers <= 1:
        for c in todo:
            bar.set_postfix_str(f"{c.method.label} gamma={c.system.gamma} seed={c.seed}")
            _run_and_save((c, root_s, torch.get_num_threads()))
            bar.update()
    else:
        threads = max(1, (os.cpu_count() or 1) // workers)
        ctx = mp.get_context("spawn")
        with ctx.Pool(workers, maxtasksperchild=None) as pool:
            for _ in pool.imap_unordered(_run_and_save, [(c, root_s, threads) for c in todo]):
                bar.update()
    bar.close()
    return len(todo)
