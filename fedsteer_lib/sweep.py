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
from tqdm import tqdm

from dataclasses import replace

from .config import (DATASET_DEFAULTS, REGIME_GAMMAS, REGIME_GRID, REGIME_SEEDS, TUNED, Diagnostics, FLSystem,
                     MethodSpec, Profile, RunConfig, framework_methods, get_profile, method, paper_methods,
                     regime_methods)
from .engine import SimData, prepare, run
from .results import has_run, save_run

__all__ = ["grid", "run_grid", "paper_grid", "ablation_grid", "framework_grid", "regime_grid", "missing",
           "complete_seeds", "results_root", "convergence_methods", "convergence_grid", "alignment_grid",
           "TRACKED_CLIENTS", "stability_grid"]

REPO_ROOT = Path(__file__).resolve().parent.parent


def results_root(profile: str | Profile) -> Path:
    """The results cache of a profile (`paper`: data/results, committed; `quick`: .cache/, not committed)."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    env = os.environ.get("FEDSTEER_RESULTS")
    return Path(env) if env and prof.name == "paper" else REPO_ROOT / prof.results_dir


def grid(dataset: str, methods: Sequence[MethodSpec], profile: str | Profile = "paper", *,
         gammas: Iterable[float] | None = None, seeds: Iterable[int] | None = None, device: str = "cpu",
         system: FLSystem | None = None, diagnostics: Diagnostics | None = None,
         **training_changes) -> list[RunConfig]:
    """methods x gammas x seeds with the frozen (tuned) training settings and the profile's
    rounds, evaluation schedule and warm-up length (gammas and seeds default to the profile's).
    `training_changes` (e.g. client_lr=0.03) override the frozen training settings."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    training = replace(TUNED[dataset], rounds=prof.rounds, eval_every=prof.eval_every, eval_last=prof.eval_last,
                       **training_changes)
    base_system = system or FLSystem()
    configs = []
    for gamma in (prof.gammas if gammas is None else gammas):
        for seed in (prof.seeds if seeds is None else seeds):
            for m in methods:
                if m.get("warmup_cycles"):
                    m = replace(m, params=tuple(sorted({**dict(m.params), "warmup_cycles": prof.warmup_cycles}.items())))
                configs.append(RunConfig(dataset=dataset, method=m, system=replace(base_system, gamma=gamma),
                                         training=training, seed=seed, diagnostics=diagnostics or Diagnostics(),
                                         device=device, emnist_split=DATASET_DEFAULTS[dataset].get("split", "balanced")).validate())
    return configs


def paper_grid(dataset: str = "fmnist", profile: str = "paper", device: str = "cpu") -> list[RunConfig]:
    """Table 1 / Fig. 4: every method of the paper, the profile's gammas and seeds."""
    return grid(dataset, paper_methods(dataset), profile, device=device)


FEW_SEED_GROUPS = ("coreset_lambda", "forced_refresh")  # ablations run on the profile's first `ablation_seeds`


def ablation_grid(dataset: str = "fmnist", profile: str | Profile = "paper", device: str = "cpu") -> dict[str, list[RunConfig]]:
    """The ablations of the book's chapter 7, by name."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    dd = DATASET_DEFAULTS[dataset]
    k, lam = dd["core_size"], dd["lam"]
    few = prof.seeds[: prof.ablation_seeds]  # FEW_SEED_GROUPS use fewer seeds (stated in the book)
    kw = dict(profile=prof, device=device)
    return {
        "coreset_lambda": grid(dataset, [method("fedsteer", core_size=s, lam=l, refresh_every=5)
                                         for s in prof.coreset_sizes for l in (0.0, 0.5)], seeds=few, **kw),
        "subsampled": grid(dataset, [method("fedsteer", core_size=k, lam=lam, subsample=20)], **kw),
        "random_core": grid(dataset, [method("fedsteer", core_size=k, lam=lam, selection="random")], **kw),
        "ordering": grid(dataset, [method("fedsteer", core_size=k, lam=lam, ordering="as_written")], **kw),
        "fair_start": grid(dataset, [method("fedvarp", warmup_cycles=5), method("mifa", warmup_cycles=5)], **kw),
        # The other reading of "enforce=5": every 5th round all clients refresh their coordinates.
        "forced_refresh": grid(dataset, [method("fedsteer", core_size=k, lam=lam, enforce_every=5)], seeds=few, **kw),
    }


def framework_grid(dataset: str = "fmnist", profile: str | Profile = "paper", device: str = "cpu") -> list[RunConfig]:
    """The baselines in the FedStale code base's conventions (`config.framework_methods`) that
    Table 1 does not already hold, at the profile's gammas and seeds."""
    return grid(dataset, framework_methods(dataset), profile, device=device)


