"""The simulation engine: one FL training run of any server strategy (paper §2.1, §4.1).

The engine knows nothing about particular methods. `run` is a loop over `_round`: draw the
participants, train them locally, ask the strategy for Delta_t, apply w <- w - eta_s Delta_t,
let the strategy refresh its memory (and train the clients it asks for), evaluate on a
schedule that always includes the last round (`Training.evaluates`). Everything measured goes
to a `Recorder`. A run that produces a non-finite update is stopped and recorded as collapsed.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import numpy as np
import torch
from tqdm import tqdm

from .. import numerics
from ..strategy import LocalSpec, ServerContext, Strategy
from .data import load_dataset
from .models import build_model
from .partition import Federation, build_federation, participation_schedule, rng
from .recorder import Recorder, probe_rows
from .settings import Training
from .training import FlatModel, can_batch, evaluate, local_train, local_train_batch

if TYPE_CHECKING:  # the engine only reads a run's settings; the experiments build them
    from ..experiments.config import RunConfig

__all__ = ["SimData", "prepare", "run", "RunResult", "client_updates", "client_generator", "warmup_updates",
           "WARMUP_REUSE_BYTES", "initial_evaluation", "STREAM_BATCHES", "STREAM_WARMUP", "STREAM_PROBE", "STREAM_FORCED"]

# Named torch random streams (see partition.rng for the numpy ones), one per purpose of local
# training: the training rounds' minibatches, the warm-up cycles', the probes' and the forced
# clients' (`Strategy.forced_clients`). Public: a client that trains alone (a Flower client,
# `fedsteer_lib.flower.replay`) draws the engine's minibatches with `client_generator(seed, stream, ...)`.
STREAM_BATCHES, STREAM_WARMUP, STREAM_PROBE, STREAM_FORCED = 6, 7, 8, 9


def _torch_gen(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(rng(seed, stream).integers(2**62)))


def client_generator(seed: int, stream: int, round_idx: int, client: int) -> torch.Generator:
    """The "per_client" batch stream (`RunConfig.batch_stream`): client `client`'s own torch
    generator for round (or warm-up cycle) `round_idx` of the named `stream` (STREAM_BATCHES,
    STREAM_WARMUP, STREAM_PROBE, STREAM_FORCED), seeded from numpy's SeedSequence of (seed,
    stream, round_idx, client). It depends on nothing else, so a client training alone (a Flower client) draws
    the same minibatches as the engine, whichever other clients train in that round."""
    words = np.random.SeedSequence([seed, stream, round_idx, client]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed((int(words[0]) << 30) ^ int(words[1]))


Generators = torch.Generator | Callable[[int], torch.Generator]  # shared, or one per client


def _stream(config: RunConfig, shared: torch.Generator, stream: int, round_idx: int) -> Generators:
    """The generator(s) of one round's local training under `config.batch_stream`."""
    if config.batch_stream == "per_client":
        return lambda client: client_generator(config.seed, stream, round_idx, client)
    return shared


@dataclass
class SimData:
    """Everything a run needs besides the strategy and training settings: model, normalised
    client data, eval set. Runs that differ only in method or training share one."""

    config: RunConfig  # the config it was prepared for; only its data part matters
    federation: Federation
    flat_model: FlatModel
    initial_weights: torch.Tensor
    client_images: list[torch.Tensor]
    client_labels: list[torch.Tensor]
    eval_images: torch.Tensor
    eval_labels: torch.Tensor
    num_classes: int
    client_batch: int = 1  # > 1: train up to this many clients at once (`local_train_batch`)
    precision: str = "fp32"  # the arithmetic of local training and evaluation (`RunConfig.precision`), set per run
    warmup: tuple | None = None  # the latest warm-up snapshots, for the next run (`warmup_updates`)
    warmup_memo: dict = field(default_factory=dict)  # what strategies derived from them (`ServerContext.snapshot_memo`)
    initial_eval: dict = field(default_factory=dict)  # arithmetic -> w_0's (accuracy, loss) (`initial_evaluation`)


