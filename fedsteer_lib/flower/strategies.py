"""Every method of the book as a Flower strategy (flwr 1.42, Message API), used like Flower's `FedAvg`.

    strategy = FedSteer(fraction_train=0.2, core_size=10)     # instead of FedAvg(fraction_train=0.2)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=50)

Standard messages only. The server sends each sampled node `arrays` (the global model) and
`config` (with `server-round`); the node replies with its trained `arrays` and a `metrics`
record holding `num-examples` (the key `weighted_by_key` names). The strategy computes the
update g_i = w_t - w_i itself (paper §2.1), and d_i = n_i / sum_j n_j from the nodes' latest
`num-examples`; any PyTorch model works (`records.Layout`). The server arithmetic is the
simulator's: each class drives the same `fedsteer_lib.strategy.Strategy` (`aggregate`,
`update`, the warm-up's `warmup_snapshot`, ...) that `simulator.engine` drives, named in the
one method registry (`experiments.registry.METHODS`), and steps w_{t+1} = w_t - eta_s Delta_t.

Participation (paper §2.1: client i is active with probability p_i). Each training round every
connected node is sampled independently with its own p_i: `fraction_train` by default, or the
`participation-prob` a node reports in its reply metrics (a ClientApp forwards it from its node
config). A node that is sampled but does not reply (its ClientApp raised, it timed out, it left)
or replies with something unusable (other arrays, no `num-examples`, a non-finite value) is an
*inactive* client that round: FedSteer keeps its cached coordinates s_i, FedVARP/FedStale/MIFA
its last update h_i, SCAFFOLD its c_i; the run goes on. `participation="observed"` uses each
node's observed rate, successful replies / training rounds since it joined, in place of p_i in
the d_i / p_i weights (Eq. 4, FedVARP, FedStale, unbiased FedAvg). With declared p_i the
estimator is unbiased only if a sampled node always replies (a node that drops out half the time
is weighted as if it never did); the observed rate accounts for drop-outs, but it is estimated
from the same draws it weights, so it is consistent (as rounds grow) rather than exactly unbiased.
Nodes may join late: a node first seen after the start starts as the paper's unseen client (s_i = 0,
h_i = 0, c_i = 0) and d_i is renormalised when it first reports `num-examples`. A node that leaves
stays in the population as an inactive client with its last state.

Warm-up (paper §2.4, FedSteer; FedVARP and MIFA as a fair start): the first `warmup_rounds`
server rounds hold the warm-up model w^(c) fixed and send it to every connected node that has not
answered in cycle c yet. When every connected node has answered, the cycle is complete:
`warmup_snapshot` runs the core-set search on the gradients (N, d) and the warm-up model steps
with every node, w^(c+1) = w^(c) - eta_s sum_i d_i g_i^(c). After the last warm-up round the core
set and the caches come from what the strategy has (rows of nodes that did not answer in the last
cycle are zero: those nodes start training as unseen clients), `warmup_report` says how many
nodes it saw, and training starts from the initial model. With every node answering, warm-up
round c + 1 is cycle c: the simulator's warm-up, cycle for cycle.

State (`start(checkpoint_path=..., checkpoint_every=K, resume_from=...)`): the method's state
(core set, cached core-set gradients, coordinates, memories, control variates), the nodes' sizes,
declared and observed rates, the sampling generator, the round, the models and the results so
far are written atomically every K rounds and when `start` ends (normally or by an exception
between rounds); `resume_from` continues from such a file, so a restarted ServerApp ends with the
model an uninterrupted one would have (given the same replies). Nodes are matched by their Flower
node id, which a SuperNode keeps as long as it stays connected to the SuperLink.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import Result

from .. import numerics
from ..experiments.registry import METHODS
from ..strategy import ServerContext, Strategy
from .records import Layout, load_checkpoint, save_checkpoint

__all__ = ["MethodStrategy", "FedSteer", "FedAvg", "FedAvgUnbiased", "FedVARP", "FedStale", "MIFA", "Scaffold",
           "FedProx", "STRATEGIES", "NodeTable", "CORRECTION_KEY", "PARTICIPATION_KEY"]

CORRECTION_KEY = "scaffold-correction"  # SCAFFOLD's c - c_i, an ArrayRecord beside the model
PARTICIPATION_KEY = "participation-prob"  # a node's p_i, in its reply metrics
PARTICIPATION_MODES = ("declared", "observed")
_CPU = torch.device("cpu")


def _default(method: str, key: str) -> Any:
    """A method parameter's default, from the one registry."""
    return METHODS[method].params[key].default


