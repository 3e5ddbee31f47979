"""What the server accepts from a node: the checks a reply must pass to count as an active client.

A reply that fails one is an inactive client that round (logged with the node and the reason),
exactly like a reply that never came; no reply can end the run. With `Limits`' defaults:

- `num-examples` n_i: a finite number in (0, max_examples], max_examples = 1e9. A node that
  lies about its size within the bound gets the weight d_i it claims, as in Flower's FedAvg.
- `participation-prob` p_i (optional): a finite number in [min_participation, 1],
  min_participation = 0.01. The unbiased estimators weigh a reply by d_i / p_i (Eq. 4), so
  the floor caps what one declaration can amplify (at most 100 d_i); observed rates are
  floored the same way.
- the update g_i = w_t - w_i: finite, and ||g_i|| <= max_update_ratio * max(||w_t||, 1),
  max_update_ratio = 10 (w_t: the model the node was sent; the 1 covers a model that starts at
  zero). The bound follows the current model, not the other replies of the round, so it holds
  with two nodes, one of them hostile. Honest local training moves a model by a fraction of
  its norm per round.
- SCAFFOLD's `num-steps` K and `lr`: finite and positive, and so their product.

The server's own step gets the same bound (`step_problem`): a new global model that is not
finite, or that moves more than max_update_ratio * max(||w_t||, 1), is not adopted; the round
is skipped with a warning. These checks keep one reply from breaking the run or blowing the
model up; a node that poisons the model slowly, within the bounds, needs a robust aggregation
rule, which none of the book's methods is.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import Message, RecordDict

from .records import Layout

__all__ = ["Limits", "Reply", "parse_reply", "valid_evaluation", "number"]

PARTICIPATION_KEY = "participation-prob"  # a node's p_i, in its reply metrics


def number(value: Any) -> float | None:
    """`value` as a finite float, None if it is not a finite real number (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Limits:
    """The bounds a reply must keep (see the module docstring)."""

    max_examples: float = 1e9
    min_participation: float = 0.01
    max_update_ratio: float = 10.0

    def __post_init__(self) -> None:
        for name, low, high in (("max_examples", 0.0, math.inf), ("min_participation", 0.0, 1.0),
                                ("max_update_ratio", 0.0, math.inf)):
            value = number(getattr(self, name))
            if value is None or not low < value <= high:
                raise ValueError(f"{name} must be a finite number in ({low}, {high}], got {getattr(self, name)!r}")

    def update_bound(self, model: torch.Tensor) -> float:
        """The largest update norm accepted against model w_t: max_update_ratio * max(||w_t||, 1)."""
        return self.max_update_ratio * max(float(torch.linalg.vector_norm(model.double())), 1.0)

    def step_problem(self, old: torch.Tensor, new: torch.Tensor) -> str | None:
        """Why the server must not adopt model `new` after `old` (None: it may)."""
        if not bool(torch.isfinite(new).all()):
            return "the new model is not finite"
        step, bound = float(torch.linalg.vector_norm((new - old).double())), self.update_bound(old)
        if not step <= bound:
            return f"the step's norm {step:.3g} exceeds {bound:.3g} (max_update_ratio * max(||w||, 1))"
        return None


@dataclass
class Reply:
    weights: torch.Tensor  # w_i, flat
    examples: float  # n_i
    prob: float | None  # its participation-prob, if reported
    steps: float  # K_i * lr_i (SCAFFOLD), else 0
    metrics: dict[str, Any]


def parse_reply(content: RecordDict, layout: Layout, sent: torch.Tensor, limits: Limits, *, arrays_key: str,
                examples_key: str, needs_steps: bool) -> tuple[str | None, Reply | None]:
    """A reply's model and metrics, checked against the model `sent` to the node, or why it
    cannot be used (see the module docstring)."""
    arrays = content.array_records
    record = arrays.get(arrays_key) or (next(iter(arrays.values())) if len(arrays) == 1 else None)
    if record is None:
        return f"no ArrayRecord {arrays_key!r}", None
    if (why := layout.mismatch(record)) is not None:
        return why, None
    metrics = next(iter(content.metric_records.values()), None)
    if metrics is None or examples_key not in metrics:
        return f"no metric {examples_key!r}", None
    examples = number(metrics[examples_key])
    if examples is None or not 0 < examples <= limits.max_examples:
        return f"{examples_key}={metrics[examples_key]!r} is not a number in (0, {limits.max_examples:g}]", None
    prob = metrics.get(PARTICIPATION_KEY)
    if prob is not None:
        prob = number(prob)
        if prob is None or not limits.min_participation <= prob <= 1:
            return (f"{PARTICIPATION_KEY}={metrics[PARTICIPATION_KEY]!r} is not a number in "
                    f"[{limits.min_participation:g}, 1]"), None
    steps = 0.0
    if needs_steps:
        k, lr = number(metrics.get("num-steps")), number(metrics.get("lr"))
        if k is None or lr is None or not (k > 0 and lr > 0):
            return "SCAFFOLD needs the metrics 'num-steps' and 'lr' (finite, positive)", None
        steps = float(torch.tensor(k) * torch.tensor(lr))  # K * eta_l as the engine computes it (float32)
        if not (math.isfinite(steps) and steps > 0):
            return f"num-steps * lr = {k:g} * {lr:g} is not a positive float32 number", None
    try:
        weights = layout.flat(record)
    except (ValueError, TypeError) as err:
        return f"unreadable arrays ({err})", None
    if not bool(torch.isfinite(weights).all()):
        return "non-finite model", None
    norm, bound = float(torch.linalg.vector_norm((sent - weights).double())), limits.update_bound(sent)
    if not norm <= bound:
        return f"update norm {norm:.3g} exceeds {bound:.3g} (max_update_ratio * max(||w||, 1))", None
    return None, Reply(weights, examples, prob, steps, dict(metrics))


def valid_evaluation(replies: list[Message], examples_key: str, limits: Limits) -> tuple[list[RecordDict], dict[int, str]]:
    """The evaluation replies Flower's metric aggregation can use (no error; one MetricRecord
    with a valid `examples_key` and finite numbers, with the keys most replies have), and why
    each other one cannot, by node id."""
    usable, why = [], {}
    for msg in replies:
        node = msg.metadata.src_node_id
        if msg.has_error():
            why[node] = f"error: {msg.error.reason}"
            continue
        records = list(msg.content.metric_records.values())
        if len(records) != 1:
            why[node] = f"{len(records)} MetricRecords, expected 1"
            continue
        examples = number(records[0].get(examples_key))
        values = [v for value in records[0].values() for v in (value if isinstance(value, list) else [value])]
        if examples is None or not 0 < examples <= limits.max_examples or any(number(v) is None for v in values):
            why[node] = f"{examples_key} out of range or a metric that is not a finite number"
            continue
        usable.append((node, msg.content, frozenset(records[0].keys())))
    common = Counter(keys for _, _, keys in usable).most_common(1)
    for node, _, keys in usable:
        if keys != common[0][0]:
            why[node] = f"metrics {sorted(keys)}, most replies have {sorted(common[0][0])}"
    return [content for _, content, keys in usable if keys == common[0][0]], why