def _data_key(config: RunConfig) -> tuple:
    """What SimData depends on: runs that differ only in method or training share it."""
    return (config.dataset, config.system, config.seed, config.emnist_split, config.device)


def prepare(config: RunConfig, data_root: str | None = None) -> SimData:
    """Load the data set, partition it among the clients and build the seeded initial model,
    with the kernels of the run (`numerics.kernels_for_run`: the normalisation's sums depend on
    them too)."""
    config.validate()
    with numerics.kernels_for_run(config.device):
        return _prepare(config, data_root)


def _prepare(config: RunConfig, data_root: str | None) -> SimData:
    device = torch.device(config.device)
    splits = load_dataset(config.dataset, data_root, split=config.emnist_split)
    federation = build_federation(config.system, splits.train_labels, splits.num_classes, config.seed)
    train = splits.train_images.float().div_(255.0)
    mean = train.mean(dim=(0, 2, 3), keepdim=True)
    std = train.std(dim=(0, 2, 3), keepdim=True)

    def norm(x: torch.Tensor) -> torch.Tensor:
        return ((x.float() / 255.0 - mean) / std).to(device).contiguous(memory_format=torch.channels_last)

    if federation.eval_indices is not None:  # validation split held out of the training pool
        eval_images = norm(splits.train_images[federation.eval_indices])
        eval_labels = splits.train_labels[federation.eval_indices].to(device)
    else:
        eval_images, eval_labels = norm(splits.test_images), splits.test_labels.to(device)
    client_images = [norm(splits.train_images[ix]) for ix in federation.client_indices]
    client_labels = [splits.train_labels[ix].to(device) for ix in federation.client_indices]
    torch.manual_seed(config.seed)
    model = build_model(config.dataset, splits.num_classes, splits.train_images.shape[1])
    flat_model = FlatModel(model, device)
    return SimData(config, federation, flat_model, flat_model.get_flat(), client_images, client_labels,
                   eval_images, eval_labels, splits.num_classes)


def client_updates(sim: SimData, training: Training, weights: torch.Tensor, clients: list[int],
                   generator: Generators, strategy: Strategy | None = None, state: Any = None):
    """Local training of `clients` from `weights` with the `training` settings;
    returns (updates (m, d), steps (m,), losses). `generator` draws the minibatch orders: one
    generator shared by the clients in turn, or a function giving client i its own.
    With `sim.client_batch` > 1 (and a model without BatchNorm) the clients are trained in
    vectorised groups of that size: the same minibatches, equal up to floating-point rounding.
    Training runs at `sim.precision` (fp32, or bf16 autocast; the updates are float32 either way)."""
    tr = training
    gen = (lambda i: generator) if isinstance(generator, torch.Generator) else generator
    kw = dict(epochs=tr.local_epochs, batch_size=tr.batch_size, lr=tr.client_lr, precision=sim.precision)

    def spec(i: int) -> LocalSpec | None:  # made when needed: SCAFFOLD's holds a d-sized correction
        return strategy.local_spec(state, i) if strategy is not None else None

    if sim.client_batch > 1 and can_batch(sim.flat_model):
        results = []
        for first in range(0, len(clients), sim.client_batch):
            group = clients[first: first + sim.client_batch]
            results += local_train_batch(sim.flat_model, weights, [(sim.client_images[i], sim.client_labels[i]) for i in group],
                                         specs=[spec(i) for i in group], generator=[gen(i) for i in group], **kw)
    else:
        results = [local_train(sim.flat_model, weights, sim.client_images[i], sim.client_labels[i], spec=spec(i),
                               generator=gen(i), **kw) for i in clients]
    updates = [r.update for r in results]
    steps = [r.num_steps for r in results]
    losses = [r.final_loss for r in results]
    dim = sim.flat_model.dim
    stacked = torch.stack(updates) if updates else torch.zeros(0, dim, device=weights.device)
    return stacked, torch.tensor(steps, dtype=torch.long, device=weights.device), losses


