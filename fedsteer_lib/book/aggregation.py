"""Aggregation rules as estimators of the full-participation update sum_i d_i g_i: their moments
over Bernoulli(p_i) participation draws (Monte Carlo, or exact enumeration for small N), Theorem
1's closed-form variance client by client, and the server states (FedSteer after its warm-up,
FedVARP, FedVARP as a one-hot FedSteer, Remark 2) whose estimates are compared.

Used by chapter 1 (unbiased vs normalised FedAvg, who makes the aggregate noisy) and chapter 3
(Theorem 1 against Monte Carlo, its variances seed by seed, Remark 2, the bias of the two
orderings of Eq. 4).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..experiments.config import MethodSpec, RunConfig, method
from ..projection import update_variance
from ..simulator.engine import prepare
from ..simulator.partition import rng
from ..experiments.registry import make_strategy
from ..strategy import ServerContext, State, Strategy
from .snapshots import Trajectory, trajectory
from .stats import tested_verdicts
from .table_display import mean_std_text, readable_value

__all__ = ["MC_STREAM", "MonteCarlo", "monte_carlo", "exact_moments", "aggregation_coefficients",
           "variance_contributions", "estimator_table", "theorem1_variances", "variance_by_seed", "variance_verdicts",
           "fedsteer_state", "fedvarp_state", "one_hot_fedsteer"]

MC_STREAM = 22  # the random stream of participation draws (see partition.rng)


@dataclass
class MonteCarlo:
    """Moments of an aggregate Delta over independent participation draws, with the updates
    fixed (the randomness of Theorem 1). target = sum_i d_i g_i.

    variance: E||Delta - E Delta||^2 (sample estimate); variance_se its standard error.
    bias_norm: ||mean(Delta) - target||; noise_norm = sqrt(variance / draws) is the size this
    has from Monte-Carlo noise alone when the rule is unbiased.
    mse: E||Delta - target||^2 = variance + bias^2. errors: ||Delta - target|| per draw.
    """

    draws: int
    variance: float
    variance_se: float
    bias_norm: float
    noise_norm: float
    target_norm: float
    mse: float
    errors: np.ndarray

    @property
    def relative_bias(self) -> float:
        """bias_norm / ||sum_i d_i g_i||."""
        return self.bias_norm / self.target_norm

    @property
    def relative_noise(self) -> float:
        """noise_norm / ||sum_i d_i g_i||."""
        return self.noise_norm / self.target_norm

    def row(self) -> dict[str, float]:
        return {"draws": self.draws, "mc_variance": self.variance, "mc_variance_se": self.variance_se,
                "bias_norm": self.bias_norm, "noise_norm": self.noise_norm, "relative_bias": self.relative_bias,
                "relative_noise": self.relative_noise, "mse": self.mse, "target_norm": self.target_norm}


def _draw_masks(probs: torch.Tensor, draws: int, seed: int) -> np.ndarray:
    return rng(seed, MC_STREAM).random((draws, probs.shape[0])) < probs.double().cpu().numpy()[None, :]


def monte_carlo(strategy: Strategy, state: State, ctx: ServerContext, updates: torch.Tensor, draws: int,
                seed: int = 0) -> MonteCarlo:
    """Evaluate `strategy.aggregate` (pure) on `draws` participation sets A drawn with
    P(i in A) = p_i independently (ctx.probs), the true updates `updates` (N, r) fixed.

    Use it on `span_embedding` coordinates: then it is exact and cheap (the rules only combine
    the vectors linearly with inner-product-dependent coefficients).
    """
    if draws < 2:
        raise ValueError(f"draws must be >= 2, got {draws}")
    masks = _draw_masks(ctx.probs, draws, seed)
    target = (ctx.weights.double() @ updates.double())
    out = torch.empty(draws, updates.shape[1], dtype=torch.float64)
    for j in range(draws):
        active = torch.from_numpy(np.nonzero(masks[j])[0]).to(updates.device)
        out[j] = strategy.aggregate(state, ctx, active, updates[active]).double().cpu()
    mean = out.mean(0)
    centred = ((out - mean) ** 2).sum(1)
    variance = float(centred.sum()) / (draws - 1)
    errors = torch.linalg.vector_norm(out - target.cpu(), dim=1)
    return MonteCarlo(draws=draws, variance=variance, variance_se=float(centred.std()) / np.sqrt(draws),
                      bias_norm=float((mean - target.cpu()).norm()), noise_norm=float(np.sqrt(variance / draws)),
                      target_norm=float(target.norm()), mse=float((errors**2).mean()), errors=errors.numpy())


def exact_moments(strategy: Strategy, state: State, ctx: ServerContext, updates: torch.Tensor,
                  max_clients: int = 16) -> tuple[torch.Tensor, float]:
    """E[Delta] and E||Delta - E Delta||^2 of `strategy.aggregate` by enumerating all 2^N
    participation sets with their probabilities prod_{i in A} p_i prod_{i not in A} (1 - p_i)
    (small N only). In float64; a reference for Theorem 1 and for `monte_carlo`."""
    n = ctx.num_clients
    if n > max_clients:
        raise ValueError(f"exact enumeration of 2^{n} participation sets is too large (max_clients={max_clients})")
    probs = ctx.probs.double().cpu().tolist()
    mean = torch.zeros(updates.shape[1], dtype=torch.float64)
    second = 0.0
    for mask in itertools.product((False, True), repeat=n):
        prob = float(np.prod([p if m else 1 - p for m, p in zip(mask, probs)]))
        active = torch.tensor([i for i in range(n) if mask[i]], dtype=torch.long, device=updates.device)
        delta = strategy.aggregate(state, ctx, active, updates[active]).double().cpu()
        mean += prob * delta
        second += prob * float(delta @ delta)
    return mean, second - float(mean @ mean)


def aggregation_coefficients(strategy: Strategy, ctx: ServerContext, draws: int, seed: int = 0,
                             state: State | None = None) -> torch.Tensor:
    """The coefficient c_i(A) that a linear, memoryless rule (FedAvg, unbiased FedAvg) gives
    client i's update, for each of `draws` participation draws: the rule applied to the unit
    vectors e_i as updates. Returns (draws, N); E[c_i] = d_i for an unbiased rule."""
    n = ctx.num_clients
    eye = torch.eye(n, dtype=ctx.weights.dtype, device=ctx.weights.device)
    unit_ctx = ServerContext(weights=ctx.weights, probs=ctx.probs, dim=n, device=ctx.device,
                             client_lr=ctx.client_lr, seed=ctx.seed)
    masks = _draw_masks(ctx.probs, draws, seed)
    out = torch.empty(draws, n, dtype=torch.float64)
    st = {} if state is None else state
    for j in range(draws):
        active = torch.from_numpy(np.nonzero(masks[j])[0]).to(eye.device)
        out[j] = strategy.aggregate(st, unit_ctx, active, eye[active]).double().cpu()
    return out


def variance_contributions(grads: torch.Tensor, estimates: torch.Tensor, weights: torch.Tensor,
                           probs: torch.Tensor) -> torch.Tensor:
    """Theorem 1's closed form client by client: d_i^2 (1 - p_i) / p_i ||g_i - g_hat_i||^2 (N,)
    in float64; their sum is `projection.update_variance`."""
    residual_sq = torch.linalg.vector_norm((grads - estimates).double(), dim=1) ** 2
    w, p = weights.double().cpu(), probs.double().cpu()
    return w**2 * (1 - p) / p * residual_sq.cpu()


def estimator_table(estimators: Sequence[tuple[str, Strategy, State, torch.Tensor]], true: torch.Tensor,
                    weights: torch.Tensor, probs: torch.Tensor, true_embedded: torch.Tensor, ctx_embedded: ServerContext,
                    draws: int, seed: int = 0) -> tuple[pd.DataFrame, dict[str, MonteCarlo]]:
    """Theorem 1's closed form against Monte Carlo for estimators of Eq. 4's form.

    Each entry is (name, strategy, state on the span coordinates, estimates g_hat_i in full
    dimension (N, d)). The closed form `projection.update_variance(true, g_hat, d, p)` is
    computed on the full vectors; `monte_carlo` runs the strategy on `true_embedded`.
    Returns a table (estimator, closed_form, mc_variance, mc_variance_se, gap_in_se,
    gap_percent, relative_bias, relative_noise) and the MonteCarlo results by name.
    """
    rows, results = [], {}
    for name, strategy, state, estimates in estimators:
        closed = update_variance(true, estimates, weights, probs)
        mc = monte_carlo(strategy, state, ctx_embedded, true_embedded, draws, seed)
        results[name] = mc
        rows.append({"estimator": name, "closed_form": closed, "mc_variance": mc.variance, "mc_variance_se": mc.variance_se,
                     "gap_in_se": abs(mc.variance - closed) / mc.variance_se,
                     "gap_percent": 100.0 * abs(mc.variance - closed) / closed,
                     "relative_bias": mc.relative_bias, "relative_noise": mc.relative_noise})
    return pd.DataFrame(rows), results


def theorem1_variances(traj: Trajectory) -> dict[str, float]:
    """Theorem 1's closed-form variance (`projection.update_variance`, Eq. 4 with fixed
    estimates) at a FedSteer trajectory's state, for the three estimates the server can hold:
    unbiased FedAvg (g_hat_i = 0), FedVARP (g_hat_i = h_i, the last update client i sent) and
    FedSteer (g_hat_i = Q_t s_i, its cached coordinates on the current basis)."""
    weights, probs = traj.ctx.weights, traj.ctx.probs
    estimates = {"unbiased FedAvg": torch.zeros_like(traj.true), "FedVARP": traj.memory,
                 "FedSteer": traj.strategy.estimates(traj.state, traj.ctx)}
    return {name: update_variance(traj.true, est, weights, probs) for name, est in estimates.items()}


def variance_by_seed(configs: Sequence[RunConfig], rounds: int,
                     known: dict[int, Trajectory] | None = None) -> pd.DataFrame:
    """`theorem1_variances` seed by seed: for each FedSteer config (one per seed), its state after
    the warm-up and `rounds` rounds (`snapshots.trajectory`; a seed in `known` reuses that
    trajectory). One row per seed: the three variances and FedSteer's relative to each of the
    other two (FedSteer / other - 1), whose spread over the seeds is the run-to-run variation."""
    rows = []
    for cfg in configs:
        traj = (known or {}).get(cfg.seed) or trajectory(prepare(cfg), cfg.training, cfg.method, rounds, cfg.seed)
        v = theorem1_variances(traj)
        rows.append({"seed": cfg.seed, **v, "FedSteer vs unbiased FedAvg": v["FedSteer"] / v["unbiased FedAvg"] - 1,
                     "FedSteer vs FedVARP": v["FedSteer"] / v["FedVARP"] - 1})
    return pd.DataFrame(rows)


def variance_verdicts(by_seed: pd.DataFrame, others: Sequence[str] = ("unbiased FedAvg", "FedVARP")) -> pd.DataFrame:
    """Is FedSteer's Theorem 1 variance lower than each of `others`, beyond run-to-run variation?
    `by_seed` is `variance_by_seed`'s table; FedSteer / other - 1 seed by seed is one family of
    paired comparisons (`stats.tested_verdicts`: paired t-test, Holm's adjustment, a verdict only
    from MIN_SEEDS_FOR_VERDICT seeds). One row per other estimator: n, the mean and std of the
    relative difference over the seeds, the Holm-adjusted p, the verdict in words ("lower than",
    "higher than" or "within run-to-run variation of" the other's variance; "not tested against"
    with fewer seeds) and a sentence ending ("text") that states it with its numbers."""
    columns = [f"FedSteer vs {other}" for other in others]
    tests = tested_verdicts([by_seed[c].tolist() for c in columns])
    words = {"FedSteer lower": "lower than", "FedSteer higher": "higher than",
             "no clear difference": "within run-to-run variation of"}
    rows = []
    for other, col, (_, t) in zip(others, columns, tests.iterrows()):
        std = float(by_seed[col].std(ddof=1)) if len(by_seed) > 1 else float("nan")
        word = words.get(t["verdict"], f"not tested against ({t['verdict']})")
        p_text = f", Holm-adjusted p = {readable_value(t['p_holm'])}" if t["p_holm"] == t["p_holm"] else ""
        rows.append({"other": other, "n": int(t["n"]), "mean": t["mean"], "std": std, "p_holm": t["p_holm"],
                     "verdict": word, "text": f"{word} {other}'s (FedSteer / {other} − 1 = "
                                               f"{mean_std_text(t['mean'], std, int(t['n']))}{p_text})"})
    return pd.DataFrame(rows)


def fedsteer_state(spec: MethodSpec, ctx: ServerContext, stale: torch.Tensor) -> tuple[Strategy, State]:
    """FedSteer's server state right after a warm-up of one selection cycle on the snapshot
    `stale` (paper §2.4): core set by greedy swaps (Algorithm 3, from the strategy's seeded
    random start), Q from the core's updates (Eq. 1), every client's s_i by Eq. 3."""
    if spec.name != "fedsteer":
        raise ValueError(f"fedsteer_state needs a fedsteer spec, got {spec.name!r}")
    strategy = make_strategy(spec)
    state = strategy.init_state(ctx)
    strategy.warmup_snapshot(state, ctx, stale.to(ctx.weights.dtype), cycle=0, last=True)
    return strategy, state


def fedvarp_state(ctx: ServerContext, stale: torch.Tensor) -> tuple[Strategy, State]:
    """FedVARP's server state with memory h_i = the snapshot `stale` (the fair-start variant)."""
    strategy = make_strategy(method("fedvarp", warmup_cycles=1))
    state = strategy.init_state(ctx)
    strategy.warmup_snapshot(state, ctx, stale.to(ctx.weights.dtype), cycle=0, last=True)
    return strategy, state


def one_hot_fedsteer(stale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Remark 2: FedVARP as a constrained FedSteer. The core set is every client (X = N),
    Q = [h_i / ||h_i||] (Eq. 1) and the coordinates are one-hot, s_i = ||h_i|| e_i, so that
    Q s_i = h_i. Returns (basis (N, d) as rows, coords (N, N)); clients with h_i = 0 get a zero
    basis row and s_i = 0 (their estimate is 0, as FedVARP's)."""
    norms = torch.linalg.vector_norm(stale, dim=1)
    basis = torch.where(norms[:, None] > 0, stale / norms.clamp_min(1e-30)[:, None], torch.zeros_like(stale))
    return basis, torch.diag(norms)
