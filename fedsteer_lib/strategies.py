"""Server strategies: FedSteer and every baseline of the paper, behind one interface.

A strategy holds no mutable state of its own; the server state is an explicit `dict` of
tensors created by `init_state` and passed to every call. Per round the engine calls

    local_spec(state, i)                      -> what client i's local training adds (FedProx, SCAFFOLD)
    aggregate(state, ctx, active, updates)    -> Delta_t   (pure: does not change the state)
    update(state, ctx, active, updates, ...)  -> refreshes the memory after the aggregation

and the server step w_{t+1} = w_t - eta_s Delta_t. Because `aggregate` is pure, the
diagnostics can evaluate any method's estimator on many hypothetical active sets.
To add a method: subclass `Strategy`, decorate it with `@register("name")` and list its
parameters in `config.METHODS`. The engine does not change.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .config import MethodSpec
from .coreset import SwapTrace, greedy_swap
from .projection import ridge_from_gram, steered_update
from .training import LocalSpec

__all__ = ["ServerContext", "Strategy", "make_strategy", "register", "STRATEGIES", "State"]

State = dict  # name -> tensor (or small python values); everything the server remembers


@dataclass
class ServerContext:
    weights: torch.Tensor  # d_i, (N,), float32 on the device
    probs: torch.Tensor  # p_i as the strategy sees them (ones under full participation), (N,)
    dim: int
    device: torch.device
    client_lr: float
    seed: int = 0

    @property
    def num_clients(self) -> int:
        return self.weights.shape[0]


STRATEGIES: dict[str, Callable[[MethodSpec], "Strategy"]] = {}


def register(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        STRATEGIES[name] = cls
        cls.name = name
        return cls

    return deco


def make_strategy(spec: MethodSpec) -> "Strategy":
    if spec.name not in STRATEGIES:
        raise ValueError(f"no strategy registered for method {spec.name!r}; known: {sorted(STRATEGIES)}")
    return STRATEGIES[spec.name](spec)


class Strategy:
    """Base class: unbiased FedAvg-style aggregation with no memory."""

    name = "base"

    def __init__(self, spec: MethodSpec) -> None:
        self.spec = spec

    @property
    def warmup_cycles(self) -> int:
        """Warm-up selection cycles (paper §2.4) the engine runs before training; 0: none."""
        return int(self.spec.get("warmup_cycles") or 0)

    def participation_probs(self, probs: torch.Tensor) -> torch.Tensor:
        return probs

    def init_state(self, ctx: ServerContext) -> State:
        return {}

    def local_spec(self, state: State, client: int) -> LocalSpec | None:
        return None

    def aggregate(self, state: State, ctx: ServerContext, active: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update(self, state: State, ctx: ServerContext, active: torch.Tensor, updates: torch.Tensor,
               steps: torch.Tensor, round_idx: int) -> None:
        return None

    def warmup_snapshot(self, state: State, ctx: ServerContext, grads: torch.Tensor, cycle: int, last: bool) -> None:
        """Called once per warm-up cycle with every client's update at the fixed model."""
        return None

    def forced_clients(self, state: State, ctx: ServerContext, round_idx: int) -> list[int]:
        """Clients whose update at w_t the strategy wants this round besides the active ones
        (never aggregated; FedSteer's enforced coordinate refresh). Default: none."""
        return []

    def observe(self, state: State, ctx: ServerContext, clients: torch.Tensor, updates: torch.Tensor,
                round_idx: int) -> None:
        """Receives, after `update`, the updates at w_t of the `forced_clients` that were not active."""
        return None

    def estimates(self, state: State, ctx: ServerContext) -> torch.Tensor | None:
        """Each client's baseline estimate g_hat_i in Eq. 4's form (N, d), or None if the
        estimator is not of that form. Diagnostics only."""
        return None

    def memory_bytes(self, state: State) -> int:
        """Bytes of server state (tensors only)."""
        return sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))