@dataclass
class RunResult:
    """A finished run: its config, per-round history, summary numbers and extra records."""

    config: dict[str, Any]
    history: list[dict[str, Any]]
    summary: dict[str, Any]
    extras: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)  # the computing process (`numerics.machine`)


# The most memory that one SimData spends keeping its latest warm-up snapshots for the next run
# (T0 x N x d float32): Fashion-MNIST's five cycles take 1.2 GB; CIFAR-10's would take 22 GB and
# are recomputed by every run instead.
WARMUP_REUSE_BYTES = 2 * 2**30


def _arithmetic(precision: str) -> tuple:
    """What, besides the data and the settings, decides the bits of local training and evaluation
    in this process now: the precision, the thread count and whether oneDNN is on (`numerics`).
    Part of the key of every result a SimData keeps for the next run."""
    return precision, torch.get_num_threads(), torch.backends.mkldnn.enabled


def warmup_updates(sim: SimData, config: RunConfig, cycles: int, progress: bool = False) -> tuple[Iterable[torch.Tensor], bool]:
    """The T0 = `cycles` warm-up snapshots of paper §2.4: in cycle c every client's update g_i^(c)
    at the fixed model w^(c), then one full-participation step w^(c+1) = w^(c) - eta_s sum_i d_i g_i^(c)
    from w^(0) = the initial model. They depend on the data, the local training and server step
    settings and the seed, never on the strategy (which only reads them) nor on the number of rounds
    or the eval schedule, so runs that share `sim` and those settings get the same
    tensors, computed once, as long as all T0 fit in `WARMUP_REUSE_BYTES` (otherwise each is computed
    when iterated and freed after), at the config's precision. Returns (the snapshots in cycle order,
    whether they were reused)."""
    tr = config.training
    sim.precision = config.precision
    local = (tr.local_epochs, tr.batch_size, tr.client_lr, tr.server_lr)  # not the rounds or the eval schedule
    key = (local, cycles, config.batch_stream, sim.client_batch, _arithmetic(config.precision))
    if sim.warmup is not None and sim.warmup[0] == key:
        return sim.warmup[1], True
    num_clients = sim.federation.num_clients

    def compute() -> Iterator[torch.Tensor]:
        shared = _torch_gen(config.seed, STREAM_WARMUP)
        weights = sim.initial_weights.clone()
        client_weights = sim.federation.weights.float().to(weights.device)
        for cycle in tqdm(range(cycles), desc="warm-up", disable=not progress, leave=False):
            grads, _, _ = client_updates(sim, tr, weights, list(range(num_clients)), _stream(config, shared, STREAM_WARMUP, cycle))
            yield grads
            weights = weights - tr.server_lr * (client_weights @ grads)

    sim.warmup, sim.warmup_memo = None, {}
    if cycles * num_clients * sim.flat_model.dim * sim.initial_weights.element_size() > WARMUP_REUSE_BYTES:
        return compute(), False
    snapshots = list(compute())
    sim.warmup = (key, snapshots)
    return snapshots, False


def initial_evaluation(sim: SimData) -> tuple[float, float]:
    """Accuracy and loss of the initial model w_0 on the eval set (a run's round 0). They depend
    on the data, the seed and the arithmetic (precision, threads, oneDNN), never on the method or
    its training settings, so runs that share `sim` and that arithmetic get the same numbers,
    computed once."""
    key = _arithmetic(sim.precision)
    if key not in sim.initial_eval:
        sim.initial_eval[key] = evaluate(sim.flat_model, sim.initial_weights, sim.eval_images, sim.eval_labels,
                                         precision=sim.precision)
    return sim.initial_eval[key]


