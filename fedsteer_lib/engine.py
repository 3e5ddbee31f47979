"""The simulation engine: one FL training run of any server strategy (paper §2.1, §4.1).

The engine knows nothing about particular methods: it draws the participants, runs their
local training, asks the strategy for Delta_t, applies w <- w - eta_s Delta_t, lets the
strategy refresh its memory, evaluates on a schedule, and records diagnostics. A run that
produces a non-finite update is stopped and recorded as collapsed.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from .config import RunConfig, Training
from .data import load_dataset
from .models import build_model
from .partition import Federation, build_federation, participation_schedule, rng
from .projection import update_variance
from .strategies import ServerContext, Strategy, make_strategy
from .training import FlatModel, LocalSpec, can_batch, evaluate, local_train, local_train_batch

__all__ = ["SimData", "prepare", "run", "RunResult", "client_updates"]

# Named torch random streams (see partition.rng for the numpy ones).
_BATCHES, _WARMUP, _PROBE, _FORCED = 6, 7, 8, 9


def _torch_gen(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(rng(seed, stream).integers(2**62)))


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


def _data_key(config: RunConfig) -> tuple:
    """What SimData depends on: runs that differ only in method or training share it."""
    return (config.dataset, config.system, config.seed, config.emnist_split, config.device)


def prepare(config: RunConfig, data_root: str | None = None) -> SimData:
    """Load the data set, partition it among the clients and build the seeded initial model."""
    config.validate()
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
                   generator: torch.Generator, strategy: Strategy | None = None, state: dict | None = None):
    """Local training of `clients` from `weights` with the `training` settings;
    returns (updates (m, d), steps (m,), losses). With `sim.client_batch` > 1 (and a model
    without BatchNorm) the clients are trained in vectorised groups of that size: the same
    minibatches, equal up to floating-point rounding."""
    tr = training
    kw = dict(epochs=tr.local_epochs, batch_size=tr.batch_size, lr=tr.client_lr, generator=generator)

    def spec(i: int) -> LocalSpec | None:  # made when needed: SCAFFOLD's holds a d-sized correction
        return strategy.local_spec(state, i) if strategy is not None else None

    if sim.client_batch > 1 and can_batch(sim.flat_model):
        results = []
        for first in range(0, len(clients), sim.client_batch):
            group = clients[first: first + sim.client_batch]
            results += local_train_batch(sim.flat_model, weights, [(sim.client_images[i], sim.client_labels[i]) for i in group],
                                         specs=[spec(i) for i in group], **kw)
    else:
        results = [local_train(sim.flat_model, weights, sim.client_images[i], sim.client_labels[i], spec=spec(i), **kw)
                   for i in clients]
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


def _probe(sim, config, strategy, state, ctx, weights, t, last_seen, memory, generator, prob_gen) -> list[dict]:
    """Diagnostics at w_t: every client's true update, the aggregation variance of this
    method's estimator (Monte Carlo over participation draws; exact where Eq. 4's form
    applies) and the directional misalignment of stale and estimated updates."""
    n = ctx.num_clients
    true, _, _ = client_updates(sim, config.training, weights, list(range(n)), generator, strategy, state)
    target = ctx.weights @ true
    probs = ctx.probs.double().cpu().numpy()
    mean = torch.zeros_like(target, dtype=torch.float64)
    sq_err, sq_norm = 0.0, 0.0
    samples = config.diagnostics.probe_mc_samples
    for _ in range(samples):
        active = torch.from_numpy(np.nonzero(prob_gen.random(n) < probs)[0]).to(weights.device)
        delta = strategy.aggregate(state, ctx, active, true[active]).double()
        mean += delta
        sq_norm += float(delta @ delta)
        sq_err += float(((delta - target.double()) ** 2).sum())
    mean /= samples
    variance = sq_norm / samples - float(mean @ mean)
    estimates = strategy.estimates(state, ctx)
    exact = update_variance(true, estimates, ctx.weights, ctx.probs) if estimates is not None else float("nan")
    rows = [{"round": t, "client": -1, "mc_variance": variance, "exact_variance": exact,
             "mse_to_mean": sq_err / samples, "bias_norm": float((mean - target.double()).norm()),
             "target_norm": float(target.norm())}]
    cos = torch.nn.functional.cosine_similarity
    stale_cos = cos(memory, true, dim=1)
    est_cos = cos(estimates, true, dim=1) if estimates is not None else torch.full((n,), float("nan"))
    for i in range(n):
        rows.append({"round": t, "client": i, "staleness": int(t - last_seen[i]) if last_seen[i] >= 0 else -1,
                     "cos_stale": float(stale_cos[i]) if last_seen[i] >= 0 else float("nan"),
                     "cos_estimate": float(est_cos[i]), "true_norm": float(true[i].norm())})
    return rows


def _warmup(sim: SimData, config: RunConfig, strategy: Strategy, state: dict, ctx: ServerContext, progress: bool) -> float:
    """Paper §2.4: T0 selection cycles at a fixed model, each followed by a full-participation
    step. Returns its wall time. The caller restarts training from the initial weights."""
    tr = config.training
    gen = _torch_gen(config.seed, _WARMUP)
    weights = sim.initial_weights.clone()
    start = time.perf_counter()
    cycles = strategy.warmup_cycles
    for cycle in tqdm(range(cycles), desc="warm-up", disable=not progress, leave=False):
        grads, _, _ = client_updates(sim, tr, weights, list(range(ctx.num_clients)), gen)
        strategy.warmup_snapshot(state, ctx, grads, cycle, last=cycle == cycles - 1)
        weights = weights - tr.server_lr * (ctx.weights @ grads)
    return time.perf_counter() - start


def server_setup(config: RunConfig, sim: SimData) -> tuple[Strategy, ServerContext, dict]:
    """The strategy, its server context (d_i, effective p_i) and its initial state for a run."""
    device = torch.device(config.device)
    strategy = make_strategy(config.method)
    fed = sim.federation
    probs = strategy.participation_probs(fed.probs)
    ctx = ServerContext(weights=fed.weights.float().to(device), probs=probs.float().to(device),
                        dim=sim.flat_model.dim, device=device, client_lr=config.training.client_lr, seed=config.seed)
    return strategy, ctx, strategy.init_state(ctx)


def run(config: RunConfig, *, progress: bool = True, sim: SimData | None = None, data_root: str | None = None) -> RunResult:
    """Simulate one FL training run and return its history and summary."""
    config.validate()
    sim = sim if sim is not None and _data_key(sim.config) == _data_key(config) else prepare(config, data_root)
    sim.client_batch = config.client_batch
    if config.client_batch > 1 and not can_batch(sim.flat_model):
        warnings.warn(f"client_batch={config.client_batch} ignored: the {config.dataset} model has BatchNorm, "
                      "its clients are trained one by one", stacklevel=2)
    tr, diag = config.training, config.diagnostics
    device = torch.device(config.device)
    strategy, ctx, state = server_setup(config, sim)
    eff_probs = strategy.participation_probs(sim.federation.probs)  # float64, as drawn
    t_start = time.perf_counter()
    warmup_time = _warmup(sim, config, strategy, state, ctx, progress) if strategy.warmup_cycles else 0.0

    schedule = participation_schedule(eff_probs, tr.rounds, config.seed)
    batch_gen, probe_gen = _torch_gen(config.seed, _BATCHES), _torch_gen(config.seed, _PROBE)
    forced_gen = _torch_gen(config.seed, _FORCED)
    prob_rng = rng(config.seed, _PROBE)
    weights = sim.initial_weights.clone()
    last_seen = np.full(ctx.num_clients, -1)
    memory = torch.zeros(ctx.num_clients, ctx.dim, device=device) if diag.probe_every else None
    tracked = list(diag.track_coords) if "coords" in state else []
    coords_history: dict[int, list[list[float]]] = {c: [] for c in tracked}
    history, probes, participation = [], [], []
    timing = {"client": 0.0, "server": 0.0, "eval": 0.0, "probe": 0.0, "warmup": warmup_time, "forced": 0.0}
    collapsed, collapse_round = False, None

    t0 = time.perf_counter()
    acc, loss = evaluate(sim.flat_model, weights, sim.eval_images, sim.eval_labels)
    timing["eval"] += time.perf_counter() - t0
    history.append({"round": 0, "num_active": 0, "accuracy": acc, "loss": loss, "train_loss": float("nan"), "update_norm": 0.0})
    bar = tqdm(range(tr.rounds), desc=config.method.label, disable=not progress, leave=False)
    for t in bar:
        active_ids = torch.nonzero(schedule[t]).flatten().tolist()
        participation.append(active_ids)
        t0 = time.perf_counter()
        updates, steps, losses = client_updates(sim, tr, weights, active_ids, batch_gen, strategy, state)
        timing["client"] += time.perf_counter() - t0
        active = torch.tensor(active_ids, dtype=torch.long, device=device)
        if diag.probe_every and t % diag.probe_every == 0:
            t0 = time.perf_counter()
            probes.extend(_probe(sim, config, strategy, state, ctx, weights, t, last_seen, memory, probe_gen, prob_rng))
            timing["probe"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        delta = strategy.aggregate(state, ctx, active, updates)
        # One pass, no (m, d) temporary: a NaN or inf anywhere makes the sum non-finite (so do
        # finite entries near the float32 limit, which only a diverged run produces).
        finite = bool(torch.isfinite(delta.sum())) and bool(torch.isfinite(updates.sum()))
        round_weights = weights  # w_t
        if finite:
            weights = weights - tr.server_lr * delta
            strategy.update(state, ctx, active, updates, steps, t)
        timing["server"] += time.perf_counter() - t0
        if not finite:
            collapsed, collapse_round = True, t + 1
            break
        forced = sorted(set(strategy.forced_clients(state, ctx, t)) - set(active_ids))
        if forced:  # updates at w_t that the strategy observes but never aggregates
            t0 = time.perf_counter()
            extra, _, _ = client_updates(sim, tr, round_weights, forced, forced_gen, strategy, state)
            strategy.observe(state, ctx, torch.tensor(forced, dtype=torch.long, device=device), extra, t)
            timing["forced"] += time.perf_counter() - t0
        if memory is not None and active_ids:
            memory[active] = updates
        last_seen[active_ids] = t
        for c in tracked:
            coords_history[c].append(state["coords"][c].tolist())
        row = {"round": t + 1, "num_active": len(active_ids), "accuracy": float("nan"), "loss": float("nan"),
               "train_loss": float(np.mean(losses)) if losses else float("nan"), "update_norm": float(delta.norm())}
        if (t + 1) % tr.eval_every == 0 or t + 1 > tr.rounds - tr.eval_last:
            t0 = time.perf_counter()
            row["accuracy"], row["loss"] = evaluate(sim.flat_model, weights, sim.eval_images, sim.eval_labels)
            timing["eval"] += time.perf_counter() - t0
            bar.set_postfix(acc=f"{row['accuracy']:.3f}")
        history.append(row)

    evaluated = [h for h in history if h["accuracy"] == h["accuracy"]]
    last_k = [h["accuracy"] for h in evaluated[-tr.eval_last:]] if tr.eval_last else [evaluated[-1]["accuracy"]]
    summary = {
        "final_accuracy": evaluated[-1]["accuracy"],
        "final_loss": evaluated[-1]["loss"],
        "mean_last_accuracy": float(np.mean(last_k)),
        "collapsed": collapsed,
        "collapse_round": collapse_round,
        "rounds_done": history[-1]["round"],
        "num_params": sim.flat_model.num_params,
        "dim": ctx.dim,
        "server_memory_bytes": strategy.memory_bytes(state),
        "wall_time": time.perf_counter() - t_start,
        "timing": timing,
    }
    extras: dict[str, Any] = {"participation": participation}
    if "core" in state:
        extras["core"] = state["core"].tolist()
        extras["swap_trace"] = state["swap_trace"]
    if tracked:
        extras["coords_history"] = {str(c): v for c, v in coords_history.items()}
    if probes:
        extras["probes"] = probes
    return RunResult(config=config.to_dict(), history=history, summary=summary, extras=extras)