def _unbiased_sum(ctx: ServerContext, active: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """sum_{i in A} (d_i / p_i) g_i."""
    return (ctx.weights[active] / ctx.probs[active]) @ updates


def _normalized_mean(ctx: ServerContext, active: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """sum_{i in A} d_i g_i / sum_{i in A} d_i (zero when no client is active)."""
    if active.numel() == 0:
        return torch.zeros(ctx.dim, device=ctx.device)
    w = ctx.weights[active]
    return (w / w.sum()) @ updates


@register("fedavg")
class FedAvg(Strategy):
    """FedAvg as the tables report it: the d-weighted mean of the active clients' updates."""

    def aggregate(self, state, ctx, active, updates):
        return _normalized_mean(ctx, active, updates)


@register("fedavg_unbiased")
class FedAvgUnbiased(Strategy):
    """Unbiased FedAvg: Delta = sum_{i in A} (d_i / p_i) g_i (importance weighting)."""

    def aggregate(self, state, ctx, active, updates):
        return _unbiased_sum(ctx, active, updates)

    def estimates(self, state, ctx):
        return torch.zeros(ctx.num_clients, ctx.dim, device=ctx.device)


@register("full")
class FullParticipation(FedAvgUnbiased):
    """Every client participates every round (p_i = 1): Delta = sum_i d_i g_i. The upper bound."""

    def participation_probs(self, probs):
        return torch.ones_like(probs)


class _Memory(Strategy):
    """Keeps the latest update h_i of every client (O(N d) memory), zero until first seen."""

    def init_state(self, ctx):
        return {"h": torch.zeros(ctx.num_clients, ctx.dim, device=ctx.device)}

    def update(self, state, ctx, active, updates, steps, round_idx):
        state["h"][active] = updates

    def warmup_snapshot(self, state, ctx, grads, cycle, last):
        if last:  # fair-start variant: start from the same warm-up snapshot FedSteer gets
            state["h"].copy_(grads)


@register("fedstale")
class FedStale(_Memory):
    """FedStale: Delta = sum_A (d_i/p_i) g_i + beta (sum_i d_i h_i - sum_A (d_i/p_i) h_i).
    beta = 1 is FedVARP, beta = 0 unbiased FedAvg."""

    beta_default: float | None = None

    @property
    def beta(self) -> float:
        return float(self.spec.get("beta")) if self.beta_default is None else self.beta_default

    def aggregate(self, state, ctx, active, updates):
        h = state["h"]
        stale = ctx.weights @ h - (ctx.weights[active] / ctx.probs[active]) @ h[active]
        return _unbiased_sum(ctx, active, updates) + self.beta * stale

    def estimates(self, state, ctx):
        return self.beta * state["h"]


@register("fedvarp")
class FedVARP(FedStale):
    """FedVARP: Delta = sum_i d_i h_i + sum_A (d_i/p_i) (g_i - h_i) (SAGA-like control variate)."""

    beta_default = 1.0


@register("mifa")
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

    def init_state(self, ctx):
        state = super().init_state(ctx)
        if self.spec.get("start") == "wait_all":
            state["seen"] = torch.zeros(ctx.num_clients, dtype=torch.bool, device=ctx.device)
            state["table_ready"] = False
        return state

    def aggregate(self, state, ctx, active, updates):
        if state.get("table_ready") is False:  # wait_all: still waiting for every client
            return torch.zeros(ctx.dim, device=ctx.device)
        h = state["h"]
        return ctx.weights @ h + ctx.weights[active] @ (updates - h[active])

    def update(self, state, ctx, active, updates, steps, round_idx):
        super().update(state, ctx, active, updates, steps, round_idx)
        if state.get("table_ready") is False:
            state["seen"][active] = True
            if active.numel() == ctx.num_clients:  # everyone was active: the table is already full
                state["table_ready"] = True

    def forced_clients(self, state, ctx, round_idx):
        """wait_all: in the round that completes the set of seen clients, every client's update
        at the (unchanged) model fills the table."""
        if state.get("table_ready") is False and bool(state["seen"].all()):
            return list(range(ctx.num_clients))
        return []

    def observe(self, state, ctx, clients, updates, round_idx):
        state["h"][clients] = updates
        state["table_ready"] = True

    def warmup_snapshot(self, state, ctx, grads, cycle, last):
        super().warmup_snapshot(state, ctx, grads, cycle, last)
        if last and "seen" in state:  # a warm-up snapshot already fills the table
            state["seen"][:] = True
            state["table_ready"] = True


def _weighted(strategy: Strategy, ctx: ServerContext, active: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """The FedAvg-style aggregation a method's `weighting` parameter names: "normalized" (the
    d-weighted mean of the active updates) or "unbiased" (sum_A (d_i/p_i) g_i, not renormalised,
    as in the FedStale code base that the paper's baselines most likely come from)."""
    if strategy.spec.get("weighting") == "unbiased":
        return _unbiased_sum(ctx, active, updates)
    return _normalized_mean(ctx, active, updates)


@register("fedprox")
class FedProx(Strategy):
    """FedProx: FedAvg's aggregation (`weighting`, see `_weighted`); local objective
    + (mu/2) ||w - w_t||^2."""

    def aggregate(self, state, ctx, active, updates):
        return _weighted(self, ctx, active, updates)

    def local_spec(self, state, client):
        return LocalSpec(prox_mu=float(self.spec.get("mu")))


@register("scaffold")
class Scaffold(Strategy):
    """SCAFFOLD with partial participation (Karimireddy et al., 2020, option II).

    Local steps use the gradient + (c - c_i). After the round:
    c_i+ = c_i - c + (w_t - w_i) / (K lr),  c <- c + sum_{i in A} (c_i+ - c_i) / N.
    Aggregation (`weighting`, see `_weighted`): the d-weighted mean of the active updates by
    default, or sum_A (d_i/p_i) g_i; server lr eta_s.
    """

    def init_state(self, ctx):
        return {"c": torch.zeros(ctx.dim, device=ctx.device),
                "c_i": torch.zeros(ctx.num_clients, ctx.dim, device=ctx.device)}

    def local_spec(self, state, client):
        return LocalSpec(correction=state["c"] - state["c_i"][client])

    def aggregate(self, state, ctx, active, updates):
        return _weighted(self, ctx, active, updates)

    def update(self, state, ctx, active, updates, steps, round_idx):
        if active.numel() == 0:
            return
        c, c_i = state["c"], state["c_i"]
        new_ci = c_i[active] - c + updates / (steps.to(updates.dtype)[:, None] * ctx.client_lr)
        c += (new_ci - c_i[active]).sum(0) / ctx.num_clients
        c_i[active] = new_ci


def _inner_products(updates: torch.Tensor, basis: torch.Tensor, with_self: bool = True, chunk: int = 32768):
    """(updates @ basis.T, updates @ updates.T or None) computed over cache-sized blocks of d.

    For d in the millions these skinny products are memory-bound and a plain matmul runs on
    one thread; cutting d into blocks (strided views, no copy) and multiplying them as a batch
    keeps every thread busy: about 2.5x faster than two plain matmuls on a 2-core CPU."""
    d = updates.shape[1]
    blocks, end = d // chunk, (d // chunk) * chunk

    def view(x: torch.Tensor) -> torch.Tensor:  # (rows, d) -> (blocks, rows, chunk), a view
        return x[:, :end].unflatten(1, (blocks, chunk)).transpose(0, 1)

    tail_u = updates[:, end:]
    u = view(updates)
    proj = torch.bmm(u, view(basis).transpose(1, 2)).sum(0).addmm_(tail_u, basis[:, end:].T)
    inner = torch.bmm(u, u.transpose(1, 2)).sum(0).addmm_(tail_u, tail_u.T) if with_self else None
    return proj, inner


def _inverse(norms: torch.Tensor) -> torch.Tensor:
    """1 / ||h|| where the norm is positive, 0 for a zero row (left out of Q)."""
    return torch.where(norms > 0, 1.0 / norms.clamp_min(1e-30), torch.zeros_like(norms))


@register("fedsteer")
class FedSteer(Strategy):
    """FedSteer (paper §2.2-2.4, Algorithm 2): corrective projections with selective caching.

    State: the core set X (k client ids), their cached updates h_j stored as the normalised
    basis Q_t (Eq. 1, rows) plus the norms ||h_j||, the Gram matrix Q_t^T Q_t, every client's
    coordinates s_i (N, k) and the round of its last coordinate refresh. Memory: k d + N k
    floats plus O(k^2 + N).

    ordering="unbiased" (default): round t's Delta uses Q_t and the coordinates as they stood
    before the round, so E[Delta_t] = sum_i d_i g_i. Afterwards the cache takes this round's
    core updates and each active client's s_i is recomputed against the refreshed Q (Eq. 3).
    ordering="as_written": Q already holds this round's core updates and the active clients'
    fresh s_i are used in the same round (biased: g_hat_i depends on A_t).
    refresh_every=R: an active client's s_i is recomputed at most once every R rounds
    (R=1: on every participation; R=5: our main reading of the paper's "enforce=5").
    enforce_every=R (0: off): every R-th round every client, active or not, computes its update
    at w_t and its s_i is recomputed from it (the other reading of "an enforced update every 5
    rounds"); those updates never enter Delta_t, and they cost N - |A| extra local trainings.
    Core members whose cache is still zero are left out of Q until they have an update.
    """

    def init_state(self, ctx):
        k = int(self.spec.get("core_size"))
        gen = np.random.default_rng([ctx.seed, 4])
        core = torch.from_numpy(np.sort(gen.choice(ctx.num_clients, size=k, replace=False)))
        return {
            "core": core.to(ctx.device),
            "basis": torch.zeros(k, ctx.dim, device=ctx.device),  # Q_t as rows (Eq. 1): h_j / ||h_j||
            "core_norms": torch.zeros(k, device=ctx.device),  # ||h_j||, so h_j = norm * basis row
            "gram": torch.zeros(k, k, dtype=torch.float64, device=ctx.device),  # Q_t^T Q_t
            "coords": torch.zeros(ctx.num_clients, k, device=ctx.device),  # s_i
            "last_refresh": torch.full((ctx.num_clients,), -10**9, dtype=torch.long, device=ctx.device),
            "swap_trace": [],
            "round": 0,
        }

    # --- helpers -------------------------------------------------------------------------
    @staticmethod
    def _unit_rows(rows: torch.Tensor) -> torch.Tensor:
        """Eq. 1 row by row; a zero row (no update cached yet) stays zero and is left out of Q."""
        norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
        return torch.where(norms > 0, rows / norms.clamp_min(1e-30), torch.zeros_like(rows))

    def _solve(self, gram: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
        """Eq. 3 against the rows of Q that have an update; coordinates on left-out rows are 0."""
        valid = gram.diagonal() > 0
        out = torch.zeros(rhs.shape[0], gram.shape[0], dtype=torch.float32, device=rhs.device)
        if bool(valid.any()):
            out[:, valid] = ridge_from_gram(gram[valid][:, valid], rhs[:, valid], float(self.spec.get("lam"))).float()
        return out

    def _plan(self, state, active, updates):
        """What this round changes, without changing it: for the active core members (at rows
        `rows` of `updates`, positions `pos` of X) the norms ||h_j|| of Eq. 1, the
        new Gram matrix Q^T Q, and fresh coordinates (Eq. 3) for the active clients that are
        due a refresh. Everything comes from two small products over the active updates,
        Q^T g_i and g_i^T g_l, so no d-sized row is copied: cost O(|A| (k + |A|) d)."""
        basis, gram = state["basis"], state["gram"]
        rows, pos = torch.nonzero(active[:, None] == state["core"][None, :], as_tuple=True)
        due = (state["round"] - state["last_refresh"][active]) >= int(self.spec.get("refresh_every"))
        need_rhs = bool(due.any())
        if not rows.numel() and not need_rhs:
            return pos, rows, None, gram, due, None
        # Q^T g_i (m, k), and g_i^T g_l (m, m) only when a core member's row of Q is replaced
        proj, inner = _inner_products(updates, basis, with_self=bool(rows.numel()))
        new_gram, norms = gram, None
        if rows.numel():
            inner = inner[:, rows]  # against the active core members' updates only
            norms = inner[rows].diagonal().clamp_min(0).sqrt()
            inv = _inverse(norms)  # Eq. 1: row j of Q is h_j / ||h_j||
            cross = proj[rows] * inv[:, None]  # the new rows of Q against the old basis
            cross[:, pos] = inner[rows] * inv[:, None] * inv[None, :]
            new_gram = gram.clone()
            new_gram[pos, :] = cross.double()
            new_gram[:, pos] = cross.T.double()
            proj[:, pos] = inner * inv[None, :]  # Q'^T g_i with the replaced rows patched in
        fresh = self._solve(new_gram, proj[due].double()) if need_rhs else None
        return pos, rows, norms, new_gram, due, fresh

    # --- interface -------------------------------------------------------------------------
    def aggregate(self, state, ctx, active, updates):
        basis, coords = state["basis"], state["coords"]
        if self.spec.get("ordering") == "as_written":  # Q_t and s_i already include this round
            pos, rows, norms, _, due, fresh = self._plan(state, active, updates)
            basis, coords = basis.clone(), coords.clone()
            if rows.numel():
                basis[pos] = updates[rows] * _inverse(norms)[:, None]
            if fresh is not None:
                coords[active[due]] = fresh
        return steered_update(basis, coords, ctx.weights, ctx.probs, active, updates)

    def update(self, state, ctx, active, updates, steps, round_idx):
        pos, rows, norms, new_gram, due, fresh = self._plan(state, active, updates)
        if rows.numel():
            state["core_norms"][pos] = norms
            for p, r, scale in zip(pos.tolist(), rows.tolist(), _inverse(norms).tolist()):  # Eq. 1, in place
                torch.mul(updates[r], scale, out=state["basis"][p])
        state["gram"] = new_gram
        if fresh is not None:
            state["coords"][active[due]] = fresh
            state["last_refresh"][active[due]] = round_idx
        state["round"] = round_idx + 1

    def forced_clients(self, state, ctx, round_idx):
        """enforce_every=R > 0 (the second reading of the paper's "enforce=5", see config):
        every R-th round every client's coordinates are recomputed from its current update."""
        every = int(self.spec.get("enforce_every"))
        return list(range(ctx.num_clients)) if every and (round_idx + 1) % every == 0 else []

    def observe(self, state, ctx, clients, updates, round_idx):
        proj, _ = _inner_products(updates, state["basis"], with_self=False)  # Q^T g_i against the refreshed Q
        state["coords"][clients] = self._solve(state["gram"], proj.double())  # Eq. 3
        state["last_refresh"][clients] = round_idx

    def warmup_snapshot(self, state, ctx, grads, cycle, last):
        k = int(self.spec.get("core_size"))
        lam = float(self.spec.get("lam"))
        if self.spec.get("selection") == "greedy":
            candidates = None
            n_sub = int(self.spec.get("subsample"))
            if n_sub:
                gen = np.random.default_rng([ctx.seed, 4, cycle])
                candidates = sorted(gen.choice(ctx.num_clients, size=n_sub, replace=False).tolist())
            trace = SwapTrace()
            core = greedy_swap(grads, k, ctx.weights, lam, max_swaps=int(self.spec.get("max_swaps")),
                               init=state["core"].tolist(), candidates=candidates, trace=trace)
            state["core"] = torch.tensor(core, dtype=torch.long, device=ctx.device)
            state["swap_trace"].append(list(trace))
        if last:  # keep the caches from the final snapshot (paper §2.4)
            core_grads = grads[state["core"]]
            state["core_norms"] = torch.linalg.vector_norm(core_grads, dim=1)
            state["basis"] = self._unit_rows(core_grads)
            state["gram"] = (state["basis"] @ state["basis"].T).double()
            state["coords"] = self._solve(state["gram"], (grads @ state["basis"].T).double())

    def estimates(self, state, ctx):
        return state["coords"] @ state["basis"]
