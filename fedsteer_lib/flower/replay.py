"""The equivalence harness, not the user-facing API: our simulator's federation as Flower
clients, and a Flower strategy that replays the simulator's participation draws, so that a
Flower run is `engine.run` of the same `RunConfig` (with `batch_stream="per_client"`), round by
round. tests/test_flower.py and bench/flower_vs_engine.py use it.

- `engine_client_app(config)`: node `partition-id` i is client i of `engine.prepare(config)`
  (its data, its d_i as `num-examples`, its p_i as `participation-prob`); it trains as the
  engine does (`training.local_train`, the engine's kernels) with client i's own minibatch
  generator of the engine's stream for the message: `warmup-cycle` in the config: the warm-up's
  stream and cycle; `forced-update`: the forced clients' stream; else the training rounds'
  stream; at the training round `training-round` that the replaying strategy sends (its
  `server-round` less the warm-up rounds, less one), so the client needs no method's settings
  (from any other strategy: `server-round` less one). It also answers a QUERY with
  its partition id.
- `replay_strategy(config, federation)`: the `fedsteer_lib.flower` class of `config.method`,
  with its parameters, whose slots are the clients in partition order (asked by a QUERY before
  the first round) and whose `sample` returns the engine's draws
  (`partition.participation_schedule`) instead of its own.
"""
from __future__ import annotations

import functools
import time
from typing import Any

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

from .. import numerics
from ..experiments.config import RunConfig
from ..simulator.data import EMNIST_SPLITS
from ..simulator.engine import (STREAM_BATCHES, STREAM_FORCED, STREAM_WARMUP, SimData, client_generator, prepare)
from ..simulator.models import build_model
from ..simulator.partition import Federation, participation_schedule
from ..simulator.training import FlatModel, local_train
from ..strategy import LocalSpec
from .records import Layout
from .driver import MethodStrategy
from .exchange import CORRECTION_KEY
from .methods import STRATEGIES

__all__ = ["engine_client_app", "replay_strategy", "initial_arrays", "flat_names"]

# The Flower names of the registry's parameters where they differ (see methods.py).
_FLOWER_NAMES = {"warmup_cycles": "warmup_rounds", "mu": "proximal_mu"}


def flat_names(flat_model: FlatModel) -> list[str]:
    """The names of the tensors of the engine's flat vector, in its order (parameters, then
    floating-point buffers)."""
    names = {id(t): name for name, t in [*flat_model.model.named_parameters(), *flat_model.model.named_buffers()]}
    return [names[id(t)] for t in flat_model.tensors]


def _record(flat_model: FlatModel, flat: torch.Tensor) -> ArrayRecord:
    chunks = torch.split(flat.detach().cpu(), flat_model.sizes)
    return ArrayRecord({name: Array(c.reshape(t.shape).numpy().copy())
                        for name, c, t in zip(flat_names(flat_model), chunks, flat_model.tensors)})


def initial_arrays(config: RunConfig) -> ArrayRecord:
    """w_0 as `engine.prepare` makes it (the seeded model), as a named ArrayRecord, without data."""
    num_classes = EMNIST_SPLITS[config.emnist_split] if config.dataset == "emnist" else 10
    torch.manual_seed(config.seed)
    model = build_model(config.dataset, num_classes, 3 if config.dataset == "cifar10" else 1)
    flat_model = FlatModel(model, "cpu")
    return _record(flat_model, flat_model.get_flat())


@functools.lru_cache(maxsize=2)
def _client_data(config: RunConfig, data_root: str | None) -> SimData:
    """The federation's data as the engine prepares it (once per process: a simulation's client
    process serves many nodes)."""
    return prepare(config, data_root)


