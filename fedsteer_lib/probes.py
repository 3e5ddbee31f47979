"""Measurements behind the book's chapters 1-3, on the FL system, on snapshots of real client
updates and on the probe rows of diagnostics runs.

- The FL system (paper §2.1, §4.1): label histograms of the two data groups, the group table,
  and the staleness (rounds since the last participation) each client suffers.
- Snapshots: every client's update g_i = w - w_i^E at one model w (as in the warm-up of §2.4),
  and pairs of snapshots a few FedAvg rounds apart (stale memory h_i and true update g_i).
- Exact low-dimensional coordinates: all server rules (Eq. 1-4, FedVARP, FedAvg) only combine
  the given vectors with coefficients that depend on their inner products, so they give the
  same results on any isometric copy of the vectors. `span_embedding` maps a few hundred
  d-dimensional updates to coordinates in their span (d ~ 600,000 -> r <= a few hundred) with
  the same Gram matrix; Monte-Carlo over participation draws then costs microseconds per draw.
- Monte-Carlo of an aggregation rule over Bernoulli(p_i) participation draws (variance,
  bias), to be compared with Theorem 1's closed form (`projection.update_variance`).
- Reconstruction errors ||g - Q s||^2 / ||g||^2 (Eq. 1-3), a toy 3-D picture of steering, and
  the alignment cos(h_i, g_i) vs cos(Q_t s_i, g_i) as a function of staleness from probe rows.

Every vector is a row, as in `projection`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from .config import FLSystem, MethodSpec, Training, method
from .coreset import greedy_swap
from .engine import SimData, client_updates
from .partition import Federation, build_federation, participation_schedule, rng, staleness
from .projection import normalized_basis, reconstruct, ridge_coordinates
from .strategies import ServerContext, State, Strategy, make_strategy

__all__ = [
    "GROUPS", "group_labels", "group_table", "label_histograms", "staleness_table", "expected_staleness",
    "staleness_summary", "group_weights", "estimator_table", "load_probe_table", "alignment_verdict",
    "torch_generator", "snapshot", "fedavg_rounds", "SnapshotPair", "snapshot_pair", "Trajectory", "trajectory",
    "span_embedding", "server_context", "MonteCarlo", "monte_carlo", "exact_moments", "aggregation_coefficients",
    "variance_contributions", "fedsteer_state", "fedvarp_state", "one_hot_fedsteer",
    "relative_error", "cosine", "reconstruction_study", "rotation", "toy_ridge_table", "toy_rotation_study",
    "client_groups", "probe_table", "staleness_bins", "alignment_by_staleness",
]

# Named random streams of this module (the engine's use 1-8; see partition.rng).
SNAPSHOT_STREAM, TRAJECTORY_STREAM, MC_STREAM = 20, 21, 22

GROUPS = ("weak/common", "weak/rare", "powerful/common", "powerful/rare")


# --------------------------------------------------------------------------------------------
# The FL system (paper §2.1, §4.1)
# --------------------------------------------------------------------------------------------
def group_labels(federation: Federation) -> np.ndarray:
    """Each client's group name, one of GROUPS: system group (weak p=0.04 / powerful p=0.16)
    '/' data group (common-label / rare-label)."""
    weak = federation.is_weak.numpy()
    common = federation.is_common.numpy()
    return np.array([f"{'weak' if w else 'powerful'}/{'common' if c else 'rare'}" for w, c in zip(weak, common)])


def group_table(federation: Federation) -> pd.DataFrame:
    """One row per group (weak/powerful x common/rare): number of clients, data points per
    client |D_i|, participation probability p_i, weight d_i of one client and of the group
    (sum of d_i), and the expected staleness 1/p_i of a client."""
    groups = group_labels(federation)
    sizes = federation.sizes.numpy()
    probs = federation.probs.numpy()
    weights = federation.weights.numpy()
    rows = []
    for g in GROUPS:
        m = groups == g
        if not m.any():
            continue
        rows.append({"group": g, "clients": int(m.sum()), "points_per_client": int(sizes[m][0]),
                     "p_i": float(probs[m][0]), "d_i": float(weights[m][0]), "group_weight": float(weights[m].sum()),
                     "expected_staleness": float(1.0 / probs[m][0])})
    return pd.DataFrame(rows)


def label_histograms(labels: torch.Tensor, num_classes: int, gammas: Iterable[float], seed: int = 0,
                     system: FLSystem | None = None) -> pd.DataFrame:
    """Label counts of the common-label and rare-label groups for each gamma (paper §4.1).

    Returns a tidy table: gamma, group ('common'/'rare'), label, count (points of that label
    in the group), clients (clients in the group), points_per_client.
    """
    base = system or FLSystem()
    rows = []
    for gamma in gammas:
        sys_g = replace(base, gamma=float(gamma))
        fed = build_federation(sys_g, labels, num_classes, seed)
        for group, mask in (("common", fed.is_common), ("rare", ~fed.is_common)):
            ids = torch.nonzero(mask).flatten().tolist()
            pts = torch.cat([fed.client_indices[i] for i in ids])
            counts = torch.bincount(labels[pts], minlength=num_classes)
            for label in range(num_classes):
                rows.append({"gamma": float(gamma), "group": group, "label": label, "count": int(counts[label]),
                             "clients": len(ids), "points_per_client": len(fed.client_indices[ids[0]])})
    return pd.DataFrame(rows)


def staleness_table(federation: Federation, rounds: int, seeds: Iterable[int]) -> pd.DataFrame:
    """Staleness of every client at the start of every round (`partition.staleness`: rounds
    since its last participation, t + 1 if it never participated), for the participation
    schedules of `seeds` (Bernoulli(p_i) draws, paper §2.1).

    Columns: seed, round, client, group, p, staleness, never (no participation yet).
    """
    groups = group_labels(federation)
    probs = federation.probs.numpy()
    frames = []
    for seed in seeds:
        sched = participation_schedule(federation.probs, rounds, seed)
        st = staleness(sched).numpy()
        t_idx, c_idx = np.meshgrid(np.arange(rounds), np.arange(federation.num_clients), indexing="ij")
        frames.append(pd.DataFrame({"seed": seed, "round": t_idx.ravel(), "client": c_idx.ravel(),
                                    "group": groups[c_idx.ravel()], "p": probs[c_idx.ravel()],
                                    "staleness": st.ravel(), "never": st.ravel() == t_idx.ravel() + 1}))
    return pd.concat(frames, ignore_index=True)


def expected_staleness(p: float | np.ndarray, t: int | np.ndarray) -> float | np.ndarray:
    """E[staleness at the start of round t] for Bernoulli(p) participation, with the
    convention of `partition.staleness` (t + 1 if never seen in rounds 0..t-1):

        E[S_t] = sum_{s=1}^{t+1} P(S_t >= s) = sum_{s=1}^{t+1} (1-p)^{s-1} = (1 - (1-p)^{t+1}) / p,

    which tends to 1/p (the mean of a geometric distribution) as t grows.
    """
    p = np.asarray(p, dtype=float)
    t = np.asarray(t, dtype=float)
    out = (1.0 - (1.0 - p) ** (t + 1.0)) / p
    return float(out) if out.ndim == 0 else out


def staleness_summary(table: pd.DataFrame, round_: int) -> pd.DataFrame:
    """Per group, the staleness at the start of round `round_` over the clients and schedules
    of `staleness_table`: p, mean, its standard error, the share that never participated,
    E[S_t] (`expected_staleness`) and the stationary value 1/p."""
    at = table[table["round"] == round_]
    out = at.groupby("group").agg(p=("p", "first"), mean_staleness=("staleness", "mean"),
                                  se=("staleness", lambda v: v.std(ddof=1) / np.sqrt(len(v))),
                                  never_participated=("never", "mean")).reset_index()
    out["expected_E[S_t]"] = expected_staleness(out["p"].to_numpy(), round_)
    out["1/p"] = 1.0 / out["p"]
    return out


def group_weights(federation: Federation, per_client: dict[str, np.ndarray | torch.Tensor]) -> pd.DataFrame:
    """Sum over each client group of per-client values (e.g. d_i, or the mean coefficient
    E[c_i(A)] an aggregation rule gives client i). Columns: group, rule (the dict key), weight."""
    groups = group_labels(federation)
    rows = []
    for rule, values in per_client.items():
        v = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values, dtype=float)
        for g in GROUPS:
            rows.append({"group": g, "rule": rule, "weight": float(v[groups == g].sum())})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Snapshots of real client updates
# --------------------------------------------------------------------------------------------
def torch_generator(seed: int, stream: int) -> torch.Generator:
    """A seeded torch generator for (seed, stream), independent of the engine's streams."""
    return torch.Generator().manual_seed(int(rng(seed, stream).integers(2**62)))