def _warmup(sim: SimData, config: RunConfig, strategy: Strategy, state: dict, ctx: ServerContext, progress: bool) -> tuple[float, bool]:
    """Paper §2.4: the strategy sees each warm-up snapshot (`warmup_updates`) in turn. Returns
    (its wall time, whether the snapshots were reused). The caller restarts training from the
    initial weights."""
    start = time.perf_counter()
    cycles = strategy.warmup_cycles
    snapshots, reused = warmup_updates(sim, config, cycles, progress)
    ctx.snapshot_memo = sim.warmup_memo  # emptied whenever the snapshots are computed anew
    for cycle, grads in enumerate(snapshots):
        strategy.warmup_snapshot(state, ctx, grads, cycle, last=cycle == cycles - 1)
    return time.perf_counter() - start, reused


def server_setup(config: RunConfig, sim: SimData) -> tuple[Strategy, ServerContext, Any]:
    """The strategy, its server context (d_i, effective p_i) and its initial state for a run."""
    device = torch.device(config.device)
    strategy = config.method.build()
    fed = sim.federation
    probs = strategy.participation_probs(fed.probs)
    ctx = ServerContext(weights=fed.weights.float().to(device), probs=probs.float().to(device),
                        dim=sim.flat_model.dim, device=device, client_lr=config.training.client_lr, seed=config.seed)
    return strategy, ctx, strategy.init_state(ctx)


def run(config: RunConfig, *, progress: bool = True, sim: SimData | None = None, data_root: str | None = None) -> RunResult:
    """Simulate one FL training run and return its history and summary, with the kernels of
    this process's mode and the run's precision (`numerics.kernels_for_run`: pinned kernels and
    one thread by default, checked first; a bf16 run on a CPU with oneDNN on)."""
    config.validate()
    with numerics.kernels_for_run(config.device, config.precision):
        return _run(config, progress=progress, sim=sim, data_root=data_root)


def _run(config: RunConfig, *, progress: bool, sim: SimData | None, data_root: str | None) -> RunResult:
    sim = sim if sim is not None and _data_key(sim.config) == _data_key(config) else prepare(config, data_root)
    sim.client_batch = config.client_batch
    sim.precision = config.precision
    if config.client_batch > 1 and not can_batch(sim.flat_model):
        warnings.warn(f"client_batch={config.client_batch} ignored: the {config.dataset} model has BatchNorm, "
                      "its clients are trained one by one", stacklevel=2)
    tr, diag = config.training, config.diagnostics
    strategy, ctx, state = server_setup(config, sim)
    rec = Recorder(strategy, diag.track_coords,
                   torch.zeros(ctx.num_clients, ctx.dim, device=ctx.device) if diag.probe_every else None)
    rec.last_seen = np.full(ctx.num_clients, -1)
    reused = False
    if strategy.warmup_cycles:
        rec.timing["warmup"], reused = _warmup(sim, config, strategy, state, ctx, progress)
    eff_probs = strategy.participation_probs(sim.federation.probs)  # float64, as drawn
    schedule = participation_schedule(eff_probs, tr.rounds, config.seed)
    streams = {"batches": _torch_gen(config.seed, STREAM_BATCHES), "probe": _torch_gen(config.seed, STREAM_PROBE),
               "forced": _torch_gen(config.seed, STREAM_FORCED), "probe_draws": rng(config.seed, STREAM_PROBE)}
    weights = sim.initial_weights.clone()
    with rec.phase("eval"):
        acc, loss = initial_evaluation(sim)
    rec.history.append({"round": 0, "num_active": 0, "accuracy": acc, "loss": loss, "train_loss": float("nan"),
                        "update_norm": 0.0})
    collapse_round = None
    bar = tqdm(range(tr.rounds), desc=config.method.label, disable=not progress, leave=False)
    for t in bar:
        weights = _round(t, torch.nonzero(schedule[t]).flatten().tolist(), weights, sim, config, strategy, state,
                         ctx, rec, streams)
        if weights is None:
            collapse_round = t + 1
            break
        if rec.history[-1]["accuracy"] == rec.history[-1]["accuracy"]:
            bar.set_postfix(acc=f"{rec.history[-1]['accuracy']:.3f}")
    summary = rec.summary(tr.eval_last, collapse_round is not None, collapse_round, state,
                          sim.flat_model.num_params, ctx.dim)
    if strategy.warmup_cycles:
        summary["warmup_reused"] = reused  # its snapshots came from the previous run on `sim`
    return RunResult(config=config.to_dict(), history=rec.history, summary=summary, extras=rec.extras(state),
                     machine=numerics.machine(config.device, config.precision))