def regime_grid(dataset: str = "fmnist", profile: str | Profile = "paper", device: str = "cpu") -> list[RunConfig]:
    """The regime map: client lr x local epochs (`config.REGIME_GRID`) at gamma = 0.9, on the
    map's seeds (the profile's, where it has fewer). The cell of the frozen settings reuses
    Table 1's runs (same keys)."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    seeds = [s for s in prof.seeds if s in REGIME_SEEDS] or list(prof.seeds[:1])
    gammas = [g for g in prof.gammas if g in REGIME_GAMMAS] or list(prof.gammas[-1:])
    configs = []
    for lr in REGIME_GRID["client_lr"]:
        for epochs in REGIME_GRID["local_epochs"]:
            configs += grid(dataset, regime_methods(dataset), prof, gammas=gammas, seeds=seeds, device=device,
                            client_lr=lr, local_epochs=epochs)
    return configs


# The diagnostics runs (probes and tracked coordinates) of the book's chapters 2, 5 and 8.
def alignment_grid(dataset: str, profile: str | Profile, *, seeds: Sequence[int] | None = None,
                   device: str = "cpu") -> list[RunConfig]:
    """Chapter 2's probe runs: FedSteer (the data set's |X| and lambda) x the profile's gammas x
    its first `ablation_seeds` seeds, probing every `probe_every` rounds (cos of stale and of
    steered estimates against the true updates)."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    dd = DATASET_DEFAULTS[dataset]
    few = (tuple(seeds) if seeds is not None else prof.seeds)[: prof.ablation_seeds]
    return grid(dataset, [method("fedsteer", core_size=dd["core_size"], lam=dd["lam"])], prof, seeds=few,
                device=device, diagnostics=Diagnostics(probe_every=prof.probe_every))


def convergence_methods(dataset: str) -> list[MethodSpec]:
    """Chapter 5's methods: `config.paper_methods` without full participation (its partial-
    update variance is 0 by construction, p_i = 1) and with FedStale at beta = 0.7 only."""
    return [m for m in paper_methods(dataset)
            if m.name != "full" and not (m.name == "fedstale" and m.get("beta") != 0.7)]


def convergence_grid(dataset: str, profile: str | Profile, *, seeds: Sequence[int] | None = None,
                     device: str = "cpu") -> list[RunConfig]:
    """Chapter 5's probe runs: `convergence_methods` x the profile's gammas x its first seed,
    with `Diagnostics(probe_every=profile.probe_every)` (every client's true update and the
    aggregation's mean squared error to sum_i d_i g_i on every probe round)."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    first = (tuple(seeds) if seeds is not None else prof.seeds)[:1]
    return grid(dataset, convergence_methods(dataset), prof, gammas=prof.gammas, seeds=first, device=device,
                diagnostics=Diagnostics(probe_every=prof.probe_every))


TRACKED_CLIENTS: tuple[int, ...] = (5, 55, 95)  # the clients of the paper's Fig. 8


def stability_grid(dataset: str, profile: str | Profile, *, seeds: Sequence[int] | None = None,
                   device: str = "cpu") -> dict[str, RunConfig]:
    """Chapter 8's runs (Fig. 8): FedSteer with enforce=5 (refresh_every=5) for
    lambda in {0, 0.5} x |X| in {10, 40}, at the profile's largest gamma and first seed, with
    the coordinates of clients 5, 55 and 95 recorded every round. Keys name the settings."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    first = (tuple(seeds) if seeds is not None else prof.seeds)[:1]
    settings = {f"λ={lam}, |X|={k}": method("fedsteer", core_size=k, lam=lam, refresh_every=5)
                for lam in (0.0, 0.5) for k in (10, 40)}
    configs = grid(dataset, list(settings.values()), prof, gammas=[max(prof.gammas)], seeds=first, device=device,
                   diagnostics=Diagnostics(track_coords=TRACKED_CLIENTS))
    return dict(zip(settings, configs))


def missing(configs: Iterable[RunConfig], root: str | os.PathLike | None = None) -> list[RunConfig]:
    return [c for c in configs if not has_run(c, root)]


def complete_seeds(configs: Iterable[RunConfig], root: str | os.PathLike | None = None) -> list[int]:
    """The seeds whose every run in `configs` is cached (a grid that uses fewer seeds, like
    Fig. 5's, does not hold back the seeds it leaves out). These are the seeds a book can be
    rendered from without computing: `make book SEEDS=...`."""
    configs = list(configs)
    seeds = sorted({c.seed for c in configs})
    lacking = {c.seed for c in missing(configs, root)}
    return [s for s in seeds if s not in lacking]


def _run_and_save(args: tuple[RunConfig, str | None, int]) -> str:
    config, root, threads = args
    if has_run(config, root):  # finished meanwhile by another sweep or a notebook sharing the cache
        return config.key()
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
    Runs are ordered by seed first (a partial sweep covers every method), then as given, with
    full participation last within a seed; a worker reuses its prepared data while the
    dataset, seed and gamma stay the same.
    """
    # Seed by seed, in the order given (the caller's groups), the costly full-participation runs
    # (every client every round) last within a seed.
    todo = sorted(missing(configs, root), key=lambda c: (c.dataset, c.seed, c.method.name == "full"))
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
