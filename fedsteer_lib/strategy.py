"""The server-strategy interface every method implements, FedSteer and the baselines alike.

It sits with the method (not in the simulator) because FedSteer is written against it and
imports go one way only: the simulator drives any `Strategy` without knowing which.

A strategy holds no mutable state of its own. Its memory is an explicit, typed state object
made by `init_state` and passed to every call, so the same strategy can be probed on many
hypothetical rounds. Per round the simulator calls, in this order:

    local_spec(state, i)                       what client i's local training adds (FedProx, SCAFFOLD)
    aggregate(state, ctx, active, updates)     -> Delta_t; pure: never changes the state
    update(state, ctx, active, updates, ...)   refreshes the memory after the server step
    forced_clients(state, ctx, t)              clients whose update at w_t it also wants (not aggregated)
    observe(state, ctx, clients, updates, t)   receives those updates
    record_round(state, tracked)               what to record this round (per tracked client)

and the server step w_{t+1} = w_t - eta_s Delta_t. Before training, `warmup_cycles` cycles
of `warmup_snapshot` (paper §2.4); after it, `record_final`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

__all__ = ["ServerContext", "LocalSpec", "MethodParams", "State", "Strategy", "state_bytes"]

State = Any  # a strategy's memory: a dataclass of tensors (e.g. `FedSteerState`), or None


@dataclass
class ServerContext:
    """What the server knows about the federation."""

    weights: torch.Tensor  # d_i, (N,), float32 on the device
    probs: torch.Tensor  # p_i as the strategy sees them (ones under full participation), (N,)
    dim: int  # d, the length of the flat model vector
    device: torch.device
    client_lr: float
    seed: int = 0
    # What a strategy derived from the warm-up snapshots alone (FedSteer: its greedy core set),
    # keyed by everything it read besides the snapshots. The simulator hands the next run on the
    # same snapshots the same dict, so a deterministic selection is computed once; elsewhere empty.
    snapshot_memo: dict = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return self.weights.shape[0]


@dataclass
class LocalSpec:
    """What the server strategy asks of a client's local training.

    prox_mu: FedProx's proximal weight mu (adds mu * (w - w_t) to every gradient).
    correction: SCAFFOLD's control-variate correction c - c_i (flat, length d), added to
        every gradient.
    """

    prox_mu: float = 0.0
    correction: torch.Tensor | None = None


class MethodParams(Protocol):
    """A method's parameters (`experiments.config.MethodSpec` is one): `get(name)` with defaults."""

    name: str

    def get(self, key: str) -> Any: ...


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a state (a dataclass, a dict or None)."""
    if state is None:
        return 0
    values = state.values() if isinstance(state, dict) else (getattr(state, f.name) for f in dataclasses.fields(state))
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


class Strategy:
    """Base class of the server strategies. Subclasses override `aggregate` and whatever hooks
    they need; every default below is "nothing to do"."""

    name = "base"

    def __init__(self, spec: MethodParams) -> None:
        self.spec = spec

    @property
    def warmup_cycles(self) -> int:
        """Warm-up selection cycles (paper §2.4) run before training; 0: none."""
        return int(self.spec.get("warmup_cycles") or 0)

    def participation_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """The participation probabilities this method trains under (full participation: ones)."""
        return probs

    def init_state(self, ctx: ServerContext) -> Any:
        """The server memory before round 0 (None: the method remembers nothing)."""
        return None

    def local_spec(self, state: Any, client: int) -> LocalSpec | None:
        """What client `client`'s local training adds to plain SGD (None: nothing)."""
        return None

    def aggregate(self, state: Any, ctx: ServerContext, active: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
        """Delta_t from the active clients' ids (m,) and updates (m, d). Must not change `state`."""
        raise NotImplementedError

    def update(self, state: Any, ctx: ServerContext, active: torch.Tensor, updates: torch.Tensor,
               steps: torch.Tensor, round_idx: int) -> None:
        """After the server step: refresh the memory with this round's updates (steps: K per client)."""

    def warmup_snapshot(self, state: Any, ctx: ServerContext, grads: torch.Tensor, cycle: int, last: bool) -> None:
        """Once per warm-up cycle: every client's update (N, d) at the fixed warm-up model. Read
        it, never change it in place: the next run on the same data gets the same tensor
        (`engine.warmup_updates`)."""

    def forced_clients(self, state: Any, ctx: ServerContext, round_idx: int) -> list[int]:
        """Clients whose update at w_t the strategy wants this round besides the active ones.
        They are never aggregated; they cost extra local training, which the run's timing records."""
        return []

    def observe(self, state: Any, ctx: ServerContext, clients: torch.Tensor, updates: torch.Tensor,
                round_idx: int) -> None:
        """Receives, after `update`, the updates at w_t of the `forced_clients` that were not active."""

    def estimates(self, state: Any, ctx: ServerContext) -> torch.Tensor | None:
        """Each client's baseline estimate g_hat_i in Eq. 4's form (N, d), or None if the
        estimator is not of that form. Diagnostics only."""
        return None

    def record_round(self, state: Any, clients: list[int]) -> dict[str, dict[int, list[float]]]:
        """Per-round values to record for the tracked `clients`, by name: {name: {client: vector}}.
        The run keeps them as extras[f"{name}_history"][client] (one vector per round)."""
        return {}

    def record_final(self, state: Any) -> dict[str, Any]:
        """JSON-ready values to keep with the result after the last round (extras)."""
        return {}

    def memory_bytes(self, state: Any) -> int:
        """Bytes of server state (tensors only)."""
        return state_bytes(state)
