"""The baselines of the paper's Table 1, each a `Strategy` (see `fedsteer_lib.strategy`).

FedAvg (normalised and unbiased), full participation, FedVARP, FedStale, MIFA, FedProx and
SCAFFOLD. Their parameters, validation and names are registered in
`fedsteer_lib.experiments.registry`; nothing else needs to know them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..strategy import LocalSpec, ServerContext, Strategy

__all__ = ["FedAvg", "FedAvgUnbiased", "FullParticipation", "MemoryState", "FedStale", "FedVARP", "MifaState",
           "MIFA", "FedProx", "ScaffoldState", "Scaffold", "unbiased_sum", "normalized_mean"]


def unbiased_sum(ctx: ServerContext, active: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """sum_{i in A} (d_i / p_i) g_i."""
    return (ctx.weights[active] / ctx.probs[active]) @ updates


def normalized_mean(ctx: ServerContext, active: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """sum_{i in A} d_i g_i / sum_{i in A} d_i (zero when no client is active)."""
    if active.numel() == 0:
        return torch.zeros(ctx.dim, device=ctx.device)
    w = ctx.weights[active]
    return (w / w.sum()) @ updates


def _weighted(strategy: Strategy, ctx: ServerContext, active: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """The FedAvg-style aggregation a method's `weighting` parameter names: "normalized" (the
    d-weighted mean of the active updates) or "unbiased" (sum_A (d_i/p_i) g_i, not renormalised,
    as in the FedStale code base that the paper's baselines most likely come from)."""
    if strategy.spec.get("weighting") == "unbiased":
        return unbiased_sum(ctx, active, updates)
    return normalized_mean(ctx, active, updates)


class FedAvg(Strategy):
    """FedAvg as the tables report it: the d-weighted mean of the active clients' updates."""

    def aggregate(self, state, ctx, active, updates):
        return normalized_mean(ctx, active, updates)


class FedAvgUnbiased(Strategy):
    """Unbiased FedAvg: Delta = sum_{i in A} (d_i / p_i) g_i (importance weighting)."""

    def aggregate(self, state, ctx, active, updates):
        return unbiased_sum(ctx, active, updates)

    def estimates(self, state, ctx):
        return torch.zeros(ctx.num_clients, ctx.dim, device=ctx.device)


class FullParticipation(FedAvgUnbiased):
    """Every client participates every round (p_i = 1): Delta = sum_i d_i g_i. The upper bound."""

    def participation_probs(self, probs):
        return torch.ones_like(probs)


@dataclass
class MemoryState:
    """The latest update h_i of every client (N, d): O(N d) memory, zero until first seen."""

    h: torch.Tensor


class _Memory(Strategy):
    def init_state(self, ctx) -> MemoryState:
        return MemoryState(h=torch.zeros(ctx.num_clients, ctx.dim, device=ctx.device))

    def update(self, state, ctx, active, updates, steps, round_idx):
        state.h[active] = updates

    def warmup_snapshot(self, state, ctx, grads, cycle, last):
        if last:  # fair-start variant: start from the same warm-up snapshot FedSteer gets
            state.h.copy_(grads)


class FedStale(_Memory):
    """FedStale: Delta = sum_A (d_i/p_i) g_i + beta (sum_i d_i h_i - sum_A (d_i/p_i) h_i).
    beta = 1 is FedVARP, beta = 0 unbiased FedAvg."""

    beta_default: float | None = None

    @property
    def beta(self) -> float:
        return float(self.spec.get("beta")) if self.beta_default is None else self.beta_default

    def aggregate(self, state, ctx, active, updates):
        h = state.h
        stale = ctx.weights @ h - (ctx.weights[active] / ctx.probs[active]) @ h[active]
        return unbiased_sum(ctx, active, updates) + self.beta * stale

    def estimates(self, state, ctx):
        return self.beta * state.h


class FedVARP(FedStale):
    """FedVARP: Delta = sum_i d_i h_i + sum_A (d_i/p_i) (g_i - h_i) (SAGA-like control variate)."""

    beta_default = 1.0


@dataclass
class MifaState(MemoryState):
    """MIFA's table h plus, for start="wait_all", who has been seen and whether the table is full."""

    seen: torch.Tensor | None = None  # (N,) bool; None for start="zero"
    table_ready: bool = True


class MIFA(_Memory):
    """MIFA: Delta = sum_i d_i h_i after refreshing h_i <- g_i for the active clients.

    start="zero" (default; MIFA's `fdu_no_wait.py`): the table starts at zero, so a client
    never seen yet contributes h_i = 0.
    start="wait_all" (MIFA's own run script `fdu.py`): no server step (Delta = 0) until every
    client has been active at least once; in the round that completes the set, every client's
    update at the current model fills the table (N - |A_t| extra local trainings, through the
    `forced_clients` hook), and plain MIFA steps from the next round on. The waiting rounds
    count against the round budget, as in `fdu.py`.
    """

    def init_state(self, ctx) -> MifaState:
        state = MifaState(h=torch.zeros(ctx.num_clients, ctx.dim, device=ctx.device))
        if self.spec.get("start") == "wait_all":
            state.seen = torch.zeros(ctx.num_clients, dtype=torch.bool, device=ctx.device)
            state.table_ready = False
        return state

    def aggregate(self, state, ctx, active, updates):
        if not state.table_ready:  # wait_all: still waiting for every client
            return torch.zeros(ctx.dim, device=ctx.device)
        h = state.h
        return ctx.weights @ h + ctx.weights[active] @ (updates - h[active])

    def update(self, state, ctx, active, updates, steps, round_idx):
        super().update(state, ctx, active, updates, steps, round_idx)
        if not state.table_ready:
            state.seen[active] = True
            if active.numel() == ctx.num_clients:  # everyone was active: the table is already full
                state.table_ready = True

    def forced_clients(self, state, ctx, round_idx):
        """wait_all: in the round that completes the set of seen clients, every client's update
        at the (unchanged) model fills the table."""
        if not state.table_ready and bool(state.seen.all()):
            return list(range(ctx.num_clients))
        return []

    def observe(self, state, ctx, clients, updates, round_idx):
        state.h[clients] = updates
        state.table_ready = True

    def warmup_snapshot(self, state, ctx, grads, cycle, last):
        super().warmup_snapshot(state, ctx, grads, cycle, last)
        if last and state.seen is not None:  # a warm-up snapshot already fills the table
            state.seen[:] = True
            state.table_ready = True


class FedProx(Strategy):
    """FedProx: FedAvg's aggregation (`weighting`, see `_weighted`); local objective
    + (mu/2) ||w - w_t||^2."""

    def aggregate(self, state, ctx, active, updates):
        return _weighted(self, ctx, active, updates)

    def local_spec(self, state, client):
        return LocalSpec(prox_mu=float(self.spec.get("mu")))


@dataclass
class ScaffoldState:
    c: torch.Tensor  # the server control variate (d,)
    c_i: torch.Tensor  # every client's control variate (N, d)


class Scaffold(Strategy):
    """SCAFFOLD with partial participation (Karimireddy et al., 2020, option II).

    Local steps use the gradient + (c - c_i). After the round:
    c_i+ = c_i - c + (w_t - w_i) / (K lr),  c <- c + sum_{i in A} (c_i+ - c_i) / N.
    Aggregation (`weighting`, see `_weighted`): the d-weighted mean of the active updates by
    default, or sum_A (d_i/p_i) g_i; server lr eta_s.
    """

    def init_state(self, ctx) -> ScaffoldState:
        return ScaffoldState(c=torch.zeros(ctx.dim, device=ctx.device),
                             c_i=torch.zeros(ctx.num_clients, ctx.dim, device=ctx.device))

    def local_spec(self, state, client):
        return LocalSpec(correction=state.c - state.c_i[client])

    def aggregate(self, state, ctx, active, updates):
        return _weighted(self, ctx, active, updates)

    def update(self, state, ctx, active, updates, steps, round_idx):
        if active.numel() == 0:
            return
        c, c_i = state.c, state.c_i
        new_ci = c_i[active] - c + updates / (steps.to(updates.dtype)[:, None] * ctx.client_lr)
        c += (new_ci - c_i[active]).sum(0) / ctx.num_clients
        c_i[active] = new_ci
