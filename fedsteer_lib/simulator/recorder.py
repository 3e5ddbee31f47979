"""What a run records besides training: wall time per phase, the per-round history, the
probes of the book's diagnostics figures, and whatever the strategy asks to keep.

The engine hands every measurement to a `Recorder`; the recorder never changes training.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import torch

from ..projection import update_variance
from ..strategy import ServerContext, Strategy

__all__ = ["Recorder", "probe_rows"]


class Recorder:
    """Timing, history, participation, probes and the strategy's own records of one run."""

    def __init__(self, strategy: Strategy, tracked_clients: tuple[int, ...] = (), memory: torch.Tensor | None = None):
        self.strategy = strategy
        self.tracked = list(tracked_clients)
        self.timing = {"client": 0.0, "server": 0.0, "eval": 0.0, "probe": 0.0, "warmup": 0.0, "forced": 0.0}
        self.history: list[dict[str, Any]] = []
        self.participation: list[list[int]] = []
        self.probes: list[dict[str, Any]] = []
        self.traces: dict[str, dict[int, list[list[float]]]] = {}
        self.memory = memory  # every client's last update, for the probes' staleness measures
        self.last_seen: np.ndarray | None = None
        self.started = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Adds the wall time of the block to `timing[name]`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timing[name] += time.perf_counter() - t0

    def round_done(self, state: Any, active: torch.Tensor, active_ids: list[int], updates: torch.Tensor, row: dict) -> None:
        """After round t: the clients' staleness bookkeeping, the strategy's per-round records
        and the history row."""
        if self.memory is not None and active_ids:
            self.memory[active] = updates
        if self.last_seen is not None:
            self.last_seen[active_ids] = row["round"] - 1
        for name, per_client in self.strategy.record_round(state, self.tracked).items():
            for client, values in per_client.items():
                self.traces.setdefault(name, {}).setdefault(client, []).append(values)
        self.history.append(row)

    def summary(self, eval_last: int, collapsed: bool, collapse_round: int | None, state: Any,
                num_params: int, dim: int) -> dict[str, Any]:
        evaluated = [h for h in self.history if h["accuracy"] == h["accuracy"]]
        last_k = [h["accuracy"] for h in evaluated[-eval_last:]] if eval_last else [evaluated[-1]["accuracy"]]
        if collapsed:  # the diverged model is the one of every remaining round, the last ones included
            last_k = [evaluated[-1]["accuracy"]]
        return {
            "final_accuracy": evaluated[-1]["accuracy"],
            "final_loss": evaluated[-1]["loss"],
            "mean_last_accuracy": float(np.mean(last_k)),
            "collapsed": collapsed,
            "collapse_round": collapse_round,
            # the last accuracy measured before the collapse (None for a run that did not collapse)
            "accuracy_before_collapse": evaluated[-2]["accuracy"] if collapsed else None,
            "rounds_done": collapse_round - 1 if collapsed else self.history[-1]["round"],
            "num_params": num_params,
            "dim": dim,
            "server_memory_bytes": self.strategy.memory_bytes(state),
            "wall_time": time.perf_counter() - self.started,
            "timing": self.timing,
        }

    def extras(self, state: Any) -> dict[str, Any]:
        extras: dict[str, Any] = {"participation": self.participation, **self.strategy.record_final(state)}
        for name, per_client in self.traces.items():
            extras[f"{name}_history"] = {str(c): v for c, v in per_client.items()}
        if self.probes:
            extras["probes"] = self.probes
        return extras


def probe_rows(true: torch.Tensor, strategy: Strategy, state: Any, ctx: ServerContext, t: int,
               last_seen: np.ndarray, memory: torch.Tensor, samples: int, draw: Callable[[int], np.ndarray]) -> list[dict]:
    """Diagnostics at w_t from every client's true update `true` (N, d): the aggregation
    variance of the method's estimator (Monte Carlo over `samples` participation draws; exact
    where Eq. 4's form applies, Theorem 1) and the directional misalignment of stale and
    estimated updates. `draw(n)` returns n uniform numbers (the probe's own random stream)."""
    n = ctx.num_clients
    target = ctx.weights @ true
    probs = ctx.probs.double().cpu().numpy()
    mean = torch.zeros_like(target, dtype=torch.float64)
    sq_err, sq_norm = 0.0, 0.0
    for _ in range(samples):
        active = torch.from_numpy(np.nonzero(draw(n) < probs)[0]).to(true.device)
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
