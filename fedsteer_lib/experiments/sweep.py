"""Grids of runs, computed only where the results cache lacks them, resumable after any crash.

`grid` builds methods x gammas x seeds with the frozen training settings; the named groups of
the book live in `groups`.

Each finished run is written atomically as soon as it ends, so a sweep killed at any moment
(even with SIGKILL) and restarted loses no finished run and yields the same table.

Sweeps that share a cache never compute the same run twice: a run is computed under an
exclusive `fcntl` lock on `runs/.locks/<key>.lock`. A run locked by another live sweep is
skipped and looked at again once this sweep's other runs are done: by then it is cached, or
its sweep died (the kernel drops a dead process's locks) and this one computes it.
"""
from __future__ import annotations

import contextlib
import fcntl
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch
from tqdm import tqdm

from dataclasses import replace

from .. import numerics
from ..simulator.engine import SimData, prepare, run
from .config import DATASET_DEFAULTS, TUNED, same_data, Diagnostics, FLSystem, MethodSpec, Profile, RunConfig, Training, get_profile
from .results import CacheLayoutError, has_run, layout_problems, run_path, save_run

__all__ = ["profile_training", "grid", "run_grid", "missing", "complete_seeds", "run_lock"]


def profile_training(dataset: str, profile: str | Profile = "paper") -> Training:
    """The frozen (tuned) training settings with the profile's rounds, evaluation schedule and,
    where it sets one, its local epochs: the training of every run of the profile's grids."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    epochs = TUNED[dataset].local_epochs if prof.local_epochs is None else prof.local_epochs
    return replace(TUNED[dataset], rounds=prof.rounds, eval_every=prof.eval_every, eval_last=prof.eval_last,
                   local_epochs=epochs)


def grid(dataset: str, methods: Sequence[MethodSpec], profile: str | Profile = "paper", *,
         gammas: Iterable[float] | None = None, seeds: Iterable[int] | None = None, device: str = "cpu",
         system: FLSystem | None = None, diagnostics: Diagnostics | None = None,
         **training_changes) -> list[RunConfig]:
    """methods x gammas x seeds with the frozen (tuned) training settings and the profile's
    rounds, evaluation schedule and warm-up length (gammas and seeds default to the profile's).
    `training_changes` (e.g. client_lr=0.03) override the frozen training settings."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    training = replace(profile_training(dataset, prof), **training_changes)
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


@contextlib.contextmanager
def run_lock(config: RunConfig, root: str | os.PathLike | None = None, *, wait: bool) -> Iterator[bool]:
    """Hold the exclusive lock of `config`'s run in cache `root` (`runs/.locks/<key>.lock`):
    yields True once held, False at once when another process holds it and `wait` is False.
    The lock is released when the block ends, or by the kernel when the process dies."""
    path = run_path(config, root)
    lock = path.parent / ".locks" / f"{path.stem}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


COMPUTED, CACHED, BUSY = "computed", "cached", "busy"  # what `_run_and_save` did with a run


def _run_and_save(args: tuple) -> tuple[str, str]:
    """(key, outcome): COMPUTED, CACHED (finished meanwhile by another sweep or a notebook
    sharing the cache) or BUSY (another live sweep holds its lock and `wait` is False).
    `args`: (config, root, threads, wait[, the run's own progress bar])."""
    config, root, threads, wait, *bar = args
    with run_lock(config, root, wait=wait) as held:
        if not held:
            return config.key(), BUSY
        if has_run(config, root):
            return config.key(), CACHED
        torch.set_num_threads(threads)
        global _SIM
        if _SIM is None or not same_data(_SIM.config, config):
            _SIM = prepare(config)
        result = run(config, progress=bool(bar and bar[0]), sim=_SIM)
        save_run(result, config, root)
    return config.key(), COMPUTED


_SIM: SimData | None = None


def _worker_start(kernels: str, sweep_pid: int) -> None:
    """A local worker's start: the sweep's kernel mode, and a watch that ends the worker once
    the sweep that started it has ended. A sweep killed by a signal (`kill`, SIGKILL) runs no
    clean-up, and its workers would otherwise go on computing their runs as orphans."""
    numerics.select_kernels(kernels)

    def watch() -> None:
        while os.getppid() == sweep_pid:
            time.sleep(1.0)
        os._exit(1)  # the run in progress is lost, as it is for the sweep; its lock dies with it

    threading.Thread(target=watch, name="sweep-watch", daemon=True).start()


def run_grid(configs: Sequence[RunConfig], root: str | os.PathLike | None = None, *, workers: int = 1,
             progress: bool = True, desc: str = "runs", executor: str = "local", address: str | None = None,
             gpus_per_run: float = 0.0, run_progress: bool = False) -> int:
    """Compute every config whose result is missing; returns how many were computed.

    executor "local": workers > 1 runs that many processes, each with its share of the CPU
    threads. executor "ray": each run is a Ray task (`ray_executor.run_on_ray`) on the cluster
    at `address` (None: a local Ray instance with `workers` CPUs), `workers` at a time, each
    with one CPU thread and `gpus_per_run` of a GPU; the driver saves every result.
    Runs are ordered by seed first (a partial sweep covers every method), then as given, with
    full participation last within a seed; a worker reuses its prepared data while the
    dataset, seed and gamma stay the same. Before anything is computed, the cache's layout is
    checked (`results.layout_problems`): CacheLayoutError names every problem. A run that
    another sweep is computing (its lock is held) is left to it and looked at again at the end:
    cached by then, or computed here if that sweep died. `run_progress` (one local worker only):
    each run shows its own progress bar over its rounds (the `run` command's).
    """
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if executor not in ("local", "ray"):
        raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")
    if not 0 <= gpus_per_run <= 1 or (gpus_per_run and executor != "ray"):
        raise ValueError(f"gpus_per_run must be in [0, 1] and needs executor='ray', got {gpus_per_run!r}")
    # Seed by seed, in the order given (the caller's groups), the costly full-participation runs
    # (every client every round) last within a seed.
    todo = sorted(missing(configs, root), key=lambda c: (c.dataset, c.seed, c.method.name == "full"))
    if not todo:
        return 0
    problems = layout_problems(todo, root)
    if problems:
        raise CacheLayoutError("the results cache cannot take these runs:\n" + "\n".join(problems.values()))
    root_s = None if root is None else str(root)
    bar = tqdm(total=len(todo), desc=desc, disable=not progress)
    outcomes: dict[str, str] = {}
    # First pass: skip what another sweep is computing; second pass: wait for it, compute it if
    # that sweep died before saving it.
    for wait in (False, True):
        batch = [c for c in todo if outcomes.get(c.key(), BUSY) == BUSY]
        if not batch:
            break
        if executor == "ray":
            outcomes.update(_run_on_ray(batch, root, workers, address, gpus_per_run, wait, bar))
        elif workers == 1:
            for c in batch:
                bar.set_postfix_str(f"{c.method.label} gamma={c.system.gamma} seed={c.seed}")
                key, outcome = _run_and_save((c, root_s, torch.get_num_threads(), wait, run_progress))
                outcomes[key] = outcome
                bar.update(outcome != BUSY)
        else:
            threads = max(1, (os.cpu_count() or 1) // workers)
            ctx = mp.get_context("spawn")
            # Each worker puts this process's kernel mode in force before it computes, and ends
            # when this process ends, however it ends (`_worker_start`).
            with ctx.Pool(workers, maxtasksperchild=None, initializer=_worker_start,
                          initargs=(numerics.kernels(), os.getpid())) as pool:
                for key, outcome in pool.imap_unordered(_run_and_save, [(c, root_s, threads, wait) for c in batch]):
                    outcomes[key] = outcome
                    bar.update(outcome != BUSY)
    bar.close()
    computed = sum(o == COMPUTED for o in outcomes.values())
    elsewhere = len(todo) - computed
    if elsewhere:
        print(f"{elsewhere} of the {len(todo)} missing runs were computed meanwhile by another sweep or notebook "
              f"on this cache", file=sys.stderr)
    return computed


def _run_on_ray(batch: Sequence[RunConfig], root, workers: int, address: str | None, gpus_per_run: float,
                wait: bool, bar) -> dict[str, str]:
    """The Ray executor's pass over `batch`: the driver holds each run's lock while its task runs
    (the tasks themselves never touch the cache) and saves each result."""
    from .ray_executor import run_on_ray

    outcomes: dict[str, str] = {}
    with contextlib.ExitStack() as held:
        mine = []
        for c in batch:
            if not held.enter_context(run_lock(c, root, wait=wait)):
                outcomes[c.key()] = BUSY
            elif has_run(c, root):
                outcomes[c.key()] = CACHED
            else:
                mine.append(c)

        def save(result, c):
            save_run(result, c, root)
            outcomes[c.key()] = COMPUTED

        if mine:
            run_on_ray(mine, save, workers=workers, address=address, gpus_per_run=gpus_per_run,
                       on_done=lambda c: bar.update())
    return outcomes