@dataclass
class _Params:
    """A method's parameters as `fedsteer_lib.strategy.Strategy` reads them (`MethodParams`)."""

    name: str
    values: dict[str, Any]

    def get(self, key: str) -> Any:
        return self.values.get(key)


@dataclass
class NodeTable:
    """What the server knows of each node, by slot (the client index i of the method's state).

    ids: the Flower node id of each slot; examples: its latest `num-examples` (0 before its first
    reply); declared: its latest `participation-prob` (None: none reported); joined: the server
    round it was first seen; rounds: training rounds since it joined; sampled / replied: training
    rounds in which it was sampled / replied usefully."""

    ids: list[int] = field(default_factory=list)
    examples: list[float] = field(default_factory=list)
    declared: list[float | None] = field(default_factory=list)
    joined: list[int] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)
    replied: list[int] = field(default_factory=list)
    index: dict[int, int] = field(default_factory=dict)  # node id -> slot

    def __len__(self) -> int:
        return len(self.ids)

    def slot(self, node_id: int) -> int | None:
        return self.index.get(node_id)

    def add(self, node_id: int, server_round: int) -> int:
        for name, value in (("ids", node_id), ("examples", 0.0), ("declared", None), ("joined", server_round),
                            ("rounds", 0), ("sampled", 0), ("replied", 0)):
            getattr(self, name).append(value)
        self.index[node_id] = len(self.ids) - 1
        return len(self.ids) - 1

    def observed_rate(self, slot: int) -> float | None:
        """Successful training replies / training rounds since the node joined (None before its first)."""
        return self.replied[slot] / self.rounds[slot] if self.replied[slot] else None


@dataclass
class _Reply:
    weights: torch.Tensor  # w_i, flat
    examples: float  # n_i
    prob: float | None  # its participation-prob, if reported
    steps: float  # K_i * lr_i (SCAFFOLD), else 0
    metrics: dict[str, Any]


@contextlib.contextmanager
def _server_kernels() -> Iterator[None]:
    """The simulator's kernels around the server arithmetic (`numerics.kernels_for_run`: pinned
    kernels, one thread), so that a Flower run computes the engine's bits. If torch computed in
    this process before `fedsteer_lib` was imported, the pin cannot hold: the strategy says so
    once and computes with torch's own kernels (the same arithmetic; the last bits may differ)."""
    try:
        numerics.check_kernels("cpu")
    except numerics.NumericsError as err:
        if not _server_kernels.warned:
            log(WARNING, "fedsteer_lib.flower: %s; computing with torch's own kernels", err)
            _server_kernels.warned = True
        yield
        return
    with numerics.kernels_for_run("cpu"):
        yield


_server_kernels.warned = False


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


