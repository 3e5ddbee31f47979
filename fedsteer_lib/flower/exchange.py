"""What the server knows of and says to the nodes: the node table, sampling, the messages and the
checks of replies (`NodeExchange`, the base of every method's Flower strategy, `driver.MethodStrategy`).

Standard messages only. The server sends each sampled node `arrays` (the global model) and
`config` (with `server-round`); the node replies with its trained `arrays` and a `metrics`
record holding `num-examples`. The strategy computes the update g_i = w_t - w_i itself (paper
§2.1) and d_i = n_i / sum_j n_j from the nodes' latest `num-examples`; any PyTorch model works
(`records.Layout`).

Participation (paper §2.1: client i is active with probability p_i). Each training round every
connected node is sampled independently with its own p_i: `fraction_train`, or the
`participation-prob` the node reports. A sampled node that does not reply, or whose reply fails
a check of `replies` (bounded `num-examples`, `participation-prob` and update), is an inactive
client that round: FedSteer keeps its coordinates s_i, FedVARP/FedStale/MIFA its last update
h_i, SCAFFOLD its c_i; the run goes on. The d_i / p_i weights (Eq. 4, FedVARP, FedStale,
unbiased FedAvg) use the *declared* p_i by default: the server itself samples each node with
that p_i, so for nodes that reply when sampled the estimator is exactly unbiased, as in the
paper and the simulator (the engine-equivalence tests compare them bit for bit).
`participation="observed"` uses each node's observed rate instead (successful replies /
training rounds since it joined, floored at `min_participation`): it accounts for nodes that
drop out when sampled, but is estimated from the draws it weights, so it is consistent rather
than exactly unbiased. A node first seen after the start is the paper's unseen client (s_i, h_i,
c_i = 0); a node that leaves stays in the population as an inactive client with its last state.
Nodes are matched by their Flower node id.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any, Callable, ClassVar, Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from ..experiments.registry import METHODS
from ..strategy import ServerContext, Strategy
from .nodes import NodeTable
from .records import Layout
from .replies import Limits, Reply, number, parse_reply

__all__ = ["NodeExchange", "CORRECTION_KEY", "PARTICIPATION_MODES"]

CORRECTION_KEY = "scaffold-correction"  # SCAFFOLD's c - c_i, an ArrayRecord beside the model
PARTICIPATION_MODES = ("declared", "observed")
_CPU = torch.device("cpu")


@dataclass
class _Params:
    """A method's parameters as `fedsteer_lib.strategy.Strategy` reads them (`MethodParams`)."""

    name: str
    values: dict[str, Any]

    def get(self, key: str) -> Any:
        return self.values.get(key)


def _grow(strategy: Strategy, state: Any, ctx: ServerContext, old: int) -> Any:
    """The state of `old` clients grown to ctx.num_clients: every per-client tensor gets the rows
    that `init_state` gives a client that has never been seen; everything else is kept."""
    fresh = strategy.init_state(ctx)
    if state is None or not dataclasses.is_dataclass(state):
        return fresh if state is None else state
    for f in dataclasses.fields(state):
        value, grown = getattr(state, f.name), getattr(fresh, f.name)
        if (isinstance(value, torch.Tensor) and isinstance(grown, torch.Tensor) and value.shape != grown.shape
                and value.shape[0] == old and value.shape[1:] == grown.shape[1:]):
            grown[:old] = value
            setattr(state, f.name, grown)
    return state


