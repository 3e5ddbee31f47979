"""Measurements behind chapters 4, 5 and 8 of the book: the core-set objective J(X) of
Algorithm 3, the server-memory table of §8.2, the partial-update variance term of Theorem 2,
and the stability of FedSteer's cached coordinates s_i (§8.5, Fig. 8).

Nothing here trains a model except `warmup_record`, which replays the engine's warm-up
(paper §2.4) to keep the Gram matrices of the client-update snapshots it sees. Every other
function reads tensors or finished runs (`results.load_run` payloads) and returns tidy
pandas tables, so that the notebooks only tell the story.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from math import comb
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from .config import DATASET_DEFAULTS, Diagnostics, MethodSpec, Profile, RunConfig, get_profile, method, paper_methods
from .coreset import SwapTrace, exhaustive_best, greedy_swap, objective_from_gram
from .strategies import ServerContext, make_strategy

__all__ = [
    # chapter 4: core-set selection (§2.4, Algorithm 3, §8.2, §8.3)
    "WarmupRecord", "warmup_record", "gram_factor", "total_energy", "relative_objective", "random_core_objectives",
    "swap_trace_table",
    "selection_comparison", "exhaustive_comparison", "state_bytes", "server_memory_table", "memory_formula",
    # chapter 5: the partial-update variance term of Theorem 2
    "convergence_methods", "convergence_grid", "short_label", "probe_table", "variance_term_summary",
    # chapter 8: coordinate stability (§8.5, Fig. 8)
    "TRACKED_CLIENTS", "stability_grid", "coords_histories", "refresh_rounds", "coordinate_changes", "coordinate_stability", "unexplained_changes",
    "stability_summary", "stability_verdict",
]


# ---------------------------------------------------------------------------------------------
# Chapter 4: core-set selection
# ---------------------------------------------------------------------------------------------
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
    (`engine.client_updates`, with the engine's own warm-up random stream), the strategy's
    greedy single-swap search updates the core set X on that snapshot, then a full-participation
    step w <- w - eta_s sum_i d_i g_i moves the model. The selection itself is the strategy's
    `warmup_snapshot`, so the J traces are the ones a real run stores in `extras["swap_trace"]`.
    `sim` is `engine.prepare(config)`.
    """
    from . import engine  # late import: engine imports the data stack

    if config.method.name != "fedsteer":
        raise ValueError(f"warmup_record needs a fedsteer config, got {config.method.name!r}")
    cycles = int(config.method.get("warmup_cycles"))
    if cycles < 1:
        raise ValueError("warmup_record needs warmup_cycles >= 1")
    tr = config.training
    strategy, ctx, state = engine.server_setup(config, sim)
    gen = engine._torch_gen(config.seed, engine._WARMUP)  # the engine's warm-up stream
    weights = sim.initial_weights.clone()
    grams, init_cores, cores = [], [], []
    for cycle in range(cycles):
        grads, _, _ = engine.client_updates(sim, tr, weights, list(range(ctx.num_clients)), gen)
        init_cores.append(state["core"].tolist())
        strategy.warmup_snapshot(state, ctx, grads, cycle, last=cycle == cycles - 1)
        cores.append(state["core"].tolist())
        g64 = grads.double()
        grams.append((g64 @ g64.T).cpu())
        del g64
        weights = weights - tr.server_lr * (ctx.weights @ grads)
    return WarmupRecord(grams=grams, init_cores=init_cores, cores=cores,
                        traces=[list(t) for t in state["swap_trace"]], weights=ctx.weights.double().cpu(),
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
      `n_sub` random candidates (paper §8.3, N_sub = 20), as `strategies.FedSteer` does;
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


def state_bytes(spec: MethodSpec, num_clients: int, dim: int, device: str | torch.device = "meta") -> int:
    """Bytes of a method's server state tensors (`Strategy.init_state` + `memory_bytes`).

    With the default `device="meta"` the tensors have shapes and dtypes but no storage, so the
    state of N = 10,000 clients and d = 1.6 M parameters is measured without allocating it.
    """
    device = torch.device(device)
    strategy = make_strategy(spec)
    ctx = ServerContext(weights=torch.empty(num_clients, device=device), probs=torch.empty(num_clients, device=device),
                        dim=int(dim), device=device, client_lr=0.05, seed=0)
    return int(strategy.memory_bytes(strategy.init_state(ctx)))


def memory_formula(name: str, num_clients: int, dim: int, k: int | None = None) -> int:
    """The state size in bytes that §8.2's accounting predicts for our float32 implementation:
    FedVARP/FedStale/MIFA 4 N d (every client's stale update), SCAFFOLD 4 (N + 1) d (c_i and c),
    FedSteer 4 (k d + N k + k) + 8 (k^2 + N + k) (basis Q, coordinates s_i, norms; float64 Gram
    matrix, int64 refresh rounds and core ids): O(N k + k d) against O(N d)."""
    n, d = int(num_clients), int(dim)
    if name in ("fedvarp", "fedstale", "mifa"):
        return 4 * n * d
    if name == "scaffold":
        return 4 * (n + 1) * d
    if name == "fedsteer":
        if k is None:
            raise ValueError("memory_formula('fedsteer', ...) needs the core size k")
        return 4 * (k * d + n * k + k) + 8 * (k * k + n + k)
    if name in ("fedavg", "fedavg_unbiased", "fedprox", "full"):
        return 0
    raise ValueError(f"no memory formula for method {name!r}")


def server_memory_table(specs: Sequence[MethodSpec], num_clients: Iterable[int], dims: Mapping[str, int]) -> pd.DataFrame:
    """Measured server-state bytes (meta tensors, see `state_bytes`) of each method for every
    N in `num_clients` and every model size in `dims` ({name: d}); one row per combination,
    with the §8.2 formula next to the measurement and the ratio to FedVARP's O(N d) memory."""
    rows = []
    for dim_name, d in dims.items():
        for n in num_clients:
            varp = state_bytes(MethodSpec("fedvarp"), n, d)
            for spec in specs:
                k = int(spec.get("core_size")) if spec.name == "fedsteer" else None
                measured = state_bytes(spec, n, d)
                label = {"fedsteer": f"FedSteer (|X|={k})", "fedvarp": "FedVARP", "fedstale": "FedStale",
                         "mifa": "MIFA", "scaffold": "SCAFFOLD"}.get(spec.name, spec.label)
                rows.append({"model": dim_name, "d": int(d), "N": int(n), "method": spec.name, "label": label,
                             "k": k, "bytes": measured, "formula_bytes": memory_formula(spec.name, n, d, k),
                             "MB": measured / 1e6, "fraction_of_fedvarp": measured / varp})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# Chapter 5: the partial-update variance term of Theorem 2
# ---------------------------------------------------------------------------------------------
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
    from .sweep import grid

    prof = get_profile(profile) if isinstance(profile, str) else profile
    first = (tuple(seeds) if seeds is not None else prof.seeds)[:1]
    return grid(dataset, convergence_methods(dataset), prof, gammas=prof.gammas, seeds=first, device=device,
                diagnostics=Diagnostics(probe_every=prof.probe_every))


def alignment_grid(dataset: str, profile: str | Profile, *, seeds: Sequence[int] | None = None,
                   device: str = "cpu") -> list[RunConfig]:
    """Chapter 2's probe runs: FedSteer (the data set's |X| and lambda) x the profile's gammas x
    its first `ablation_seeds` seeds, probing every `probe_every` rounds (cos of stale and of
    steered estimates against the true updates)."""
    from .sweep import grid

    prof = get_profile(profile) if isinstance(profile, str) else profile
    dd = DATASET_DEFAULTS[dataset]
    few = (tuple(seeds) if seeds is not None else prof.seeds)[: prof.ablation_seeds]
    return grid(dataset, [method("fedsteer", core_size=dd["core_size"], lam=dd["lam"])], prof, seeds=few,
                device=device, diagnostics=Diagnostics(probe_every=prof.probe_every))


def short_label(label: str) -> str:
    """A method label without the warm-up length (which only the profile sets), e.g.
    'fedsteer(refresh_every=5, warmup_cycles=2)' -> 'fedsteer(refresh_every=5)'."""
    name, _, rest = label.partition("(")
    if not rest:
        return label
    args = [a.strip() for a in rest.rstrip(")").split(",") if a.strip() and not a.strip().startswith("warmup_cycles=")]
    return name + (f"({', '.join(args)})" if args else "")


def _nan(x: Any) -> float:
    return float("nan") if x is None else float(x)


def probe_table(configs: Sequence[RunConfig], root) -> pd.DataFrame:
    """The per-round probe summaries (client = -1 rows of `extras["probes"]`) of finished runs
    with `Diagnostics(probe_every > 0)`: one row per (run, probe round).

    Columns: label (without warm-up length), method, gamma, seed, round, mc_variance
    (E||Delta - E Delta||^2 over participation draws), exact_variance (Theorem 1's closed form,
    NaN where Eq. 4's form does not apply), mse_to_mean (E||Delta - sum_i d_i g_i||^2: the
    quantity in Theorem 2's partial-update variance term), bias_sq (||E Delta - sum_i d_i g_i||^2),
    target_norm_sq (||sum_i d_i g_i||^2) and relative_mse = mse_to_mean / target_norm_sq.
    """
    from .results import load_run

    rows = []
    for c in configs:
        payload = load_run(c, root)
        probes = payload["extras"].get("probes")
        if not probes:
            raise ValueError(f"run {c.key()} ({c.method.label}) has no probes; use Diagnostics(probe_every > 0)")
        for p in probes:
            if p["client"] != -1:
                continue
            target_sq = _nan(p["target_norm"]) ** 2
            mse = _nan(p["mse_to_mean"])
            rows.append({"label": short_label(c.method.label), "method": c.method.name, "gamma": c.system.gamma,
                         "seed": c.seed, "round": int(p["round"]), "mc_variance": _nan(p["mc_variance"]),
                         "exact_variance": _nan(p["exact_variance"]), "mse_to_mean": mse,
                         "bias_sq": _nan(p["bias_norm"]) ** 2, "target_norm_sq": target_sq,
                         "relative_mse": mse / target_sq if target_sq > 0 else float("nan"),
                         "collapsed": bool(payload["summary"]["collapsed"])})
    return pd.DataFrame(rows)


def variance_term_summary(table: pd.DataFrame, metric: str = "mse_to_mean") -> pd.DataFrame:
    """Time average (over the probe rounds, then over seeds) of `metric` per (gamma, label):
    the empirical (1/T) sum_t E||Delta_t - g_bar_t||^2 of Theorem 2's partial-update variance
    term 4 eta_s L (1/T) sum_t E||Delta_t - g_bar_t||^2. Adds the averages of the variance and
    the squared bias (mse = variance + bias^2), the ratio to the smallest average within each
    gamma, the rank (1 = smallest term) and the number of collapsed runs (a collapsed run is
    averaged over the probes it reached)."""
    table = table.assign(collapsed=table["collapsed"] if "collapsed" in table else False)
    per_run = table.groupby(["gamma", "label", "method", "seed"], as_index=False).agg(
        term=(metric, "mean"), mc_variance=("mc_variance", "mean"), bias_sq=("bias_sq", "mean"),
        exact_variance=("exact_variance", "mean"), probes=("round", "count"), collapsed=("collapsed", "max"))
    out = per_run.groupby(["gamma", "label", "method"], as_index=False).agg(
        term=("term", "mean"), mc_variance=("mc_variance", "mean"), bias_sq=("bias_sq", "mean"),
        exact_variance=("exact_variance", "mean"), probes=("probes", "mean"), seeds=("seed", "nunique"),
        collapsed_runs=("collapsed", "sum"))
    out["ratio_to_smallest"] = out["term"] / out.groupby("gamma")["term"].transform("min")
    out["rank"] = out.groupby("gamma")["term"].rank(method="min").astype(int)
    return out.sort_values(["gamma", "term"]).reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# Chapter 8: coordinate stability
# ---------------------------------------------------------------------------------------------
TRACKED_CLIENTS: tuple[int, ...] = (5, 55, 95)  # the clients of the paper's Fig. 8


def stability_grid(dataset: str, profile: str | Profile, *, seeds: Sequence[int] | None = None,
                   device: str = "cpu") -> dict[str, RunConfig]:
    """Chapter 8's runs (Fig. 8): FedSteer with enforce=5 (refresh_every=5) for
    lambda in {0, 0.5} x |X| in {10, 40}, at the profile's largest gamma and first seed, with
    the coordinates of clients 5, 55 and 95 recorded every round. Keys name the settings."""
    from .sweep import grid

    prof = get_profile(profile) if isinstance(profile, str) else profile
    first = (tuple(seeds) if seeds is not None else prof.seeds)[:1]
    settings = {f"λ={lam}, |X|={k}": method("fedsteer", core_size=k, lam=lam, refresh_every=5)
                for lam in (0.0, 0.5) for k in (10, 40)}
    configs = grid(dataset, list(settings.values()), prof, gammas=[max(prof.gammas)], seeds=first, device=device,
                   diagnostics=Diagnostics(track_coords=TRACKED_CLIENTS))
    return dict(zip(settings, configs))


def coords_histories(payload: Mapping[str, Any]) -> dict[int, np.ndarray]:
    """{client: (rounds, k) array} of a FedSteer run's `extras["coords_history"]`: row t is
    s_i after round t (recorded with `Diagnostics(track_coords=...)`)."""
    hist = payload.get("extras", {}).get("coords_history")
    if not hist:
        raise ValueError("this run recorded no coordinates; use Diagnostics(track_coords=(...)) with FedSteer")
    return {int(c): np.asarray(v, dtype=np.float64) for c, v in hist.items()}


def refresh_rounds(participation: Sequence[Sequence[int]], client: int, refresh_every: int) -> list[int]:
    """The rounds at which FedSteer recomputes s_i of `client` (Eq. 3): the client is active
    and at least `refresh_every` rounds have passed since its last refresh (the rule of
    `strategies.FedSteer`; refresh_every=5 is the paper's enforce=5)."""
    if refresh_every < 1:
        raise ValueError(f"refresh_every must be >= 1, got {refresh_every}")
    out, last = [], None
    for t, active in enumerate(participation):
        if client in active and (last is None or t - last >= refresh_every):
            out.append(t)
            last = t
    return out


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else float("nan")


def coordinate_changes(history: np.ndarray, rounds: Sequence[int]) -> pd.DataFrame:
    """For each refresh round t >= 1 in `rounds`: the cosine similarity between s_i before
    (row t-1) and after (row t) the refresh, and the relative change ||s_after - s_before|| /
    ||s_before||. (A refresh at round 0 has no recorded 'before': the warm-up's s_i.)"""
    rows = []
    for t in rounds:
        if t < 1 or t >= history.shape[0]:
            continue
        before, after = history[t - 1], history[t]
        norm = np.linalg.norm(before)
        rows.append({"round": int(t), "cosine": _cos(before, after),
                     "relative_change": float(np.linalg.norm(after - before) / norm) if norm > 0 else float("nan")})
    return pd.DataFrame(rows, columns=["round", "cosine", "relative_change"])


def coordinate_stability(payload: Mapping[str, Any], refresh_every: int) -> pd.DataFrame:
    """One row per (tracked client, refresh with a recorded 'before') of a FedSteer run:
    round, cosine and relative_change (see `coordinate_changes`), and in_core: whether the
    client is itself a member of the core set X (then, with lambda = 0, s_i is ||g_i|| times a
    unit vector and its cosine is 1 whatever happens)."""
    hist = coords_histories(payload)
    participation = payload["extras"]["participation"]
    core = set(payload["extras"].get("core", []))
    frames = []
    for client, h in hist.items():
        df = coordinate_changes(h, refresh_rounds(participation[: h.shape[0]], client, refresh_every))
        df.insert(0, "client", client)
        df["in_core"] = client in core
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["client", "round", "cosine", "relative_change", "in_core"])
    return pd.concat(frames, ignore_index=True)