def engine_client_app(config: RunConfig, data_root: str | None = None) -> ClientApp:
    """A ClientApp for the simulated federation of `config` (see the module docstring)."""
    data_config = config.replace(method=RunConfig().method)  # the method is the server's business
    tr = config.training
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        fed = _client_data(data_config, data_root).federation
        metrics = MetricRecord({"partition-id": i, "num-examples": int(fed.sizes[i]),
                                "participation-prob": float(fed.probs[i])})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        sim = _client_data(data_config, data_root)
        cfg = msg.content["config"]
        layout = Layout.of(msg.content["arrays"])
        if "warmup-cycle" in cfg:
            stream, index = STREAM_WARMUP, int(cfg["warmup-cycle"])
        else:
            stream = STREAM_FORCED if cfg.get("forced-update") else STREAM_BATCHES
            # the replaying strategy's round of the engine; any other strategy: its own server round
            index = int(cfg.get("training-round", int(cfg["server-round"]) - 1))
        correction = msg.content.array_records.get(CORRECTION_KEY)
        spec = LocalSpec(prox_mu=float(cfg.get("proximal-mu", 0.0)),
                         correction=None if correction is None else Layout.of(correction).flat(correction))
        with numerics.kernels_for_run(config.device):
            result = local_train(sim.flat_model, layout.flat(msg.content["arrays"]).to(sim.initial_weights.device),
                                 sim.client_images[i], sim.client_labels[i], epochs=tr.local_epochs,
                                 batch_size=tr.batch_size, lr=tr.client_lr,
                                 generator=client_generator(config.seed, stream, index, i), spec=spec)
            trained = sim.flat_model.get_flat()
        fed = sim.federation
        metrics = MetricRecord({"num-examples": int(fed.sizes[i]), "participation-prob": float(fed.probs[i]),
                                "num-steps": result.num_steps, "lr": tr.client_lr, "train-loss": result.final_loss})
        return Message(RecordDict({"arrays": _record(sim.flat_model, trained), "metrics": metrics}), reply_to=msg)

    return app


class _Replay:
    """Mixed into a method class: slots in partition order, the engine's draws."""

    schedule: torch.Tensor  # (rounds, N) bool

    def _connect(self, grid: Grid, server_round: int) -> list[int]:
        if len(self.nodes) == 0:
            while len(nodes := sorted(grid.get_node_ids())) < self.min_available_nodes:
                time.sleep(0.2)
            replies = grid.send_and_receive([Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n,
                                                     message_type=MessageType.QUERY) for n in nodes])
            found = {int(r.content["metrics"]["partition-id"]): r for r in replies}
            self._partition_nodes = [found[i].metadata.src_node_id for i in sorted(found)]
            for i in sorted(found):  # d_i and p_i known from the start, as the engine knows them
                slot = self.nodes.add(found[i].metadata.src_node_id, server_round)
                self.nodes.examples[slot] = float(found[i].content["metrics"]["num-examples"])
                self.nodes.declared[slot] = float(found[i].content["metrics"]["participation-prob"])
            self._check_size(len(self.nodes))
            self.state = self.core.init_state(self._context())
        return super()._connect(grid, server_round)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        """The method's messages, each with the engine's training round (0 in the first round
        after the warm-up) for the client's minibatch stream."""
        training_round = ConfigRecord({**dict(config), "training-round": server_round - self.warmup_rounds - 1})
        return super().configure_train(server_round, arrays, training_round, grid)

    def sample(self, server_round: int, nodes: list[int]) -> list[int]:
        row = self.schedule[server_round - self.warmup_rounds - 1]
        return [self._partition_nodes[i] for i in torch.nonzero(row).flatten().tolist()]


def replay_strategy(config: RunConfig, federation: Federation, **flower_kwargs: Any) -> MethodStrategy:
    """The Flower strategy of `config.method` (its parameters, the run's server lr and seed) that
    replays the engine's participation draws for `federation` (`engine.prepare(config).federation`)."""
    if config.batch_stream != "per_client":
        raise ValueError(f"the engine's run equals a Flower run only with batch_stream='per_client' (each client "
                         f"draws its own minibatches), got {config.batch_stream!r}")
    base = STRATEGIES[config.method.name]
    params = {_FLOWER_NAMES.get(k, k): v for k, v in config.method.params}
    if "subsample" in params:
        params["subsample"] = params["subsample"] or None
    cls = type(f"Replayed{base.__name__}", (_Replay, base), {})
    n = federation.num_clients
    strategy = cls(**params, min_available_nodes=n, min_train_nodes=0, fraction_evaluate=0.0,
                   server_lr=config.training.server_lr, seed=config.seed, **flower_kwargs)
    probs = strategy.core.participation_probs(federation.probs)
    strategy.schedule = participation_schedule(probs, config.training.rounds, config.seed)
    return strategy
