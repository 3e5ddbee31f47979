"""The rounds every method's Flower strategy shares (`MethodStrategy`; the methods are in `methods`).

The server arithmetic is the simulator's: each class drives the same `fedsteer_lib.strategy.Strategy`
(`aggregate`, `update`, the warm-up's `warmup_snapshot`, ...) that `simulator.engine` drives,
named in the one method registry (`experiments.registry.METHODS`), and steps
w_{t+1} = w_t - eta_s Delta_t once the new model passes `replies.Limits.step_problem`: a model
that is not finite, or that moves further than any one reply may, is not adopted, and the round
is skipped with a warning (the method's memory is not updated either).

Warm-up (paper §2.4; FedSteer, and FedVARP/MIFA as a fair start): the first `warmup_rounds`
rounds hold the warm-up model w^(c) fixed and send it to every connected node that has not
answered in cycle c. When every connected node has answered, `warmup_snapshot` runs on the
gradients (N, d) and w^(c+1) = w^(c) - eta_s sum_i d_i g_i^(c). After the last warm-up round the
core set and the caches come from what the strategy has (nodes that did not answer in the last
cycle have zero rows), `warmup_report` says how many nodes it saw, and training starts from the
initial model; so `start` refuses `num_rounds <= warmup_rounds`, which would return the initial
model. With every node answering, warm-up round c + 1 is the simulator's cycle c.

`start` is Flower's own `Strategy.start` (its loop, arguments and `Result`) with the state on
disk: Flower's loop calls `evaluate_fn` last in every round, so the strategy passes its own
(`_end_of_round`, which calls the user's after the warm-up) and writes the checkpoint there; a
resumed run passes through the rounds it has done (no messages). See `persist` for what a
checkpoint holds; loading one cannot run code (`checkpoint`).

Kernels: the server arithmetic uses torch's own kernels and touches nothing global, unless the
process selected pinned kernels (`fedsteer_lib.numerics.select_kernels("pinned")` before torch
computes); then each server call runs under `numerics.kernels_for_run` and computes the
simulator's bits.
"""
from __future__ import annotations

import contextlib
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from .. import numerics
from ..strategy import ServerContext
from .checkpoint import CheckpointError, check_writable, load_checkpoint, save_checkpoint
from .exchange import NodeExchange
from .persist import payload, restore
from .replies import valid_evaluation

__all__ = ["MethodStrategy", "server_kernels"]

_warned: set[str] = set()


@contextlib.contextmanager
def server_kernels() -> Iterator[None]:
    """Native kernels (nothing selected): nothing is touched. Pinned kernels (selected by the
    process): `numerics.kernels_for_run("cpu")` for the call (one thread, oneDNN and NNPACK off,
    restored after), or, if torch computed before the pin, a warning once and torch's kernels."""
    if numerics.kernels() != "pinned":
        yield
        return
    try:
        numerics.check_kernels("cpu")
    except numerics.NumericsError as err:
        if "kernels" not in _warned:
            log(WARNING, "fedsteer_lib.flower: %s; computing with torch's own kernels", err)
            _warned.add("kernels")
        yield
        return
    with numerics.kernels_for_run("cpu"):
        yield