def unexplained_changes(payload: Mapping[str, Any], refresh_every: int) -> int:
    """How many recorded rounds t >= 1 show a change of a tracked client's s_i that the refresh
    rule does not explain (0 when the record and `refresh_rounds` agree: s_i is constant
    between refreshes, so the refresh events are all there is to measure)."""
    hist = coords_histories(payload)
    participation = payload["extras"]["participation"]
    count = 0
    for client, h in hist.items():
        rounds = set(refresh_rounds(participation[: h.shape[0]], client, refresh_every))
        count += sum(1 for t in range(1, h.shape[0]) if not np.array_equal(h[t], h[t - 1]) and t not in rounds)
    return count


def stability_summary(runs: Mapping[str, Mapping[str, Any]], refresh_every: int) -> pd.DataFrame:
    """One row per setting ({name: run payload}): the number of observed refreshes of the
    tracked clients, the median cosine between s_i before and after a refresh, the median
    relative change ||Delta s|| / ||s||, the cosine between each client's first and last
    recorded s_i (drift over the whole run), and as a reference the median cosine between
    *different* tracked clients' s_i at the same round (how similar unrelated coordinate
    vectors are in this setting), and which tracked clients are core members."""
    rows = []
    for name, payload in runs.items():
        events = coordinate_stability(payload, refresh_every)
        hist = coords_histories(payload)
        drift = [_cos(h[0], h[-1]) for h in hist.values() if h.shape[0] >= 2]
        clients = sorted(hist)
        cross = [_cos(hist[a][t], hist[b][t]) for i, a in enumerate(clients) for b in clients[i + 1:]
                 for t in range(min(hist[a].shape[0], hist[b].shape[0]))]
        core = set(payload["extras"].get("core", []))
        rows.append({"setting": name, "refreshes": int(len(events)),
                     "tracked_in_core": ", ".join(str(c) for c in clients if c in core) or "-",
                     "median_cosine": float(events["cosine"].median()) if len(events) else float("nan"),
                     "median_relative_change": float(events["relative_change"].median()) if len(events) else float("nan"),
                     "first_last_cosine": float(np.nanmedian(drift)) if drift else float("nan"),
                     "cross_client_cosine": float(np.nanmedian(cross)) if cross else float("nan"),
                     "unexplained_changes": unexplained_changes(payload, refresh_every)})
    return pd.DataFrame(rows)