class MethodStrategy(FlowerFedAvg):
    """The driver every method class shares; a `flwr.serverapp.strategy.Strategy`.

    Flower's `FedAvg` arguments keep their meaning, except that sampling is per node (each
    connected node with its own p_i) rather than a fixed-size draw: `fraction_train` is the
    default p_i (in (0, 1]); `min_train_nodes` is a floor, met by adding nodes drawn uniformly
    when fewer are sampled (set it to 0 for pure per-node draws: a floor raises the small
    nodes' real probability above p_i); `min_available_nodes` is how many nodes must be
    connected before a round starts. Client-side evaluation (`fraction_evaluate`, ...) is
    Flower's. Our own: `server_lr` (eta_s), `participation` ("declared" or "observed", see the
    module docstring), `seed` (the sampling draws and FedSteer's random initial core set).
    After `start`, `nodes` holds the node table, `round_log` what happened in each round and
    `state` the method's state.
    """

    method: ClassVar[str] = ""  # the registry's name of the method
    needs_steps: ClassVar[bool] = False  # SCAFFOLD: replies must report num-steps and lr

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, weighted_by_key: str = "num-examples",
                 arrayrecord_key: str = "arrays", configrecord_key: str = "config",
                 train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None, *,
                 server_lr: float = 1.0, participation: str = "declared", seed: int = 0,
                 params: dict[str, Any] | None = None) -> None:
        if not 0.0 < fraction_train <= 1.0:
            raise ValueError(f"fraction_train must be in (0, 1] (it is the default participation probability), "
                             f"got {fraction_train}")
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        if participation not in PARTICIPATION_MODES:
            raise ValueError(f"participation must be one of {PARTICIPATION_MODES}, got {participation!r}")
        super().__init__(fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
                         weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn,
                         evaluate_metrics_aggr_fn)
        info = METHODS[self.method]
        values = {**info.defaults, **(params or {})}
        for key, param in info.params.items():  # num_clients-dependent bounds are checked at the start
            if not param.ok(values[key], 10**9):
                raise ValueError(f"{type(self).__name__}: {key} must be {param.allowed}, got {values[key]!r}")
        self.spec = _Params(self.method, values)
        self.core: Strategy = info.strategy(self.spec)
        self.server_lr, self.participation, self.seed = float(server_lr), participation, int(seed)
        self._begin(None)

    # --- the run's memory -------------------------------------------------------------------
    def _begin(self, initial_arrays: ArrayRecord | None) -> None:
        self.layout = Layout.of(initial_arrays) if initial_arrays is not None else None
        self.fixed = initial_arrays  # the non-floating arrays the server sends unchanged
        self.initial = self.layout.flat(initial_arrays) if initial_arrays is not None else None  # w_0
        self.weights = self.initial  # w_t
        self.nodes = NodeTable()
        self.state: Any = None
        self.rng = np.random.default_rng([self.seed, 17])
        self.round = 0  # server rounds completed
        self.cycle, self.warm, self.cycle_rows = 0, self.initial, {}  # warm-up: cycle, w^(c), {slot: g_i^(c)}
        self.warmup_report: dict[str, Any] | None = None
        self.round_log: list[dict[str, Any]] = []
        self.result = Result()
        self._pending: dict[int, int] = {}  # node id -> slot, of the messages in flight
        self._sent: list[tuple[Message, int]] = []  # those messages and their nodes
        self._expected: list[int] = []  # warm-up: the slots that make the cycle complete
        self._grid: Grid | None = None
        self._config = ConfigRecord()  # this round's train config
        self._timeout: float | None = None

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
        known = n > 0  # a node that has not reported num-examples yet counts with the mean of those that have
        n = torch.where(known, n, n[known].mean() if bool(known.any()) else torch.tensor(1.0, dtype=torch.float64))
        weights = n / n.sum()
        probs = torch.tensor([self._prob(s) for s in range(len(self.nodes))], dtype=torch.float64)
        probs = self.core.participation_probs(probs)
        return ServerContext(weights=weights.float(), probs=probs.float(), dim=self.layout.dim, device=_CPU,
                             client_lr=1.0, seed=self.seed)

    def _declared(self, slot: int) -> float:
        value = self.nodes.declared[slot]
        return self.fraction_train if value is None else value

    def _prob(self, slot: int) -> float:
        observed = self.nodes.observed_rate(slot) if self.participation == "observed" else None
        return self._declared(slot) if observed is None else observed

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
        return nodes

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
        self._pending = {n: self.nodes.slot(n) for n in nodes}
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

    def _parse(self, content: RecordDict) -> tuple[str | None, _Reply | None]:
        """A reply's model and metrics, or why it cannot be used."""
        arrays = content.array_records
        record = arrays.get(self.arrayrecord_key) or (next(iter(arrays.values())) if len(arrays) == 1 else None)
        if record is None:
            return f"no ArrayRecord {self.arrayrecord_key!r}", None
        if (why := self.layout.mismatch(record)) is not None:
            return why, None
        metrics = next(iter(content.metric_records.values()), None)
        if metrics is None or not isinstance(metrics.get(self.weighted_by_key), (int, float)):
            return f"no metric {self.weighted_by_key!r}", None
        examples = float(metrics[self.weighted_by_key])
        prob = metrics.get(PARTICIPATION_KEY)
        if not examples > 0 or (prob is not None and not (isinstance(prob, (int, float)) and 0 < prob <= 1)):
            return f"{self.weighted_by_key}={examples} or {PARTICIPATION_KEY}={prob!r} out of range", None
        steps = 0.0
        if self.needs_steps:
            if not all(isinstance(metrics.get(k), (int, float)) and metrics[k] > 0 for k in ("num-steps", "lr")):
                return f"{type(self).__name__} needs the metrics 'num-steps' and 'lr' (positive)", None
            steps = float(torch.tensor(float(metrics["num-steps"])) * torch.tensor(float(metrics["lr"])))
        weights = self.layout.flat(record)
        if not bool(torch.isfinite(weights).all()):
            return "non-finite model", None
        return None, _Reply(weights, examples, None if prob is None else float(prob), steps, dict(metrics))

    def _read(self, server_round: int, replies: Iterable[Message], phase: str) -> dict[int, _Reply]:
        """The usable replies to the messages in flight, by slot; the rest are logged as failed."""
        good: dict[int, _Reply] = {}
        failed: dict[int, str] = {}
        by_id = {m.metadata.message_id: node for m, node in self._sent if m.metadata.message_id}
        for msg in replies:  # the SuperLink's own error replies (node unavailable) come from the SuperLink
            node = by_id.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)
            if node not in self._pending:
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

    # --- Flower's hooks ---------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Warm-up rounds: w^(c) to every connected node that has not answered in cycle c.
        Training rounds: w_t to the sampled nodes (`sample`), with the method's local terms."""
        if self.layout is None:
            self._begin(arrays)
        self._grid, self._config = grid, config
        nodes = self._connect(grid, server_round)
        if server_round <= self.warmup_rounds:
            self._expected = [self.nodes.slot(n) for n in nodes]
            due = [n for n in nodes if self.nodes.slot(n) not in self.cycle_rows]
            return self._messages(due, self.warm, config, server_round, {"warmup-cycle": self.cycle}, local=False)
        chosen = self.sample(server_round, nodes)
        for slot in range(len(self.nodes)):
            self.nodes.rounds[slot] += 1
        for node in chosen:
            self.nodes.sampled[self.nodes.slot(node)] += 1
        log(INFO, "configure_train: sampled %d nodes (out of %d)", len(chosen), len(nodes))
        return self._messages(chosen, self.weights, config, server_round, {}, local=True)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Warm-up rounds: collect the cycle's gradients (see the module docstring). Training
        rounds: Delta_t from the method's `aggregate` over the nodes that replied (Eq. 4 for
        FedSteer), w_{t+1} = w_t - eta_s Delta_t, then the method's `update` and, if it asks for
        them (`forced_clients`), the updates at w_t of more nodes for its `observe`."""
        replies = list(replies)
        if server_round <= self.warmup_rounds:
            return self._warmup_round(server_round, replies)
        t = server_round - self.warmup_rounds - 1  # the method's 0-based training round
        good = self._read(server_round, replies, "train")
        sent, slots = len(self.round_log[-1]["sent"]), sorted(good)
        for slot in slots:
            self.nodes.replied[slot] += 1
        ctx = self._context()
        updates = (torch.stack([self.weights - good[s].weights for s in slots]) if slots
                   else torch.zeros(0, ctx.dim))
        steps = torch.tensor([good[s].steps for s in slots], dtype=torch.float32)
        active = torch.tensor(slots, dtype=torch.long)
        with _server_kernels():
            delta = self.core.aggregate(self.state, ctx, active, updates)
            if not bool(torch.isfinite(delta).all()):
                raise FloatingPointError(f"round {server_round}: the aggregate is not finite")
            new_weights = self.weights - self.server_lr * delta
            self.core.update(self.state, ctx, active, updates, steps, t)
            self._forced(server_round, t, ctx, slots)
        self.weights = new_weights
        metrics = self._train_metrics([good[s] for s in slots])
        metrics.update({"num-sampled": sent, "num-active": len(slots),
                        "update-norm": float(delta.norm())})
        return self.layout.record(new_weights, self.fixed), MetricRecord(metrics)

    def _train_metrics(self, replies: list[_Reply]) -> dict[str, Any]:
        """The replies' metrics, aggregated by `train_metrics_aggr_fn` (Flower's weighted mean by
        default) where they have the same keys; {} otherwise."""
        if not replies or any(set(r.metrics) != set(replies[0].metrics) for r in replies):
            return {}
        records = [RecordDict({"metrics": MetricRecord(r.metrics)}) for r in replies]
        try:
            return dict(self.train_metrics_aggr_fn(records, self.weighted_by_key))
        except (TypeError, ValueError, KeyError):
            return {}

    def _forced(self, server_round: int, t: int, ctx: ServerContext, active: list[int]) -> None:
        """The updates at w_t of the nodes the method wants besides the active ones (MIFA's
        wait_all start, FedSteer's enforce_every): never aggregated, passed to `observe`."""
        wanted = sorted(set(self.core.forced_clients(self.state, ctx, t)) - set(active))
        connected = set(self._grid.get_node_ids())
        nodes = [self.nodes.ids[s] for s in wanted if self.nodes.ids[s] in connected]
        if not nodes:
            return
        messages = self._messages(nodes, self.weights, self._config, server_round, {"forced-update": True}, local=True)
        good = self._read(server_round, self._grid.send_and_receive(messages, timeout=self._timeout), "forced")
        if good:
            slots = sorted(good)
            updates = torch.stack([self.weights - good[s].weights for s in slots])
            self.core.observe(self.state, ctx, torch.tensor(slots, dtype=torch.long), updates, t)

    def _warmup_round(self, server_round: int, replies: list[Message]) -> tuple[ArrayRecord, MetricRecord]:
        for slot, reply in self._read(server_round, replies, "warmup").items():
            self.cycle_rows[slot] = self.warm - reply.weights
        last = server_round == self.warmup_rounds
        complete = all(s in self.cycle_rows for s in self._expected)
        metrics = {"warmup-cycle": self.cycle, "warmup-answered": len(self.cycle_rows),
                   "warmup-connected": len(self._expected)}
        if complete or last:
            ctx = self._context()
            grads = torch.zeros(len(self.nodes), ctx.dim)
            for slot, row in self.cycle_rows.items():
                grads[slot] = row
            with _server_kernels():
                self.core.warmup_snapshot(self.state, ctx, grads, self.cycle, last=last)
                if not last:  # the next cycle's model: a step with every node (paper §2.4)
                    self.warm = self.warm - self.server_lr * (ctx.weights @ grads)
            if last:
                self.warmup_report = {"cycles": self.cycle + 1, "last_cycle_complete": complete,
                                      "nodes_answered_last_cycle": len(self.cycle_rows), "nodes_known": len(self.nodes),
                                      "nodes_answered_ever": sum(1 for n in self.nodes.examples if n > 0)}
                log(INFO, "%s warm-up: %d cycle(s), the last %s (%d of %d known nodes answered)", type(self).__name__,
                    self.cycle + 1, "complete" if complete else "incomplete", len(self.cycle_rows), len(self.nodes))
            self.cycle, self.cycle_rows = self.cycle + 1, {}
        return self.layout.record(self.initial, self.fixed), MetricRecord(metrics)  # training starts from w_0

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Flower's client-side evaluation, after training rounds only (the warm-up keeps w_0)."""
        if server_round <= self.warmup_rounds:
            return []
        return super().configure_evaluate(server_round, arrays, config, grid)

    def summary(self) -> None:
        log(INFO, "\t├──> %s (%s): %s", type(self).__name__, self.method,
            ", ".join(f"{k}={v}" for k, v in sorted(self.spec.values.items())) or "no parameters")
        log(INFO, "\t├──> server_lr=%s, participation=%s, seed=%d", self.server_lr, self.participation, self.seed)
        super().summary()

    # --- the loop, with checkpoints ------------------------------------------------------------
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None, *,
              checkpoint_path: str | Path | None = None, checkpoint_every: int = 1,
              resume_from: str | Path | None = None) -> Result:
        """Flower's `Strategy.start` (the same arguments and `Result`), plus the state on disk:
        with `checkpoint_path`, the strategy's state is written there atomically every
        `checkpoint_every` rounds and when `start` ends; `resume_from` continues the run of
        such a file (`initial_arrays` must then hold the same model layout). The warm-up's
        rounds are the first `warmup_rounds` of `num_rounds`; neither `evaluate_fn` nor the
        client-side evaluation runs during them (the model stays w_0)."""
        log(INFO, "Starting %s strategy:", type(self).__name__)
        self.summary()
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        self._begin(initial_arrays)
        if resume_from is not None:
            self._restore(load_checkpoint(resume_from), initial_arrays)
            log(INFO, "Resumed from %s after round %d", resume_from, self.round)
        self._timeout = timeout
        arrays = self.layout.record(self.weights, self.fixed)
        t_start = time.time()
        if evaluate_fn and self.round == 0:
            res = evaluate_fn(0, arrays)
            if res is not None:
                self.result.evaluate_metrics_serverapp[0] = res
        in_round = False
        try:
            for server_round in range(self.round + 1, num_rounds + 1):
                log(INFO, "")
                log(INFO, "[ROUND %s/%s]%s", server_round, num_rounds,
                    " warm-up" if server_round <= self.warmup_rounds else "")
                in_round = True
                replies = grid.send_and_receive(self.configure_train(server_round, arrays, train_config, grid),
                                                timeout=timeout)
                new_arrays, metrics = self.aggregate_train(server_round, replies)
                arrays = new_arrays if new_arrays is not None else arrays
                self.result.arrays = arrays
                if metrics is not None:
                    self.result.train_metrics_clientapp[server_round] = metrics
                if server_round > self.warmup_rounds:
                    self._evaluate(server_round, arrays, evaluate_config, evaluate_fn, grid, timeout)
                self.round, in_round = server_round, False
                if checkpoint_path is not None and server_round % checkpoint_every == 0:
                    self.save(checkpoint_path)
        finally:
            if checkpoint_path is not None and not in_round and self.layout is not None:
                self.save(checkpoint_path)  # on exit; a round cut short leaves the last round's file
        log(INFO, "Strategy execution finished in %.2fs", time.time() - t_start)
        return self.result

    def _evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                  evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None, grid: Grid,
                  timeout: float) -> None:
        replies = grid.send_and_receive(self.configure_evaluate(server_round, arrays, config, grid), timeout=timeout)
        metrics = self.aggregate_evaluate(server_round, replies)
        if metrics is not None:
            self.result.evaluate_metrics_clientapp[server_round] = metrics
        if evaluate_fn:
            res = evaluate_fn(server_round, arrays)
            if res is not None:
                self.result.evaluate_metrics_serverapp[server_round] = res

    # --- checkpoints ---------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        return {"strategy": type(self).__name__, "method": self.method, "params": dict(self.spec.values),
                "server_lr": self.server_lr, "participation": self.participation, "seed": self.seed,
                "fraction_train": self.fraction_train, "min_train_nodes": self.min_train_nodes}

    def save(self, path: str | Path) -> None:
        """Write the strategy's state after `self.round` rounds to `path`, atomically."""
        result = {name: {r: dict(m) for r, m in getattr(self.result, name).items()}
                  for name in ("train_metrics_clientapp", "evaluate_metrics_clientapp", "evaluate_metrics_serverapp")}
        save_checkpoint(path, {
            "format": 1, "identity": self._identity(), "round": self.round, "layout": self.layout,
            "fixed": {k: self.fixed[k].numpy() for k in self.fixed.keys()}, "initial": self.initial,
            "weights": self.weights, "nodes": self.nodes, "state": self.state, "rng": self.rng.bit_generator.state,
            "warmup": {"cycle": self.cycle, "warm": self.warm, "rows": self.cycle_rows, "report": self.warmup_report},
            "result": result, "round_log": self.round_log})

    def _restore(self, saved: dict[str, Any], initial_arrays: ArrayRecord) -> None:
        if saved.get("format") != 1:
            raise ValueError("not a checkpoint of fedsteer_lib.flower (format 1)")
        if saved["identity"] != self._identity():
            raise ValueError(f"the checkpoint is of another strategy or other settings: {saved['identity']}, "
                             f"this strategy is {self._identity()}")
        if saved["layout"] != self.layout:
            raise ValueError("the checkpoint holds another model (its arrays differ from initial_arrays')")
        self.fixed = ArrayRecord({k: Array(v) for k, v in saved["fixed"].items()})
        self.initial, self.weights, self.nodes, self.state = saved["initial"], saved["weights"], saved["nodes"], saved["state"]
        self.round = saved["round"]
        self.rng.bit_generator.state = saved["rng"]
        warm = saved["warmup"]
        self.cycle, self.warm, self.cycle_rows, self.warmup_report = warm["cycle"], warm["warm"], warm["rows"], warm["report"]
        for name, rounds in saved["result"].items():
            getattr(self.result, name).update({r: MetricRecord(m) for r, m in rounds.items()})
        self.result.arrays = self.layout.record(self.weights, self.fixed)
        self.round_log = saved["round_log"]


