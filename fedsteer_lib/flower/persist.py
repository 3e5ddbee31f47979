"""A strategy's state as a checkpoint's plain data (`payload`) and back (`restore`).

What a checkpoint holds (format 2): the strategy's identity (class, method, parameters, server
lr, participation, seed, sampling and reply limits), the server round, the model layout, the
arrays that are not floating point, w_0, w_t, the node table, the method's state (FedSteer's
core set, basis, coordinates; FedVARP/FedStale/MIFA's memories; SCAFFOLD's control variates),
the sampling generator's state, the warm-up's cycle, model and gradients, the results so far and
the round log. Only tensors, numbers, strings, lists and dicts (`checkpoint`); `restore` checks
every part against what this strategy makes itself before it uses any.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from flwr.app import MetricRecord

from .checkpoint import FORMAT, CheckpointError, from_plain, to_plain
from .nodes import NodeTable
from .records import Layout

# A driver.MethodStrategy; not imported, since driver imports this module (no cycle, even for types).
MethodStrategy = Any

__all__ = ["identity", "payload", "restore"]

RESULT_FIELDS = ("train_metrics_clientapp", "evaluate_metrics_clientapp", "evaluate_metrics_serverapp")


def identity(strategy: MethodStrategy) -> dict[str, Any]:
    """What a checkpoint must have been written by: the strategy's class and settings."""
    return {"strategy": type(strategy).__name__, "method": strategy.method, "params": dict(strategy.spec.values),
            "server_lr": strategy.server_lr, "participation": strategy.participation, "seed": strategy.seed,
            "fraction_train": strategy.fraction_train, "min_train_nodes": strategy.min_train_nodes,
            "limits": dataclasses.asdict(strategy.limits)}


def payload(strategy: MethodStrategy) -> dict[str, Any]:
    """The strategy's state after `strategy.round` rounds, as plain data."""
    s = strategy
    result = {name: {r: dict(m) for r, m in getattr(s.result, name).items()} for name in RESULT_FIELDS}
    return {
        "format": FORMAT, "identity": identity(s), "round": s.round, "layout": s.layout.to_plain(),
        "fixed": s.layout.fixed_to_plain(s.fixed), "initial": s.initial, "weights": s.weights,
        "nodes": s.nodes.to_plain(), "state": to_plain(s.state), "rng": s.rng.bit_generator.state,
        "warmup": {"cycle": s.cycle, "warm": s.warm, "rows": dict(s.cycle_rows), "report": s.warmup_report},
        "result": result, "round_log": to_plain(s.round_log)}


def restore(strategy: MethodStrategy, saved: dict[str, Any], path: str | Path) -> None:
    """Put the state of checkpoint `saved` (read from `path`) into `strategy`, whose `_begin`
    has run with the run's initial arrays. CheckpointError, naming the file, when the
    checkpoint is of another strategy, another model, or damaged."""
    s = strategy
    if saved.get("identity") != identity(s):
        raise CheckpointError(f"checkpoint {path} is of another strategy or other settings: "
                              f"{saved.get('identity')}, this strategy is {identity(s)}")
    try:
        if Layout.from_plain(saved["layout"]) != s.layout:
            raise CheckpointError(f"checkpoint {path} holds another model (its arrays differ from initial_arrays')")
        _restore(s, saved)
    except CheckpointError:
        raise
    except Exception as err:  # noqa: BLE001 - a damaged file is one line, whatever is wrong in it
        raise CheckpointError(f"checkpoint {path} is damaged: {type(err).__name__}: {err}") from None


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} is {value!r}, expected a count")
    return value


def _restore(s: MethodStrategy, saved: dict[str, Any]) -> None:
    fixed = s.layout.fixed_from_plain(saved["fixed"])
    initial = from_plain(saved["initial"], s.initial, "initial")
    weights = from_plain(saved["weights"], s.initial, "weights")
    nodes = NodeTable.from_plain(saved["nodes"])
    s.fixed, s.initial, s.weights, s.nodes = fixed, initial, weights, nodes
    fresh = s.core.init_state(s._context()) if len(nodes) else None  # the method's own state, as a template
    s.state = from_plain(saved["state"], fresh, "state")
    s.round = _count(saved["round"], "round")
    s.rng.bit_generator.state = saved["rng"]
    warm = saved["warmup"]
    s.cycle = _count(warm["cycle"], "warm-up cycle")
    s.warm = from_plain(warm["warm"], s.initial, "warm-up model")
    rows = warm["rows"]
    if not (isinstance(rows, dict) and all(isinstance(k, int) and 0 <= k < len(nodes) for k in rows)):
        raise ValueError("the warm-up's gradients are not keyed by node slots")
    s.cycle_rows = {k: from_plain(v, s.initial, f"warm-up gradient {k}") for k, v in rows.items()}
    report = warm["report"]
    if report is not None and not (isinstance(report, dict) and all(isinstance(v, (int, bool)) for v in report.values())):
        raise ValueError("the warm-up report is not a dict of counts")
    s.warmup_report = report
    for name in RESULT_FIELDS:
        rounds = saved["result"][name]
        getattr(s.result, name).update({_count(r, f"{name} round"): MetricRecord(m) for r, m in rounds.items()})
    s.result.arrays = s.layout.record(s.weights, s.fixed)
    s.round_log = from_plain(saved["round_log"], [], "round log")
    if not all(isinstance(e, dict) for e in s.round_log):
        raise ValueError("the round log is not a list of dicts")
    if not all(bool(torch.isfinite(v).all()) for v in (s.weights, s.initial, s.warm)):
        raise ValueError("the models are not finite")