class NodeExchange(FlowerFedAvg):
    """The node side of every method's strategy (`driver.MethodStrategy` adds the rounds).

    Flower's `FedAvg` arguments keep their meaning, except that sampling is per node (each
    connected node with its own p_i) rather than a fixed-size draw: `fraction_train` is the
    default p_i (in [min_participation, 1]); `min_train_nodes` is a floor, met by adding nodes
    drawn uniformly when fewer are sampled (0: pure per-node draws); `min_available_nodes` is how
    many nodes must be connected before a round starts. Client-side evaluation is Flower's.
    Our own: `server_lr` (eta_s, finite, > 0), `participation` ("declared", the default, or
    "observed", see the module docstring), `seed` (the sampling draws and FedSteer's random
    initial core set), and the reply checks `max_examples`, `min_participation` and
    `max_update_ratio` (`replies.Limits`). After `start`, `nodes` holds the node table,
    `round_log` what happened in each round and `state` the method's state."""

    method: ClassVar[str] = ""  # the registry's name of the method
    needs_steps: ClassVar[bool] = False  # SCAFFOLD: replies must report num-steps and lr

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, weighted_by_key: str = "num-examples",
                 arrayrecord_key: str = "arrays", configrecord_key: str = "config",
                 train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None, *,
                 server_lr: float = 1.0, participation: str = "declared", seed: int = 0,
                 max_examples: float = Limits.max_examples, min_participation: float = Limits.min_participation,
                 max_update_ratio: float = Limits.max_update_ratio, params: dict[str, Any] | None = None) -> None:
        self.limits = Limits(max_examples, min_participation, max_update_ratio)
        fraction = number(fraction_train)
        if fraction is None or not self.limits.min_participation <= fraction <= 1.0:
            raise ValueError(f"fraction_train must be in [min_participation={self.limits.min_participation:g}, 1] "
                             f"(it is the default participation probability), got {fraction_train!r}")
        lr = number(server_lr)
        if lr is None or not lr > 0:
            raise ValueError(f"server_lr must be a finite number > 0, got {server_lr!r}")
        if participation not in PARTICIPATION_MODES:
            raise ValueError(f"participation must be one of {PARTICIPATION_MODES}, got {participation!r}")
        super().__init__(fraction, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
                         weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn,
                         evaluate_metrics_aggr_fn)
        info = METHODS[self.method]
        values = {**info.defaults, **(params or {})}
        for key, param in info.params.items():  # num_clients-dependent bounds are checked at the start
            if not param.ok(values[key], 10**9):
                raise ValueError(f"{type(self).__name__}: {key} must be {param.allowed}, got {values[key]!r}")
        self.spec = _Params(self.method, values)
        self.core: Strategy = info.strategy(self.spec)
        self.server_lr, self.participation, self.seed = lr, participation, int(seed)
        self._begin(None)

    # --- what the server knows -------------------------------------------------------------
    def _begin(self, initial_arrays: ArrayRecord | None) -> None:
        self.layout = Layout.of(initial_arrays) if initial_arrays is not None else None
        self.fixed = initial_arrays  # the non-floating arrays the server sends unchanged
        self.initial = self.layout.flat(initial_arrays) if initial_arrays is not None else None  # w_0
        self.weights = self.initial  # w_t
        self.nodes = NodeTable()
        self.state: Any = None
        self.rng = np.random.default_rng([self.seed, 17])
        self.round = 0  # server rounds completed
        self.round_log: list[dict[str, Any]] = []
        self._pending: dict[int, int] = {}  # node id -> slot, of the messages in flight
        self._sent: list[tuple[Message, int]] = []  # those messages and their nodes
        self._sent_model = self.initial  # the model they carry
        self._done_before = 0  # rounds a resumed run had done
        self._core_missing = 0  # core-set nodes not connected, when last counted

    @property
    def warmup_rounds(self) -> int:
        """Server rounds of warm-up (paper §2.4) before training; 0: none."""
        return self.core.warmup_cycles

    def _min_nodes_to_start(self) -> int:
        return 1

    def _context(self) -> ServerContext:
        """d_i = n_i / sum_j n_j from the nodes' latest `num-examples` (a node that has not replied
        yet counts with the mean n of those that have); p_i declared (or `fraction_train`) or observed."""
        n = torch.tensor(self.nodes.examples, dtype=torch.float64)
        known = n > 0
        n = torch.where(known, n, n[known].mean() if bool(known.any()) else torch.tensor(1.0, dtype=torch.float64))
        probs = torch.tensor([self._prob(s) for s in range(len(self.nodes))], dtype=torch.float64)
        probs = self.core.participation_probs(probs)
        return ServerContext(weights=(n / n.sum()).float(), probs=probs.float(), dim=self.layout.dim, device=_CPU,
                             client_lr=1.0, seed=self.seed)

    def _declared(self, slot: int) -> float:
        value = self.nodes.declared[slot]
        return self.fraction_train if value is None else value

    def _prob(self, slot: int) -> float:
        observed = self.nodes.observed_rate(slot) if self.participation == "observed" else None
        return self._declared(slot) if observed is None else max(observed, self.limits.min_participation)

    def _connect(self, grid: Grid, server_round: int) -> list[int]:
        """The connected nodes (sorted), after waiting for `min_available_nodes` of them (and, before
        the state exists, for as many as the method needs); new nodes get a slot."""
        need = max(self.min_available_nodes, self._min_nodes_to_start() if self.state is None else 0)
        while len(nodes := sorted(grid.get_node_ids())) < need:
            log(INFO, "Waiting for nodes to connect: %d connected (minimum required: %d).", len(nodes), need)
            time.sleep(1)
        new = [n for n in nodes if self.nodes.slot(n) is None]
        if new:
            old = len(self.nodes)
            for node in new:
                self.nodes.add(node, server_round)
            ctx = self._context()
            if self.state is None:
                self._check_size(len(self.nodes))
                self.state = self.core.init_state(ctx)
            else:
                self.state = _grow(self.core, self.state, ctx, old)
            if server_round > 1:
                log(INFO, "%d node(s) joined in round %d: %d known", len(new), server_round, len(self.nodes))
        self._count_missing_core(nodes, server_round)
        return nodes

    def _count_missing_core(self, connected: list[int], server_round: int) -> None:
        """A WARNING when more of FedSteer's core-set nodes are gone than at the last count (after
        a resume with new node ids: all of them): their cached updates stay in the basis Q_t but
        are no longer refreshed."""
        core = getattr(self.state, "core", None)
        if not isinstance(core, torch.Tensor):
            return
        live = set(connected)
        missing = [self.nodes.ids[s] for s in core.tolist() if self.nodes.ids[s] not in live]
        if len(missing) > self._core_missing:
            log(WARNING, "round %d: %d of %d core-set nodes are not connected (node ids %s)%s; their cached updates "
                "stay in the estimate but are no longer refreshed", server_round, len(missing), core.numel(),
                missing, " since the resume" if self._done_before else "")
        self._core_missing = len(missing)

    def _check_size(self, num_nodes: int) -> None:
        """Parameters bounded by the number of clients, checked against the nodes at the start."""
        for key, param in METHODS[self.method].params.items():
            if not param.ok(self.spec.get(key), num_nodes):
                raise ValueError(f"{type(self).__name__}: {key} must be "
                                 f"{param.allowed.replace('num_clients', f'num_clients={num_nodes}')} with "
                                 f"{num_nodes} nodes connected, got {self.spec.get(key)!r} (or raise "
                                 f"min_available_nodes to wait for more nodes)")

    # --- sampling -----------------------------------------------------------------------------
    def sample(self, server_round: int, nodes: list[int]) -> list[int]:
        """The nodes to train this round: each connected node independently with its own p_i
        (declared, else `fraction_train`), topped up to `min_train_nodes` with nodes drawn
        uniformly from the rest. Override to sample otherwise."""
        probs = [self._declared(self.nodes.slot(n)) for n in nodes]
        chosen = [n for n, u, p in zip(nodes, self.rng.random(len(nodes)), probs) if u < p]
        short = min(self.min_train_nodes, len(nodes)) - len(chosen)
        if short > 0:
            rest = [n for n in nodes if n not in chosen]
            chosen += [int(n) for n in self.rng.choice(rest, size=short, replace=False)]
        return sorted(chosen)

    # --- messages -----------------------------------------------------------------------------
    def _messages(self, nodes: list[int], weights: torch.Tensor, config: ConfigRecord, server_round: int,
                  extra: dict[str, Any], local: bool) -> list[Message]:
        """TRAIN messages: the model `weights` and `config` with `server-round` (plus `extra`);
        with `local`, what the method adds to local training: FedProx's `proximal-mu` in the
        config, SCAFFOLD's correction c - c_i as the ArrayRecord `scaffold-correction`."""
        record = self.layout.record(weights, self.fixed)
        self._pending, self._sent_model = {n: self.nodes.slot(n) for n in nodes}, weights
        out = []
        for node in nodes:
            cfg = ConfigRecord({**dict(config), "server-round": server_round, **extra})
            content = RecordDict({self.arrayrecord_key: record, self.configrecord_key: cfg})
            spec = self.core.local_spec(self.state, self._pending[node]) if local else None
            if spec is not None and spec.prox_mu:
                cfg["proximal-mu"] = float(spec.prox_mu)
            if spec is not None and spec.correction is not None:
                content[CORRECTION_KEY] = self.layout.record(spec.correction, None)
            out.append(Message(content, dst_node_id=node, message_type=MessageType.TRAIN))
        self._sent = list(zip(out, nodes))
        return out

    def _parse(self, content: RecordDict) -> tuple[str | None, Reply | None]:
        try:
            return parse_reply(content, self.layout, self._sent_model, self.limits, arrays_key=self.arrayrecord_key,
                               examples_key=self.weighted_by_key, needs_steps=self.needs_steps)
        except Exception as err:  # noqa: BLE001 - no reply, however odd, ends the run
            return f"unusable reply ({type(err).__name__}: {err})", None

    def _read(self, server_round: int, replies: Iterable[Message], phase: str) -> dict[int, Reply]:
        """The usable replies to the messages in flight, by slot; the rest are logged as failed."""
        good: dict[int, Reply] = {}
        failed: dict[int, str] = {}
        by_id = {m.metadata.message_id: node for m, node in self._sent if m.metadata.message_id}
        for msg in replies:  # the SuperLink's own error replies (node unavailable) come from the SuperLink
            node = by_id.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)
            if node not in self._pending or self._pending[node] in good:
                continue
            if msg.has_error():
                failed[node] = f"error: {msg.error.reason}"
                continue
            why, reply = self._parse(msg.content)
            if why is not None:
                failed[node] = why
                continue
            slot = self._pending[node]
            good[slot] = reply
            self.nodes.examples[slot] = reply.examples
            if reply.prob is not None:
                self.nodes.declared[slot] = reply.prob
        answered = {self.nodes.ids[s] for s in good}
        for node in self._pending:
            if node not in answered and node not in failed:
                failed[node] = "no reply"
        for node, why in failed.items():
            log(WARNING, "round %d: node %d is inactive (%s)", server_round, node, why)
        self.round_log.append({"round": server_round, "phase": phase, "sent": sorted(self._pending),
                               "replied": sorted(answered), "failed": failed})
        self._pending, self._sent = {}, []
        return good