# --- the methods ----------------------------------------------------------------------------------
class FedAvg(MethodStrategy):
    """FedAvg as the book's tables report it: Delta_t = sum_{A_t} d_i g_i / sum_{A_t} d_i, the
    d-weighted mean of the replies' updates; with server_lr = 1 the new model is the
    `num-examples`-weighted mean of the replies' models, which is Flower's FedAvg."""

    method = "fedavg"


class FedAvgUnbiased(MethodStrategy):
    """Unbiased FedAvg: Delta_t = sum_{i in A_t} (d_i / p_i) g_i (importance weighting)."""

    method = "fedavg_unbiased"


class FedSteer(MethodStrategy):
    """FedSteer (paper Algorithm 2): Delta_t = sum_i d_i Q_t s_i + sum_{i in A_t} (d_i / p_i)
    (g_i - Q_t s_i) (Eq. 4), with Q_t the normalised cached updates of the core set X (Eq. 1)
    and s_i each node's ridge coordinates (Eq. 3, lam = lambda), refreshed when it replies; X is
    chosen by greedy swaps (at most `max_swaps` per cycle, among `subsample` random candidates
    if given) in the warm-up's `warmup_rounds` rounds (paper §2.4). `refresh_every`, `ordering`,
    `selection` and `enforce_every` are the simulator's variants (`experiments.registry`). The
    state is O(N k + k d) floats. `core_size` nodes must be connected before the first round."""

    method = "fedsteer"

    def __init__(self, *, core_size: int = _default("fedsteer", "core_size"), lam: float = _default("fedsteer", "lam"),
                 warmup_rounds: int = _default("fedsteer", "warmup_cycles"),
                 max_swaps: int = _default("fedsteer", "max_swaps"), subsample: int | None = None,
                 refresh_every: int = _default("fedsteer", "refresh_every"),
                 ordering: str = _default("fedsteer", "ordering"), selection: str = _default("fedsteer", "selection"),
                 enforce_every: int = _default("fedsteer", "enforce_every"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={
            "core_size": core_size, "lam": lam, "warmup_cycles": warmup_rounds, "max_swaps": max_swaps,
            "subsample": subsample or 0, "refresh_every": refresh_every, "ordering": ordering,
            "selection": selection, "enforce_every": enforce_every})

    def _min_nodes_to_start(self) -> int:
        return int(self.spec.get("core_size"))


class FedVARP(MethodStrategy):
    """FedVARP: Delta_t = sum_i d_i h_i + sum_{i in A_t} (d_i / p_i) (g_i - h_i), h_i each node's
    last update (O(N d) server memory). `warmup_rounds` > 0: h starts from the warm-up's last
    snapshot (the fair start)."""

    method = "fedvarp"

    def __init__(self, *, warmup_rounds: int = _default("fedvarp", "warmup_cycles"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={"warmup_cycles": warmup_rounds})


class FedStale(MethodStrategy):
    """FedStale: Delta_t = sum_{A_t} (d_i / p_i) g_i + beta (sum_i d_i h_i - sum_{A_t} (d_i / p_i) h_i);
    beta = 1 is FedVARP, beta = 0 unbiased FedAvg."""

    method = "fedstale"

    def __init__(self, *, beta: float = _default("fedstale", "beta"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={"beta": beta})


class MIFA(MethodStrategy):
    """MIFA: Delta_t = sum_i d_i h_i after h_i <- g_i for the nodes that replied. start="zero":
    the table starts at zero; "wait_all": no step until every node has replied once, then every
    node's update at that model fills the table (a second exchange in that round)."""

    method = "mifa"

    def __init__(self, *, start: str = _default("mifa", "start"),
                 warmup_rounds: int = _default("mifa", "warmup_cycles"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={"start": start, "warmup_cycles": warmup_rounds})


class Scaffold(MethodStrategy):
    """SCAFFOLD (option II) with partial participation. Each TRAIN message carries, beside the
    model, the ArrayRecord `scaffold-correction` = c - c_i (the model's floating-point arrays, same
    keys): a client that uses it adds it to every gradient step. Replies must report `num-steps`
    (K) and `lr` (eta_l) in their metrics, for c_i+ = c_i - c + g_i / (K eta_l); a reply without
    them counts as failed. Aggregation: the d-weighted mean of the updates (`weighting`)."""

    method = "scaffold"
    needs_steps = True

    def __init__(self, *, weighting: str = _default("scaffold", "weighting"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={"weighting": weighting})


class FedProx(MethodStrategy):
    """FedProx: FedAvg's aggregation (`weighting`); the config carries `proximal-mu` (Flower's
    FedProx key) for the local objective + (mu / 2) ||w - w_t||^2."""

    method = "fedprox"

    def __init__(self, *, proximal_mu: float = _default("fedprox", "mu"),
                 weighting: str = _default("fedprox", "weighting"), **kwargs: Any) -> None:
        super().__init__(**kwargs, params={"mu": proximal_mu, "weighting": weighting})


STRATEGIES: dict[str, type[MethodStrategy]] = {cls.method: cls for cls in (
    FedSteer, FedAvg, FedAvgUnbiased, FedVARP, FedStale, MIFA, Scaffold, FedProx)}
