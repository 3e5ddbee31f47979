"""Core-set selection (paper §2.4, Algorithm 3) measured on real client updates: the warm-up
replayed with its Gram matrices kept, the objective J(X) relative to the update energy, the
greedy swaps' J traces, random / greedy / subsampled-greedy core sets compared (§8.3), and
greedy swaps against the exhaustive optimum.

Nothing here trains a model except `warmup_record`, which replays the engine's warm-up (paper
§2.4) to keep the Gram matrices of the client-update snapshots it sees. Used by chapter 4.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..experiments.config import RunConfig
from ..coreset import SwapTrace, exhaustive_best, greedy_swap, objective_from_gram

__all__ = ["WarmupRecord", "warmup_record", "gram_factor", "total_energy", "relative_objective",
           "random_core_objectives", "swap_trace_table", "selection_comparison", "selection_summary",
           "exhaustive_comparison"]


@dataclass
class WarmupRecord:
    """What Algorithm 3 saw and did during the warm-up of one FedSteer run (paper §2.4).

    grams[c]: the float64 Gram matrix K = [g_i . g_j] (N, N) of cycle c's snapshot of all N
        client updates. J(X) depends on the updates only through K (see coreset.py), so K is
        all the selection experiments need (a snapshot itself is N x d floats).
    init_cores[c] / cores[c]: the core set before / after cycle c's greedy swaps.
    traces[c]: J after the cycle's initial core and after every executed swap; identical to
        the run's `extras["swap_trace"][c]`.
    weights: d_i (float64, exactly as the strategy uses them).
    """

    grams: list[torch.Tensor]
    init_cores: list[list[int]]
    cores: list[list[int]]
    traces: list[list[float]]
    weights: torch.Tensor
    probs: torch.Tensor
    k: int
    lam: float
    max_swaps: int
    dim: int

    @property
    def cycles(self) -> int:
        return len(self.grams)

    @property
    def num_clients(self) -> int:
        return int(self.weights.shape[0])


def warmup_record(sim, config: RunConfig) -> WarmupRecord:
    """Replay the engine's warm-up for a FedSteer `config` (paper §2.4, Algorithm 3).

    T0 = warmup_cycles selection cycles: at a fixed model every client's update is computed
    (`engine.warmup_updates`, the very snapshots a run on `sim` uses), the strategy's
    greedy single-swap search updates the core set X on that snapshot, then a full-participation
    step w <- w - eta_s sum_i d_i g_i moves the model. The selection itself is the strategy's
    `warmup_snapshot`, so the J traces are the ones a real run stores in `extras["swap_trace"]`.
    `sim` is `engine.prepare(config)`.
    """
    from ..simulator import engine  # late import: engine imports the data stack

    if config.method.name != "fedsteer":
        raise ValueError(f"warmup_record needs a fedsteer config, got {config.method.name!r}")
    cycles = int(config.method.get("warmup_cycles"))
    if cycles < 1:
        raise ValueError("warmup_record needs warmup_cycles >= 1")
    strategy, ctx, state = engine.server_setup(config, sim)
    grams, init_cores, cores = [], [], []
    snapshots, _ = engine.warmup_updates(sim, config, cycles)  # the engine's own snapshots
    for cycle, grads in enumerate(snapshots):
        init_cores.append(state.core.tolist())
        strategy.warmup_snapshot(state, ctx, grads, cycle, last=cycle == cycles - 1)
        cores.append(state.core.tolist())
        g64 = grads.double()
        grams.append((g64 @ g64.T).cpu())
        del g64
    return WarmupRecord(grams=grams, init_cores=init_cores, cores=cores,
                        traces=[list(t) for t in state.swap_trace], weights=ctx.weights.double().cpu(),
                        probs=ctx.probs.double().cpu(), k=int(config.method.get("core_size")),
                        lam=float(config.method.get("lam")), max_swaps=int(config.method.get("max_swaps")),
                        dim=int(ctx.dim))


def gram_factor(gram: torch.Tensor) -> torch.Tensor:
    """A matrix F (N, N) with F F^T = K for a positive semi-definite Gram matrix K.

    J(X) and the greedy search of Algorithm 3 see the updates only through K, so running
    `coreset.greedy_swap` / `exhaustive_best` on F gives the same core sets and J values as
    running them on the d-dimensional updates, at O(N^2) memory instead of O(N d).
    """
    gram = gram.double()
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1]:
        raise ValueError(f"gram must be a square matrix, got shape {tuple(gram.shape)}")
    evals, evecs = torch.linalg.eigh((gram + gram.T) / 2)
    return evecs * evals.clamp_min(0.0).sqrt()[None, :]


def total_energy(gram: torch.Tensor, weights: torch.Tensor) -> float:
    """J of the empty core set, sum_i d_i ||g_i||^2: the scale against which J is reported."""
    return float((weights.double() * gram.double().diagonal()).sum())


def relative_objective(gram: torch.Tensor, core: Sequence[int], weights: torch.Tensor, lam: float) -> float:
    """J(X) / sum_i d_i ||g_i||^2 (§2.4's objective as a fraction of the weighted update energy)."""
    return objective_from_gram(gram, list(core), weights, lam) / total_energy(gram, weights)


def random_core_objectives(gram: torch.Tensor, weights: torch.Tensor, k: int, lam: float, *, draws: int = 20,
                           seed: int = 0) -> np.ndarray:
    """Relative J (J / sum_i d_i ||g_i||^2) of `draws` uniformly random k-client core sets on
    one snapshot: the 'no selection' reference of Algorithm 3."""
    n = gram.shape[0]
    gen = np.random.default_rng([seed, 99])
    return np.array([relative_objective(gram, gen.choice(n, size=k, replace=False).tolist(), weights, lam)
                     for _ in range(draws)])


def swap_trace_table(traces: Sequence[Sequence[float]], energies: Sequence[float] | None = None) -> pd.DataFrame:
    """Tidy table of Algorithm 3's J traces: one row per (cycle, swap).

    `traces` is a run's `extras["swap_trace"]` or `WarmupRecord.traces`; `energies[c]`
    (sum_i d_i ||g_i||^2 of cycle c's snapshot) adds the column `relative_J`. `step` counts
    swaps across cycles (the x axis of the trace plot).
    """
    rows, step = [], 0
    for cycle, trace in enumerate(traces):
        for swap, value in enumerate(trace):
            row = {"cycle": cycle, "swap": swap, "step": step, "J": float(value)}
            if energies is not None:
                row["relative_J"] = float(value) / float(energies[cycle])
            rows.append(row)
            step += 1
    return pd.DataFrame(rows)


def selection_comparison(grams: Sequence[torch.Tensor], weights: torch.Tensor, k: int, lam: float, *,
                         draws: int = 8, max_swaps: int = 5, n_sub: int = 20, converged: bool = True,
                         seed: int = 0) -> pd.DataFrame:
    """Random vs greedy vs subsampled-greedy core sets, compared by J on the last snapshot.

    For each draw a random initial core X_0 (k clients) is drawn; then
    - "random": X_0 itself (no selection);
    - "greedy": Algorithm 3, i.e. up to `max_swaps` best single swaps on each snapshot in turn
      (one per selection cycle), each cycle starting from the previous cycle's core;
    - "subsampled": the same, but each cycle only considers swapping in clients from
      `n_sub` random candidates (paper §8.3, N_sub = 20), as `fedsteer.FedSteer` does;
    - "greedy (converged)": on the last snapshot only, swaps until no swap lowers J (a local
      optimum of the swap neighbourhood; the reference for the swap budget). Only if
      `converged` (it costs many swaps for large k).
    Returns one row per (draw, selection): J, relative_J (J / sum_i d_i ||g_i||^2) and the
    number of swaps executed.
    """
    if not grams:
        raise ValueError("selection_comparison needs at least one snapshot Gram matrix")
    factors = [gram_factor(g) for g in grams]
    n = factors[-1].shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"core size k must be in [1, {n}], got {k}")
    weights = weights.double()
    last, energy = grams[-1], total_energy(grams[-1], weights)
    rows = []
    for draw in range(draws):
        init = np.random.default_rng([seed, draw]).choice(n, size=k, replace=False).tolist()
        results: dict[str, tuple[list[int], int]] = {"random": (init, 0)}
        for name, sub in (("greedy", 0), ("subsampled", n_sub)):
            core, swaps = list(init), 0
            for cycle, factor in enumerate(factors):
                candidates = None
                if sub:
                    gen = np.random.default_rng([seed, draw, cycle, 4])
                    candidates = sorted(gen.choice(n, size=min(sub, n), replace=False).tolist())
                trace = SwapTrace()
                core = greedy_swap(factor, k, weights, lam, max_swaps=max_swaps, init=core,
                                   candidates=candidates, trace=trace)
                swaps += len(trace) - 1
            results[name] = (core, swaps)
        if converged:
            trace = SwapTrace()
            core = greedy_swap(factors[-1], k, weights, lam, max_swaps=10 * n, init=init, trace=trace)
            results["greedy (converged)"] = (core, len(trace) - 1)
        for name, (core, swaps) in results.items():
            j = objective_from_gram(last, core, weights, lam)
            rows.append({"draw": draw, "selection": name, "k": k, "lam": lam, "J": j,
                         "relative_J": j / energy, "swaps": swaps})
    return pd.DataFrame(rows)


