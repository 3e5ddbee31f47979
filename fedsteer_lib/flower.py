"""FedSteer and every baseline as a Flower strategy: the simulator's server strategies
(`fedsteer_lib.strategy.Strategy`) driven by Flower (flwr 1.42) instead of our engine.

Which Flower API. flwr 1.42 has two server-side APIs: the legacy `flwr.server.strategy.Strategy`
(configure_fit / aggregate_fit on `Parameters` and `FitRes`, run by `ServerApp(server_fn=...)`)
and the Message API, `flwr.serverapp.strategy.Strategy` (configure_train / aggregate_train on
`Message`s carrying `ArrayRecord`s, run by `strategy.start(grid, ...)` inside
`@ServerApp.main()`). Flower's documentation and its built-in strategies (FedAvg, FedProx, ...)
now use the Message API, and `flwr.simulation.run_simulation` runs it unchanged; it is also the
one that fits our strategies: `configure_train` receives the `Grid`, so the server can ask the
clients for their d_i and p_i (a QUERY message) and train the clients a strategy wants besides
the active ones (`Strategy.forced_clients`: MIFA's wait_all start, FedSteer's enforce_every)
within the round. `FlowerStrategy` is therefore a Message-API strategy. (flwr 1.42 marks
`run_simulation` itself deprecated in favour of `flwr run` on a Flower app project; the ServerApp
and ClientApp are the same under both. examples/flower_app.py and the tests use `run_simulation`,
which runs the ServerApp in this process, so the strategy's models can be read after the run.)

What runs where (one Flower server round per step below; `FlowerStrategy.num_rounds` of them):

- Before the first round the server sends every node a QUERY; each client answers with its id
  (`partition-id` of its node config), its weight d_i and its participation probability p_i.
- Rounds 1..T0 (FedSteer's warm-up, paper §2.4; T0 = `warmup_cycles`, 0 for the baselines):
  every client trains at the warm-up model; the server calls `warmup_snapshot` on the updates
  and takes a full-participation step, as `engine._warmup`; training restarts from w_0.
- Then `rounds` training rounds: the active set of round t is drawn exactly as the engine
  draws it (`partition.participation_schedule` of the method's p_i, same seed), each client
  with its own p_i. The server sends the active clients w_t, the training settings and the
  method's `local_spec` (FedProx's mu in the config, SCAFFOLD's correction c - c_i as a second
  array). `aggregate_train` stacks the updates g_i = w_t - w_i^E in client order and calls the
  same `aggregate` (Delta_t: Eq. 4 for FedSteer, with its ridge coordinates and core-set
  cache) and `update` as the engine, then w_{t+1} = w_t - eta_s Delta_t; the clients of
  `forced_clients` are trained at w_t in a second exchange and passed to `observe`.

Clients draw their minibatches from their own generator (`engine.client_generator` of the
seed, purpose, round and client id), so a run equals the engine's run of the same `RunConfig`
with `batch_stream="per_client"`, round by round (tests/test_flower.py checks it).
A non-finite Delta_t (a collapsed run) stops the Flower run with an error; the engine records it.
The engine's diagnostics (probes, tracked coordinates) and its evaluation are not part of this
strategy; pass `evaluate_fn` to `start` for a central evaluation.
"""
from __future__ import annotations

import functools
import time
from typing import Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy as FlowerBase

from .experiments.config import RunConfig
from .simulator.data import EMNIST_SPLITS
from .simulator.engine import _BATCHES, _FORCED, _WARMUP, SimData, client_generator, prepare
from .simulator.models import build_model
from .simulator.partition import participation_schedule
from .simulator.training import FlatModel, local_train
from .strategy import LocalSpec, ServerContext

__all__ = ["FlowerStrategy", "client_app", "initial_weights"]


def initial_weights(config: RunConfig) -> torch.Tensor:
    """w_0 as `engine.prepare` makes it (the seeded model, flat), without loading any data."""
    num_classes = EMNIST_SPLITS[config.emnist_split] if config.dataset == "emnist" else 10
    torch.manual_seed(config.seed)
    model = build_model(config.dataset, num_classes, 3 if config.dataset == "cifar10" else 1)
    return FlatModel(model, config.device).get_flat()


def _record(*vectors: torch.Tensor) -> ArrayRecord:
    return ArrayRecord(numpy_ndarrays=[v.detach().cpu().numpy() for v in vectors])


def _vectors(record: ArrayRecord) -> list[torch.Tensor]:
    return [torch.from_numpy(np.array(a, copy=True)) for a in record.to_numpy_ndarrays()]