def snapshot(sim: SimData, training: Training, weights: torch.Tensor, seed: int,
             clients: Sequence[int] | None = None) -> torch.Tensor:
    """Every client's (or `clients`') update g_i = w - w_i^E after E local epochs from the
    same model w (paper §2.1), as the warm-up of §2.4 collects it. Returns (m, d)."""
    ids = list(range(sim.federation.num_clients)) if clients is None else list(clients)
    updates, _, _ = client_updates(sim, training, weights, ids, torch_generator(seed, SNAPSHOT_STREAM))
    return updates


def fedavg_rounds(sim: SimData, training: Training, rounds: int, seed: int, weights: torch.Tensor | None = None,
                  method_name: str = "fedavg") -> tuple[torch.Tensor, torch.Tensor]:
    """Train the global model for `rounds` rounds of a memoryless rule (default FedAvg, the
    normalised mean of the active updates) with Bernoulli(p_i) participation (the run's
    schedule for `seed`), starting from `weights` (default: the initial model).

    Returns (the final weights (d,), the participation schedule (rounds, N)).
    """
    strategy = make_strategy(method(method_name))
    w = (sim.initial_weights if weights is None else weights).clone()
    ctx = server_context(sim.federation, w.shape[0], training.client_lr, seed, device=w.device)
    probs = strategy.participation_probs(sim.federation.probs)
    schedule = participation_schedule(probs, rounds, seed)
    gen = torch_generator(seed, TRAJECTORY_STREAM)
    for t in range(rounds):
        ids = torch.nonzero(schedule[t]).flatten().tolist()
        updates, _, _ = client_updates(sim, training, w, ids, gen)
        delta = strategy.aggregate({}, ctx, torch.tensor(ids, dtype=torch.long, device=w.device), updates)
        w = w - training.server_lr * delta
    return w, schedule