def selection_summary(comparison: pd.DataFrame) -> pd.DataFrame:
    """One row per core size of `selection_comparison`'s table: the median relative J of random,
    greedy and subsampled core sets (and greedy run to convergence where it was run: NaN
    otherwise), greedy's reduction against random (%), the share of that reduction the
    subsampled search keeps (%), the draws in which greedy beats subsampled, and the share of
    greedy's J that swapping to convergence still removes (%)."""
    wide = comparison.pivot_table(index=["k", "draw"], columns="selection", values="relative_J")
    rows = []
    for k, w in wide.groupby(level="k"):
        g, r, s = w["greedy"].median(), w["random"].median(), w["subsampled"].median()
        c = w["greedy (converged)"].median() if "greedy (converged)" in w and w["greedy (converged)"].notna().all() \
            else float("nan")
        rows.append({"k": int(k), "random": r, "greedy": g, "subsampled": s, "greedy (converged)": c,
                     "greedy_reduction_pct": 100 * (1 - g / r), "subsampled_keeps_pct": 100 * (r - s) / (r - g),
                     "greedy_beats_subsampled": int((w["greedy"] < w["subsampled"]).sum()), "draws": len(w),
                     "budget_leaves_pct": 100 * (g - c) / g})
    return pd.DataFrame(rows)