def _round(t: int, active_ids: list[int], weights: torch.Tensor, sim: SimData, config: RunConfig, strategy: Strategy,
           state: Any, ctx: ServerContext, rec: Recorder, streams: dict) -> torch.Tensor | None:
    """Round t from w_t (`weights`) with the clients `active_ids`; returns w_{t+1}, or None when
    the round produced a non-finite update (the run has collapsed)."""
    tr, diag = config.training, config.diagnostics
    rec.participation.append(active_ids)
    with rec.phase("client"):
        updates, steps, losses = client_updates(sim, tr, weights, active_ids, _stream(config, streams["batches"], STREAM_BATCHES, t),
                                                strategy, state)
    active = torch.tensor(active_ids, dtype=torch.long, device=ctx.device)
    if diag.probe_every and t % diag.probe_every == 0:
        with rec.phase("probe"):
            true, _, _ = client_updates(sim, tr, weights, list(range(ctx.num_clients)),
                                        _stream(config, streams["probe"], STREAM_PROBE, t), strategy, state)
            rec.probes.extend(probe_rows(true, strategy, state, ctx, t, rec.last_seen, rec.memory,
                                         diag.probe_mc_samples, streams["probe_draws"].random))
    with rec.phase("server"):
        delta = strategy.aggregate(state, ctx, active, updates)
        # One pass, no (m, d) temporary: a NaN or inf anywhere makes the sum non-finite (so do
        # finite entries near the float32 limit, which only a diverged run produces).
        finite = bool(torch.isfinite(delta.sum())) and bool(torch.isfinite(updates.sum()))
        if finite:
            new_weights = weights - tr.server_lr * delta
            strategy.update(state, ctx, active, updates, steps, t)
    if not finite:
        # The run has collapsed: the method ends with the non-finite model w_t - eta_s * Delta,
        # which is what it is scored on (a diverged model scores what it predicts, about chance).
        row = {"round": t + 1, "num_active": len(active_ids), "train_loss": float("nan"),
               "update_norm": float(delta.norm()), "collapsed": True}
        with rec.phase("eval"):
            row["accuracy"], row["loss"] = evaluate(sim.flat_model, weights - tr.server_lr * delta,
                                                    sim.eval_images, sim.eval_labels, precision=sim.precision)
        rec.history.append(row)
        return None
    forced = sorted(set(strategy.forced_clients(state, ctx, t)) - set(active_ids))
    if forced:  # updates at w_t that the strategy observes but never aggregates
        with rec.phase("forced"):
            extra, _, _ = client_updates(sim, tr, weights, forced, _stream(config, streams["forced"], STREAM_FORCED, t), strategy, state)
            strategy.observe(state, ctx, torch.tensor(forced, dtype=torch.long, device=ctx.device), extra, t)
    row = {"round": t + 1, "num_active": len(active_ids), "accuracy": float("nan"), "loss": float("nan"),
           "train_loss": float(np.mean(losses)) if losses else float("nan"), "update_norm": float(delta.norm())}
    if tr.evaluates(t + 1):  # on the schedule, and always the last round (the model the run ends with)
        with rec.phase("eval"):
            row["accuracy"], row["loss"] = evaluate(sim.flat_model, new_weights, sim.eval_images, sim.eval_labels,
                                                    precision=sim.precision)
    rec.round_done(state, active, active_ids, updates, row)
    return new_weights