@dataclass
class SnapshotPair:
    """Two snapshots of all N clients' updates, `rounds` FedAvg rounds apart.

    stale: (N, d) updates at w_0 (the initial model), playing the stale memory h_i.
    true: (N, d) updates at w_t, the current updates g_i that the server would need.
    """

    stale: torch.Tensor
    true: torch.Tensor
    rounds: int
    schedule: torch.Tensor


def snapshot_pair(sim: SimData, training: Training, rounds: int, seed: int) -> SnapshotPair:
    """Snapshot at the initial model w_0, `rounds` FedAvg rounds, snapshot at w_t."""
    stale = snapshot(sim, training, sim.initial_weights, seed)
    w_t, schedule = fedavg_rounds(sim, training, rounds, seed)
    true = snapshot(sim, training, w_t, seed + 1)
    return SnapshotPair(stale=stale, true=true, rounds=rounds, schedule=schedule)


@dataclass
class Trajectory:
    """The server state of a method after a warm-up snapshot at w_0 and `rounds` training rounds,
    with every client's true update at the reached model w_t.

    memory: (N, d) the last update each client sent (h_i of §2.1; the warm-up snapshot for
    clients not seen since). true: (N, d) the updates g_i at w_t. staleness: (N,) rounds since
    h_i was computed (rounds + 1 for the warm-up snapshot, taken 'at round -1').
    """

    strategy: Strategy
    state: State
    ctx: ServerContext
    memory: torch.Tensor
    true: torch.Tensor
    staleness: torch.Tensor
    rounds: int

    def embedded(self) -> tuple[State, torch.Tensor, torch.Tensor]:
        """(state, memory, true) in exact span coordinates (`span_embedding` of memory, true
        and, for FedSteer, the basis rows of Q_t); the state's tensors of dimension d are
        replaced by their coordinates, everything else is shared."""
        blocks = [self.memory, self.true]
        has_basis = "basis" in self.state
        if has_basis:
            blocks.append(self.state["basis"])
        emb = span_embedding(*blocks)
        state = dict(self.state)
        if has_basis:
            state["basis"] = emb[2]
        if "h" in state:
            state["h"] = emb[0].clone()
        return state, emb[0], emb[1]

    def context(self, dim: int) -> ServerContext:
        """The same server context with another vector dimension (for embedded vectors)."""
        c = self.ctx
        return ServerContext(weights=c.weights, probs=c.probs, dim=dim, device=c.device, client_lr=c.client_lr, seed=c.seed)