def exhaustive_comparison(gram: torch.Tensor, weights: torch.Tensor, *, n: int = 12, k: int = 3, lam: float = 0.5,
                          instances: int = 50, seed: int = 0, rtol: float = 1e-9) -> pd.DataFrame:
    """Greedy single swaps (run to convergence from a random core) vs the exhaustive optimum.

    Each instance draws `n` clients of the snapshot (Gram matrix `gram`), renormalises their
    weights d_i to sum to 1, and compares
    - J_opt: the best of all C(n, k) core sets (`coreset.exhaustive_best`),
    - J_greedy: `coreset.greedy_swap` from a random k-subset until no swap helps,
    - J_random: that random starting core.
    `hit` is True when greedy reaches the optimal value (relative tolerance `rtol`);
    `gap` = J_greedy / J_opt - 1.
    """
    gram = gram.double()
    total = gram.shape[0]
    if not 1 <= k < n <= total:
        raise ValueError(f"need 1 <= k < n <= N={total}, got k={k}, n={n}")
    if comb(n, k) > 200_000:
        raise ValueError(f"C({n}, {k}) = {comb(n, k)} subsets is too many for an exhaustive search")
    rows = []
    for inst in range(instances):
        gen = np.random.default_rng([seed, inst])
        ids = np.sort(gen.choice(total, size=n, replace=False))
        sub = torch.from_numpy(ids)
        g_sub = gram[sub][:, sub]
        w_sub = weights.double()[sub]
        w_sub = w_sub / w_sub.sum()
        factor = gram_factor(g_sub)
        best_core, j_opt = exhaustive_best(factor, k, w_sub, lam)
        init = gen.choice(n, size=k, replace=False).tolist()
        trace = SwapTrace()
        core = greedy_swap(factor, k, w_sub, lam, max_swaps=10 * n, init=init, trace=trace)
        j_greedy = objective_from_gram(g_sub, core, w_sub, lam)
        j_random = objective_from_gram(g_sub, init, w_sub, lam)
        rows.append({"instance": inst, "clients": ids.tolist(), "J_opt": j_opt, "J_greedy": j_greedy, "J_random": j_random,
                     "hit": bool(j_greedy <= j_opt * (1 + rtol) + 1e-300), "gap": j_greedy / j_opt - 1.0,
                     "random_gap": j_random / j_opt - 1.0, "swaps": len(trace) - 1,
                     "same_set": sorted(core) == sorted(best_core)})
    return pd.DataFrame(rows)
