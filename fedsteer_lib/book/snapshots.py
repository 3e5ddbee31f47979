"""Snapshots of real client updates, short training trajectories, and exact low-dimensional
coordinates of the updates.

- Snapshots: every client's update g_i = w - w_i^E at one model w (as in the warm-up of §2.4),
  and pairs of snapshots a few FedAvg rounds apart (stale memory h_i and true update g_i).
- Trajectories: a method run as the engine does for a few rounds, with its server state and
  every client's true update at the reached model.
- Exact low-dimensional coordinates: all server rules (Eq. 1-4, FedVARP, FedAvg) only combine
  the given vectors with coefficients that depend on their inner products, so they give the
  same results on any isometric copy of the vectors. `span_embedding` maps a few hundred
  d-dimensional updates to coordinates in their span (d ~ 600,000 -> r <= a few hundred) with
  the same Gram matrix; Monte-Carlo over participation draws then costs microseconds per draw.

Used by chapter 1 (a snapshot at the initial model), chapter 2 (a snapshot pair) and chapter 3
(a FedSteer trajectory). Every vector is a row, as in `projection`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch

from ..experiments.config import MethodSpec, Training, method
from ..simulator.engine import SimData, client_updates
from ..simulator.partition import Federation, participation_schedule, rng
from ..experiments.registry import make_strategy
from ..strategy import ServerContext, State, Strategy

__all__ = ["SNAPSHOT_STREAM", "TRAJECTORY_STREAM", "torch_generator", "snapshot", "fedavg_rounds", "SnapshotPair",
           "snapshot_pair", "Trajectory", "trajectory", "span_embedding", "server_context"]

# Named random streams of the book's measurements (the engine's use 1-8; see partition.rng;
# `aggregation.MC_STREAM` is 22).
SNAPSHOT_STREAM, TRAJECTORY_STREAM = 20, 21


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
        has_basis = hasattr(self.state, "basis")
        if has_basis:
            blocks.append(self.state.basis)
        emb = span_embedding(*blocks)
        changes = {}
        if has_basis:
            changes["basis"] = emb[2]
        if hasattr(self.state, "h"):
            changes["h"] = emb[0].clone()
        state = dataclasses.replace(self.state, **changes)
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


def server_context(federation: Federation, dim: int, client_lr: float = 0.05, seed: int = 0,
                   device: torch.device | str = "cpu", probs: torch.Tensor | None = None) -> ServerContext:
    """The ServerContext the engine builds for this federation (float32 d_i and p_i)."""
    p = federation.probs if probs is None else probs
    return ServerContext(weights=federation.weights.float().to(device), probs=p.float().to(device), dim=dim,
                         device=torch.device(device), client_lr=client_lr, seed=seed)