def trajectory(sim: SimData, training: Training, spec: MethodSpec, rounds: int, seed: int) -> Trajectory:
    """Run a method as the engine does, with one warm-up selection cycle at the initial model
    w_0 (paper §2.4; for FedSteer: core set and caches from that snapshot, for FedVARP/MIFA
    with warm-up: memory from it), then `rounds` rounds with Bernoulli(p_i) participation (the
    run's schedule for `seed`), then take every client's true update at the reached w_t."""
    fed = sim.federation
    strategy = make_strategy(spec)
    w = sim.initial_weights.clone()
    ctx = server_context(fed, w.shape[0], training.client_lr, seed, device=w.device,
                         probs=strategy.participation_probs(fed.probs))
    state = strategy.init_state(ctx)
    warm = snapshot(sim, training, w, seed)
    if strategy.warmup_cycles:
        strategy.warmup_snapshot(state, ctx, warm, cycle=0, last=True)
    memory = warm.clone()
    last_seen = torch.full((fed.num_clients,), -1, dtype=torch.long)
    schedule = participation_schedule(ctx.probs, rounds, seed)
    gen = torch_generator(seed, TRAJECTORY_STREAM)
    for t in range(rounds):
        ids = torch.nonzero(schedule[t]).flatten().tolist()
        updates, steps, _ = client_updates(sim, training, w, ids, gen, strategy, state)
        active = torch.tensor(ids, dtype=torch.long, device=w.device)
        w = w - training.server_lr * strategy.aggregate(state, ctx, active, updates)
        strategy.update(state, ctx, active, updates, steps, t)
        memory[active] = updates
        last_seen[ids] = t
    true = snapshot(sim, training, w, seed + 1)
    return Trajectory(strategy=strategy, state=state, ctx=ctx, memory=memory, true=true,
                      staleness=rounds - last_seen, rounds=rounds)