def stability_verdict(summary: pd.DataFrame, min_cosine: float = 0.9, max_change: float = 0.5) -> pd.DataFrame:
    """Judge each setting of `stability_summary` (indexed by setting): 'stable' is True when the
    median refresh cosine is >= `min_cosine` and the median relative change <= `max_change`,
    None when no refresh was observed. Adds a one-line `message` per setting."""
    out = summary.copy()
    judged = out["refreshes"] > 0
    ok = (out["median_cosine"] >= min_cosine) & (out["median_relative_change"] <= max_change)
    out["stable"] = pd.Series([bool(v) if j else None for v, j in zip(ok, judged)], index=out.index, dtype=object)
    messages = []
    for name, row in out.iterrows():
        if row["stable"] is None:
            messages.append(f"{name}: no refresh with a recorded 'before' - nothing to judge.")
        else:
            messages.append(f"{name}: {int(row['refreshes'])} refreshes, median cosine {row['median_cosine']:.3f}, "
                            f"median relative change {row['median_relative_change']:.3f} (cross-client cosine "
                            f"{row['cross_client_cosine']:.3f}) -> {'stable' if row['stable'] else 'NOT stable'} "
                            f"(criterion: cosine >= {min_cosine}, change <= {max_change}).")
    out["message"] = messages
    return out