def _whole(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    return value


class MethodStrategy(NodeExchange):
    """The rounds of every method class (see the module docstring); `NodeExchange` has the
    arguments, the nodes and the replies. After `start`, `warmup_report` says what the warm-up saw."""

    def _begin(self, initial_arrays: ArrayRecord | None) -> None:
        super()._begin(initial_arrays)
        self.cycle, self.warm, self.cycle_rows = 0, self.initial, {}  # warm-up: cycle, w^(c), {slot: g_i^(c)}
        self.warmup_report: dict[str, Any] | None = None
        self.result = Result()
        self._expected: list[int] = []  # warm-up: the slots that make the cycle complete
        self._grid: Grid | None = None
        self._config = ConfigRecord()  # this round's train config
        self._timeout: float | None = None
        self._in_round = False
        self._evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
        self._checkpoint: tuple[Path, int] | None = None  # (path, every)

    # --- Flower's hooks ---------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Warm-up rounds: w^(c) to every connected node that has not answered in cycle c.
        Training rounds: w_t to the sampled nodes (`sample`), with the method's local terms."""
        if server_round <= self._done_before:
            log(INFO, "round %d was done before the resume", server_round)
            return []
        if self.layout is None:
            self._begin(arrays)
        self._grid, self._config, self._in_round = grid, config, True
        nodes = self._connect(grid, server_round)
        if server_round <= self.warmup_rounds:
            log(INFO, "warm-up round %d of %d (cycle %d)", server_round, self.warmup_rounds, self.cycle)
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
        FedSteer), w_{t+1} = w_t - eta_s Delta_t if it passes the step check, then the method's
        `update` and, if it asks for them (`forced_clients`), the updates at w_t of more nodes."""
        if server_round <= self._done_before:
            return None, None
        replies = list(replies)
        if server_round <= self.warmup_rounds:
            return self._warmup_round(server_round, replies)
        t = server_round - self.warmup_rounds - 1  # the method's 0-based training round
        good = self._read(server_round, replies, "train")
        counts = {"num-sampled": len(self.round_log[-1]["sent"]), "num-active": len(good)}
        slots = sorted(good)
        for slot in slots:
            self.nodes.replied[slot] += 1
        ctx = self._context()
        updates = torch.stack([self.weights - good[s].weights for s in slots]) if slots else torch.zeros(0, ctx.dim)
        steps = torch.tensor([good[s].steps for s in slots], dtype=torch.float32)
        active = torch.tensor(slots, dtype=torch.long)
        with server_kernels():
            delta = self.core.aggregate(self.state, ctx, active, updates)
            new_weights = self.weights - self.server_lr * delta
        if (why := self.limits.step_problem(self.weights, new_weights)) is not None:
            log(WARNING, "round %d skipped: %s; the global model stays as it was", server_round, why)
            self.round_log[-1]["skipped"] = why
            return None, self._keep_train_metrics(server_round, {**counts, "skipped": 1})
        with server_kernels():
            self.core.update(self.state, ctx, active, updates, steps, t)
            self._forced(server_round, t, ctx, slots)
        self.weights = new_weights
        self.result.arrays = self.layout.record(new_weights, self.fixed)
        metrics = {**self._train_metrics([good[s].metrics for s in slots]), **counts, "update-norm": float(delta.norm())}
        return self.result.arrays, self._keep_train_metrics(server_round, metrics)

    def _keep_train_metrics(self, server_round: int, metrics: dict[str, Any]) -> MetricRecord:
        record = MetricRecord(metrics)
        self.result.train_metrics_clientapp[server_round] = record
        return record

    def _train_metrics(self, replies: list[dict[str, Any]]) -> dict[str, Any]:
        """The replies' metrics, aggregated by `train_metrics_aggr_fn` (Flower's weighted mean by
        default) where they have the same keys; {} otherwise."""
        if not replies or any(set(r) != set(replies[0]) for r in replies):
            return {}
        try:
            return dict(self.train_metrics_aggr_fn([_metrics(r) for r in replies], self.weighted_by_key))
        except Exception as err:  # noqa: BLE001 - metrics are reports: never a reason to end the run
            log(WARNING, "the replies' train metrics could not be aggregated (%s: %s)", type(err).__name__, err)
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
            with server_kernels():
                self.core.warmup_snapshot(self.state, ctx, grads, self.cycle, last=last)
                warm = self.warm - self.server_lr * (ctx.weights @ grads) if not last else self.warm
            if (why := self.limits.step_problem(self.warm, warm)) is not None:  # the next cycle's model (§2.4)
                log(WARNING, "round %d: the warm-up model stays w^(%d): %s", server_round, self.cycle, why)
            else:
                self.warm = warm
            if last:
                self.warmup_report = {"cycles": self.cycle + 1, "last_cycle_complete": complete,
                                      "nodes_answered_last_cycle": len(self.cycle_rows), "nodes_known": len(self.nodes),
                                      "nodes_answered_ever": sum(1 for n in self.nodes.examples if n > 0)}
                log(INFO, "%s warm-up: %d cycle(s), the last %s (%d of %d known nodes answered)", type(self).__name__,
                    self.cycle + 1, "complete" if complete else "incomplete", len(self.cycle_rows), len(self.nodes))
            self.cycle, self.cycle_rows = self.cycle + 1, {}
        self.result.arrays = self.layout.record(self.initial, self.fixed)  # training starts from w_0
        return self.result.arrays, self._keep_train_metrics(server_round, metrics)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Flower's client-side evaluation, after training rounds only (the warm-up keeps w_0)."""
        if server_round <= max(self.warmup_rounds, self._done_before):
            return []
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Flower's weighted mean of the evaluation replies' metrics, over the replies that pass
        `replies.valid_evaluation` (the others are logged); never an error that ends the run."""
        usable, unusable = valid_evaluation(list(replies), self.weighted_by_key, self.limits)
        for node, why in unusable.items():
            log(WARNING, "round %d: the evaluation reply of node %d is not used (%s)", server_round, node, why)
        if not usable:
            return None
        try:
            metrics = self.evaluate_metrics_aggr_fn(usable, self.weighted_by_key)
        except Exception as err:  # noqa: BLE001 - metrics are reports: never a reason to end the run
            log(WARNING, "round %d: evaluation metrics not aggregated (%s: %s)", server_round, type(err).__name__, err)
            return None
        self.result.evaluate_metrics_clientapp[server_round] = metrics
        return metrics

    def summary(self) -> None:
        log(INFO, "\t├──> %s (%s): %s", type(self).__name__, self.method,
            ", ".join(f"{k}={v}" for k, v in sorted(self.spec.values.items())) or "no parameters")
        log(INFO, "\t├──> server_lr=%s, participation=%s, seed=%d, %s", self.server_lr, self.participation, self.seed,
            self.limits)
        super().summary()

    # --- Flower's loop, with checkpoints ------------------------------------------------------------
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None, *,
              checkpoint_path: str | Path | None = None, checkpoint_every: int = 1,
              resume_from: str | Path | None = None) -> Result:
        """Flower's `Strategy.start` (the same arguments, loop and `Result`), plus the state on
        disk: with `checkpoint_path`, the strategy's state is written there atomically every
        `checkpoint_every` rounds and when `start` ends; `resume_from` continues the run of such
        a file (`initial_arrays` must hold the same model layout). The first `warmup_rounds` of
        `num_rounds` are the warm-up, so `num_rounds` must be larger; neither `evaluate_fn` nor
        the client-side evaluation runs during them. The arguments, the checkpoint path and the
        checkpoint to resume from are checked before round 1."""
        _whole(num_rounds, "num_rounds", 1)
        if num_rounds <= self.warmup_rounds:
            raise ValueError(f"{type(self).__name__}: num_rounds={num_rounds} must be larger than "
                             f"warmup_rounds={self.warmup_rounds}: the first {self.warmup_rounds} rounds are the "
                             f"warm-up and training starts after them, so this run would return the initial model")
        _whole(checkpoint_every, "checkpoint_every", 1)
        checkpoint_path = None if checkpoint_path is None else check_writable(checkpoint_path)
        saved = None if resume_from is None else load_checkpoint(resume_from)
        self._begin(initial_arrays)
        if saved is not None:
            restore(self, saved, resume_from)
            log(INFO, "Resumed from %s after round %d", resume_from, self.round)
        self._done_before, self._timeout, self._evaluate_fn = self.round, timeout, evaluate_fn
        self._checkpoint = None if checkpoint_path is None else (checkpoint_path, checkpoint_every)
        self.result.arrays = self.layout.record(self.weights, self.fixed)  # until a round moves it
        try:
            super().start(grid, self.result.arrays, num_rounds, timeout, train_config, evaluate_config,
                          self._end_of_round)
        finally:
            if checkpoint_path is not None and not self._in_round:
                self._save_or_log(checkpoint_path)  # on exit; a round cut short leaves the last round's file
        return self.result

    def _end_of_round(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Flower's `evaluate_fn` call, the last step of its round 0 (the initial model) and of
        every round: the user's `evaluate_fn` (not in the warm-up), then the checkpoint."""
        if self._done_before and server_round <= self._done_before:
            return None
        res = None
        if self._evaluate_fn is not None and (server_round == 0 or server_round > self.warmup_rounds):
            res = self._evaluate_fn(server_round, arrays)
            if res is not None:
                self.result.evaluate_metrics_serverapp[server_round] = res
        if server_round == 0:
            return res
        self.round, self._in_round = server_round, False
        if self._checkpoint is not None and server_round % self._checkpoint[1] == 0:
            self._save_or_log(self._checkpoint[0])
        return res

    def save(self, path: str | Path) -> None:
        """Write the strategy's state after `self.round` rounds to `path`, atomically (`persist`)."""
        save_checkpoint(path, payload(self))

    def _save_or_log(self, path: Path) -> None:
        try:
            self.save(path)
        except CheckpointError as err:  # a full disk: the run goes on, the last checkpoint written stays
            log(ERROR, "%s; the run goes on, and the last checkpoint written stays as it was", err)


def _metrics(values: dict[str, Any]) -> RecordDict:
    return RecordDict({"metrics": MetricRecord(values)})