class FlowerStrategy(FlowerBase):
    """Any registered method (`config.method`) as a Flower Message-API strategy.

    `config` is the run as our engine knows it: method, training settings (rounds, E, batch
    size, client and server lr), seed; it must use `batch_stream="per_client"`, the only batch
    stream a client training alone can reproduce. Run it with `start(grid, initial_arrays,
    num_rounds=self.num_rounds)` (or `run(grid)`). After the run, `history` holds the global
    model after each training round and `weights` the final one.
    """

    connect_timeout = 600.0  # seconds to wait for every client's node to connect

    def __init__(self, config: RunConfig) -> None:
        config.validate()
        if config.batch_stream != "per_client":
            raise ValueError(f"FlowerStrategy needs batch_stream='per_client' (each Flower client trains alone), "
                             f"got {config.batch_stream!r}")
        self.config = config
        self.strategy = config.method.build()
        self.initial = initial_weights(config)
        self.weights = self.initial.clone()  # w_t
        self.history: list[torch.Tensor] = []  # w_{t+1} after each training round
        self.ctx: ServerContext | None = None
        self.state = None
        self.node_of: dict[int, int] = {}  # client id -> Flower node id
        self.schedule: torch.Tensor | None = None
        self._grid: Grid | None = None
        self._warm = self.initial.clone()  # the warm-up model

    @property
    def num_rounds(self) -> int:
        """Flower server rounds: the warm-up cycles, then the training rounds."""
        return self.strategy.warmup_cycles + self.config.training.rounds

    def run(self, grid: Grid, timeout: float = 3600) -> torch.Tensor:
        """Run every round on `grid`; returns the final global model (flat)."""
        self.start(grid, _record(self.initial), num_rounds=self.num_rounds, timeout=timeout)
        return self.weights

    def summary(self) -> None:
        """Flower logs this at the start."""

    # --- the federation: d_i and p_i come from the clients -------------------------------
    def _meet_clients(self, grid: Grid) -> None:
        n = self.config.system.num_clients
        waited = time.monotonic()
        while len(nodes := list(grid.get_node_ids())) < n:  # nodes connect in their own time
            if time.monotonic() - waited > self.connect_timeout:
                raise RuntimeError(f"{len(nodes)} of {n} nodes connected after {self.connect_timeout} s "
                                   f"(config.system.num_clients={n})")
            time.sleep(0.2)
        replies = grid.send_and_receive([Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n,
                                                 message_type=MessageType.QUERY) for n in nodes])
        found = {}
        for reply in replies:
            if reply.has_error():
                raise RuntimeError(f"a client failed to answer the query: {reply.error}")
            m = reply.content["metrics"]
            found[int(m["client-id"])] = (reply.metadata.src_node_id, float(m["weight"]), float(m["prob"]))
        if sorted(found) != list(range(n)):
            raise RuntimeError(f"expected clients 0..{n - 1} (config.system.num_clients={n}), got ids {sorted(found)}")
        self.node_of = {i: found[i][0] for i in range(n)}
        weights = torch.tensor([found[i][1] for i in range(n)], dtype=torch.float64)
        probs = self.strategy.participation_probs(torch.tensor([found[i][2] for i in range(n)], dtype=torch.float64))
        device = torch.device(self.config.device)
        self.ctx = ServerContext(weights=weights.float().to(device), probs=probs.float().to(device), dim=self.initial.numel(),
                                 device=device, client_lr=self.config.training.client_lr, seed=self.config.seed)
        self.state = self.strategy.init_state(self.ctx)
        self.schedule = participation_schedule(probs, self.config.training.rounds, self.config.seed)

    # --- messages -----------------------------------------------------------------------
    def _train_messages(self, clients: list[int], weights: torch.Tensor, stream: int, round_idx: int,
                        with_spec: bool) -> list[Message]:
        tr = self.config.training
        out = []
        for i in clients:
            spec = (self.strategy.local_spec(self.state, i) if with_spec else None) or LocalSpec()
            arrays = _record(weights) if spec.correction is None else _record(weights, spec.correction)
            config = ConfigRecord({"seed": self.config.seed, "stream": stream, "round": round_idx,
                                   "local-epochs": tr.local_epochs, "batch-size": tr.batch_size,
                                   "lr": tr.client_lr, "prox-mu": float(spec.prox_mu)})
            out.append(Message(RecordDict({"arrays": arrays, "config": config}), dst_node_id=self.node_of[i],
                               message_type=MessageType.TRAIN))
        return out

    @staticmethod
    def _updates(replies: Iterable[Message]) -> tuple[list[int], torch.Tensor, torch.Tensor, list[float]]:
        """The replies' (client ids, updates (m, d), steps (m,), losses), sorted by client id."""
        rows = []
        for reply in replies:
            if reply.has_error():
                raise RuntimeError(f"a client failed to train: {reply.error}")
            m = reply.content["metrics"]
            rows.append((int(m["client-id"]), _vectors(reply.content["arrays"])[0], int(m["num-steps"]),
                         float(m["train-loss"])))
        rows.sort(key=lambda r: r[0])
        ids = [r[0] for r in rows]
        updates = torch.stack([r[1] for r in rows]) if rows else torch.zeros(0, 0)
        return ids, updates, torch.tensor([r[2] for r in rows], dtype=torch.long), [r[3] for r in rows]

    def _phase(self, server_round: int) -> tuple[str, int]:
        r = server_round - 1
        cycles = self.strategy.warmup_cycles
        return ("warmup", r) if r < cycles else ("train", r - cycles)

    # --- Flower's hooks -----------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The messages of round `server_round`: every client during the warm-up, else the
        clients drawn for this round (each with its own p_i), with the method's local spec."""
        self._grid = grid
        if self.ctx is None:
            self._meet_clients(grid)
        phase, idx = self._phase(server_round)
        if phase == "warmup":
            return self._train_messages(list(range(self.ctx.num_clients)), self._warm, _WARMUP, idx, with_spec=False)
        active = torch.nonzero(self.schedule[idx]).flatten().tolist()
        return self._train_messages(active, self.weights, _BATCHES, idx, with_spec=True)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Warm-up: `warmup_snapshot` and a full-participation step. Training: Delta_t from the
        strategy's `aggregate` (Eq. 4 for FedSteer), w_{t+1} = w_t - eta_s Delta_t, `update`,
        then the forced clients' updates at w_t to `observe`."""
        ctx, tr = self.ctx, self.config.training
        phase, idx = self._phase(server_round)
        ids, updates, steps, losses = self._updates(replies)
        updates, steps = updates.to(ctx.device), steps.to(ctx.device)
        if phase == "warmup":
            last = idx == self.strategy.warmup_cycles - 1
            self.strategy.warmup_snapshot(self.state, ctx, updates, idx, last=last)
            self._warm = self._warm - tr.server_lr * (ctx.weights @ updates)
            return _record(self.initial), MetricRecord({"warmup-cycle": idx})  # training starts from w_0
        if not ids:
            updates = torch.zeros(0, ctx.dim, device=ctx.device)
        active = torch.tensor(ids, dtype=torch.long, device=ctx.device)
        delta = self.strategy.aggregate(self.state, ctx, active, updates)
        if not (bool(torch.isfinite(delta.sum())) and bool(torch.isfinite(updates.sum()))):
            raise FloatingPointError(f"round {idx + 1}: non-finite update, the run has collapsed")
        new_weights = self.weights - tr.server_lr * delta
        self.strategy.update(self.state, ctx, active, updates, steps, idx)
        forced = sorted(set(self.strategy.forced_clients(self.state, ctx, idx)) - set(ids))
        if forced:  # updates at w_t that the strategy observes but never aggregates
            f_ids, f_updates, _, _ = self._updates(self._grid.send_and_receive(
                self._train_messages(forced, self.weights, _FORCED, idx, with_spec=True)))
            self.strategy.observe(self.state, ctx, torch.tensor(f_ids, dtype=torch.long, device=ctx.device),
                                  f_updates.to(ctx.device), idx)
        self.weights = new_weights
        self.history.append(new_weights.clone())
        metrics = {"num-active": len(ids), "update-norm": float(delta.norm())}
        if losses:
            metrics["train-loss"] = float(np.mean(losses))
        return _record(new_weights), MetricRecord(metrics)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """No client-side evaluation (pass `evaluate_fn` to `start` for a central one)."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None


# --- the client side ------------------------------------------------------------------------
@functools.lru_cache(maxsize=2)
def _client_data(config: RunConfig, data_root: str | None) -> SimData:
    """The federation's data as the engine prepares it (cached per process: a simulation's
    client process serves many clients)."""
    return prepare(config, data_root)


def client_app(config: RunConfig, data_root: str | None = None) -> ClientApp:
    """A ClientApp for the simulated federation of `config` (only its data part matters:
    dataset, system, seed): node `partition-id` i is client i, with its data, d_i and p_i as
    `engine.prepare` makes them. It answers the server's QUERY with (i, d_i, p_i) and trains
    E epochs of minibatch SGD (`training.local_train`) from the model it is sent, with its own
    minibatch generator and the FedProx / SCAFFOLD terms the server asks for."""
    data_config = config.replace(method=RunConfig().method)  # the method is the server's business
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        fed = _client_data(data_config, data_root).federation
        metrics = MetricRecord({"client-id": i, "weight": float(fed.weights[i]), "prob": float(fed.probs[i])})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        sim = _client_data(data_config, data_root)
        cfg = msg.content["config"]
        vectors = [v.to(sim.initial_weights.device) for v in _vectors(msg.content["arrays"])]
        spec = LocalSpec(prox_mu=float(cfg["prox-mu"]), correction=vectors[1] if len(vectors) > 1 else None)
        result = local_train(sim.flat_model, vectors[0], sim.client_images[i], sim.client_labels[i],
                             epochs=int(cfg["local-epochs"]), batch_size=int(cfg["batch-size"]), lr=float(cfg["lr"]),
                             generator=client_generator(int(cfg["seed"]), int(cfg["stream"]), int(cfg["round"]), i),
                             spec=spec)
        metrics = MetricRecord({"client-id": i, "num-steps": result.num_steps, "train-loss": result.final_loss})
        return Message(RecordDict({"arrays": _record(result.update), "metrics": metrics}), reply_to=msg)

    return app