# --------------------------------------------------------------------------------------------
# Exact low-dimensional coordinates
# --------------------------------------------------------------------------------------------
def span_embedding(*blocks: torch.Tensor, chunk: int = 32768, rtol: float = 1e-12,
                   dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Isometric coordinates of the rows of `blocks` in their joint span.

    With V the stacked rows (M, d), the Gram matrix K = V V^T is formed in float64 (in column
    chunks of d) and factored as K = E diag(lam) E^T; the rows of C = E diag(sqrt(lam)) (M, r),
    keeping eigenvalues above rtol * max, satisfy C C^T = K. So every inner product, norm,
    projection (Eq. 1-3) and linear combination (Eq. 4) among the rows is the same in the r
    coordinates as in R^d. Returns the coordinates of each block, in the order given.
    """
    if not blocks:
        raise ValueError("span_embedding needs at least one block of vectors")
    dims = {b.shape[1] for b in blocks}
    if len(dims) != 1:
        raise ValueError(f"all blocks must have the same dimension, got {sorted(dims)}")
    d = dims.pop()
    sizes = [b.shape[0] for b in blocks]
    m = sum(sizes)
    gram = torch.zeros(m, m, dtype=torch.float64)
    for start in range(0, d, chunk):
        x = torch.cat([b[:, start:start + chunk].detach().cpu().double() for b in blocks])
        gram += x @ x.T
    evals, evecs = torch.linalg.eigh(gram)
    top = float(evals.max()) if m else 0.0
    keep = evals > rtol * max(top, 1e-300)
    coords = (evecs[:, keep] * evals[keep].sqrt()).to(dtype)
    return list(torch.split(coords, sizes))


# --------------------------------------------------------------------------------------------
# Monte-Carlo of an aggregation rule over participation draws (Theorem 1's randomness)
# --------------------------------------------------------------------------------------------
def server_context(federation: Federation, dim: int, client_lr: float = 0.05, seed: int = 0,
                   device: torch.device | str = "cpu", probs: torch.Tensor | None = None) -> ServerContext:
    """The ServerContext the engine builds for this federation (float32 d_i and p_i)."""
    p = federation.probs if probs is None else probs
    return ServerContext(weights=federation.weights.float().to(device), probs=p.float().to(device), dim=dim,
                         device=torch.device(device), client_lr=client_lr, seed=seed)


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
    from .projection import update_variance

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


# --------------------------------------------------------------------------------------------
# Reconstruction from the subspace (Eq. 1-3)
# --------------------------------------------------------------------------------------------
def relative_error(grads: torch.Tensor, estimates: torch.Tensor) -> torch.Tensor:
    """||g_i - g_hat_i||^2 / ||g_i||^2 per row (float64): 0 is perfect, 1 is what the zero
    estimate (unbiased FedAvg) gets. It is client i's factor in Theorem 1's variance."""
    num = torch.linalg.vector_norm((grads - estimates).double(), dim=1) ** 2
    den = torch.linalg.vector_norm(grads.double(), dim=1) ** 2
    return num / den.clamp_min(1e-300)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity in float64 (0 where a row is zero)."""
    a, b = a.double(), b.double()
    den = torch.linalg.vector_norm(a, dim=1) * torch.linalg.vector_norm(b, dim=1)
    return (a * b).sum(1) / den.clamp_min(1e-300)


def reconstruction_study(stale: torch.Tensor, true: torch.Tensor, weights: torch.Tensor,
                         core_sizes: Iterable[int], lams: Iterable[float], max_swaps: int = 5,
                         seed: int = 0, groups: Sequence[str] | None = None) -> pd.DataFrame:
    """How well the subspace represents real client updates, for each core size k and lambda.

    For each (k, lambda): the core set X is chosen by Algorithm 3 on the `stale` snapshot
    (greedy swaps minimising J(X)), Q_0 = Eq. 1 on the core's stale updates, s_i = Eq. 3 of the
    stale h_i against Q_0. Then, per client i, the relative error ||g - g_hat||^2 / ||g||^2 and
    the cosine cos(g_hat, g) of:

    - 'in-sample': g = h_i, g_hat = Q_0 s_i (the fit when the coordinates are computed);
    - 'steered': g = the true update g_i at w_t, g_hat = Q_t s_i, with Q_t from the core's *true*
      updates (every core member refreshed) and the old coordinates s_i (FedSteer's reuse);
    - 'fresh': g = g_i, g_hat = Q_t s_i* with s_i* = Eq. 3 of g_i against Q_t (the best the
      subspace can do at w_t, the Theorem-1 optimum for lambda = 0);
    - 'stale': g = g_i, g_hat = h_i (FedVARP/MIFA's reuse; independent of k and lambda).

    Returns a tidy table: k, lam, client, group, kind, rel_error, cos, norm_ratio
    (||g_hat|| / ||g||) and J (the objective of the chosen core after the swaps).
    """
    n = stale.shape[0]
    groups = np.asarray(groups) if groups is not None else np.array([""] * n)
    rows = []

    def add(k, lam, kind, g, est, j_value):
        re, co = relative_error(g, est).numpy(), cosine(est, g).numpy()
        ratio = (torch.linalg.vector_norm(est.double(), dim=1) / torch.linalg.vector_norm(g.double(), dim=1).clamp_min(1e-300)).numpy()
        for i in range(n):
            rows.append({"k": k, "lam": lam, "client": i, "group": groups[i], "kind": kind,
                         "rel_error": float(re[i]), "cos": float(co[i]), "norm_ratio": float(ratio[i]), "J": j_value})

    for k, lam in itertools.product(core_sizes, lams):
        trace: list[float] = []
        core = greedy_swap(stale, int(k), weights, float(lam), max_swaps=max_swaps, seed=seed, trace=trace)
        q0 = normalized_basis(stale[core])
        s = ridge_coordinates(q0, stale, float(lam))
        qt = normalized_basis(true[core])
        fresh = ridge_coordinates(qt, true, float(lam))
        add(k, lam, "in-sample", stale, reconstruct(q0, s), trace[-1])
        add(k, lam, "steered", true, reconstruct(qt, s), trace[-1])
        add(k, lam, "fresh", true, reconstruct(qt, fresh), trace[-1])
        add(k, lam, "stale", true, stale, trace[-1])
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# A toy 3-D picture (chapter 2)
# --------------------------------------------------------------------------------------------
def rotation(axis: Sequence[float], angle: float) -> torch.Tensor:
    """The 3x3 rotation by `angle` (radians) about `axis` (Rodrigues' formula), float64."""
    a = torch.tensor(axis, dtype=torch.float64)
    a = a / a.norm()
    k = torch.tensor([[0.0, -a[2], a[1]], [a[2], 0.0, -a[0]], [-a[1], a[0], 0.0]], dtype=torch.float64)
    return torch.eye(3, dtype=torch.float64) + np.sin(angle) * k + (1 - np.cos(angle)) * (k @ k)


def toy_ridge_table(core: torch.Tensor, grad: torch.Tensor, lams: Iterable[float]) -> pd.DataFrame:
    """Eq. 1-3 on one client gradient `grad` (d,) and core vectors `core` (k, d): per lambda the
    coordinates s, the reconstruction Q s, ||g - Q s||^2, ||s||^2 and cos(Q s, g)."""
    q = normalized_basis(core.double())
    rows = []
    for lam in lams:
        s = ridge_coordinates(q, grad.double()[None, :], float(lam))[0]
        rec = reconstruct(q, s[None, :])[0]
        rows.append({"lam": float(lam), **{f"s{j + 1}": float(v) for j, v in enumerate(s)},
                     "Qs": tuple(round(float(v), 6) for v in rec),
                     "residual_sq": float(((grad.double() - rec) ** 2).sum()), "s_norm_sq": float((s**2).sum()),
                     "cos": float(cosine(rec[None], grad.double()[None])[0])})
    return pd.DataFrame(rows)


def toy_rotation_study(core: torch.Tensor, grad: torch.Tensor, axis: Sequence[float], angles: Iterable[float],
                       lam: float) -> pd.DataFrame:
    """The subspace turns between round t and t+k: the core vectors become R h_j (R = rotation
    by `angle` about `axis`). The client's coordinates s_i are computed at round t (Eq. 3) and
    reused: g_hat = Q_{t+k} s_i; its stale update is h_i = g (its gradient at round t).

    Two scenarios for the client's true gradient at t+k: 'moves with the core' (g' = R g: the
    premise of FedSteer) and 'stays put' (g' = g: the core turns for reasons unrelated to this
    client). Returns: scenario, angle_deg, cos_stale = cos(h_i, g'), cos_steered = cos(Q_{t+k} s_i, g').
    """
    q0 = normalized_basis(core.double())
    g = grad.double()
    s = ridge_coordinates(q0, g[None, :], float(lam))
    rows = []
    for angle in angles:
        r = rotation(axis, float(angle))
        qk = normalized_basis(core.double() @ r.T)
        steered = reconstruct(qk, s)[0]
        for scenario, g_new in (("moves with the core", r @ g), ("stays put", g)):
            rows.append({"scenario": scenario, "angle_deg": float(np.degrees(angle)),
                         "cos_stale": float(cosine(g[None], g_new[None])[0]),
                         "cos_steered": float(cosine(steered[None], g_new[None])[0])})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Probe rows of diagnostics runs (engine._probe)
# --------------------------------------------------------------------------------------------
def client_groups(system: FLSystem, labels: torch.Tensor, num_classes: int, seed: int) -> pd.DataFrame:
    """The partition of a run (same system and seed): client, group, weak, common, p, d."""
    fed = build_federation(system, labels, num_classes, seed)
    return pd.DataFrame({"client": np.arange(fed.num_clients), "group": group_labels(fed),
                         "weak": fed.is_weak.numpy(), "common": fed.is_common.numpy(),
                         "p": fed.probs.numpy(), "d": fed.weights.numpy()})


def probe_table(payload: dict[str, Any], groups: pd.DataFrame | None = None) -> pd.DataFrame:
    """The per-client probe rows of a stored run (`results.load_run`): round, client,
    staleness (-1: not seen since the warm-up), cos_stale = cos(h_i, g_i), cos_estimate =
    cos(method's estimate, g_i), true_norm; plus gamma, seed, and the client's group columns
    when `groups` (from `client_groups`) is given."""
    probes = payload.get("extras", {}).get("probes")
    if not probes:
        raise ValueError("this run has no probe rows; run it with Diagnostics(probe_every > 0)")
    table = pd.DataFrame([r for r in probes if r["client"] >= 0])
    cfg = payload["config"]
    table["gamma"] = cfg["system"]["gamma"]
    table["seed"] = cfg["seed"]
    if groups is not None:
        table = table.merge(groups, on="client", how="left")
    return table


def staleness_bins(staleness_values: Iterable[int] | np.ndarray, edges: Sequence[int] = (1, 2, 3, 5, 9, 17, 33, 65)) -> pd.Categorical:
    """Bin labels for staleness values: '1', '2', '3-4', '5-8', ..., '>=65' (edges are the
    lower ends); values below edges[0] become NaN."""
    labels = []
    for lo, hi in zip(edges, list(edges[1:]) + [None]):
        labels.append(f">={lo}" if hi is None else (str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}"))
    values = np.asarray(list(staleness_values), dtype=float)
    idx = np.searchsorted(np.asarray(edges, dtype=float), values, side="right") - 1
    out = [labels[i] if (i >= 0 and not np.isnan(v)) else None for i, v in zip(idx, values)]
    return pd.Categorical(out, categories=labels, ordered=True)


def alignment_by_staleness(table: pd.DataFrame, by: Sequence[str] = (),
                           edges: Sequence[int] = (1, 2, 3, 5, 9, 17, 33, 65)) -> pd.DataFrame:
    """Mean +- standard error of cos_stale, cos_estimate and their paired difference
    (cos_estimate - cos_stale) per staleness bin (and per the columns `by`), over the probe rows
    where both are defined (the client has participated since the warm-up).

    Columns: *by, bin, measure ('stale h_i', 'steered Q_t s_i', 'difference'), mean, se, n.
    """
    t = table[(table["staleness"] >= 1) & table["cos_stale"].notna() & table["cos_estimate"].notna()].copy()
    t["bin"] = staleness_bins(t["staleness"], edges)
    t["difference"] = t["cos_estimate"] - t["cos_stale"]
    rows = []
    keys = list(by) + ["bin"]
    for key, g in t.groupby(keys, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        for col, name in (("cos_stale", "stale h_i"), ("cos_estimate", "steered Q_t s_i"), ("difference", "difference")):
            v = g[col].to_numpy(dtype=float)
            se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
            rows.append({**dict(zip(keys, key)), "measure": name, "mean": float(v.mean()), "se": se, "n": len(v)})
    out = pd.DataFrame(rows)
    if not out.empty:
        out["bin"] = pd.Categorical(out["bin"], categories=t["bin"].cat.categories, ordered=True)
        out = out.sort_values(keys + ["measure"]).reset_index(drop=True)
    return out


def load_probe_table(configs: Iterable[Any], root: Any, labels: torch.Tensor, num_classes: int) -> pd.DataFrame:
    """`probe_table` of every stored run in `configs` (RunConfigs, results cache `root`),
    with each run's client groups (`client_groups`), concatenated."""
    from .results import load_run

    frames = []
    for c in configs:
        groups = client_groups(c.system, labels, num_classes, c.seed)
        frames.append(probe_table(load_run(c, root), groups))
    return pd.concat(frames, ignore_index=True)


def alignment_verdict(table: pd.DataFrame, z: float = 2.0) -> dict[str, Any]:
    """The paired comparison of cos(Q_t s_i, g_i) and cos(h_i, g_i) over the probe rows where
    both are defined: mean difference, its standard error (rows treated as independent), n,
    and a verdict ('steered better', 'stale better' or 'no significant difference' at
    |mean| > z * se)."""
    paired = table[(table["staleness"] >= 1) & table["cos_stale"].notna() & table["cos_estimate"].notna()]
    diff = (paired["cos_estimate"] - paired["cos_stale"]).to_numpy(dtype=float)
    n = len(diff)
    if n < 2:
        return {"mean": float("nan"), "se": float("nan"), "n": n, "verdict": "too few paired rows"}
    mean, se = float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(n))
    verdict = "steered better" if mean > z * se else ("stale better" if mean < -z * se else "no significant difference")
    return {"mean": mean, "se": se, "n": n, "verdict": verdict}
