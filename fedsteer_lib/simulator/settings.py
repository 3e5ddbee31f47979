"""The settings of one simulated FL system and its training, validated before any compute.

`FLSystem` is the federation of paper §2.1 and §4.1, `Training` the local SGD and server step,
`Diagnostics` the extra measurements of the book's figures. `experiments.config.RunConfig`
bundles them with a method, a data set and a seed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["ConfigError", "FLSystem", "Training", "Diagnostics", "check", "is_int", "is_real"]


SEED_LIMIT = 2**64  # torch seeds its generators with a 64-bit unsigned integer

class ConfigError(ValueError):
    """A setting is outside its allowed range; the message names the field and the range.

    A user's mistake, so in a notebook (IPython, papermill, nbval) the failing cell shows this
    one line, not a traceback that ends with it: IPython renders an exception by its
    `_render_traceback_` when it has one."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def check(cond: bool, field_name: str, allowed: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"{field_name} must be {allowed}, got {value!r}")


def is_int(value: Any) -> bool:
    """An integer, and not a boolean (True is an int to Python, not to a config)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite real number (not a boolean, inf or nan)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class FLSystem:
    """The simulated FL system of paper §2.1 and §4.1.

    A fraction `weak_fraction` of the clients is weak (participation probability
    `weak_prob`), the rest powerful (`powerful_prob`); these groups are drawn independently
    of the data groups. A fraction `gamma` of the clients (common-label group) gets
    floor(points_scale / gamma) points from the first half of the labels, the others
    (rare-label group) floor(points_scale / (1 - gamma)) points from the second half.
    """

    num_clients: int = 100
    weak_fraction: float = 0.5
    weak_prob: float = 0.04
    powerful_prob: float = 0.16
    gamma: float = 0.9
    points_scale: int = 50
    validation_size: int = 0  # > 0: hold this many training images out as the evaluation set

    def validate(self) -> None:
        check(is_int(self.num_clients) and self.num_clients >= 2, "num_clients", "an integer >= 2", self.num_clients)
        check(is_real(self.weak_fraction) and 0.0 <= self.weak_fraction <= 1.0, "weak_fraction", "in [0, 1]", self.weak_fraction)
        check(is_real(self.weak_prob) and 0.0 < self.weak_prob <= 1.0, "weak_prob", "in (0, 1]", self.weak_prob)
        check(is_real(self.powerful_prob) and 0.0 < self.powerful_prob <= 1.0, "powerful_prob", "in (0, 1]", self.powerful_prob)
        check(is_real(self.gamma) and 0.0 < self.gamma < 1.0, "gamma", "in (0, 1)", self.gamma)
        check(is_int(self.points_scale) and self.points_scale >= 1, "points_scale", "an integer >= 1", self.points_scale)
        common = round(self.gamma * self.num_clients)
        check(0 < common < self.num_clients, "gamma",
               f"such that both label groups are non-empty for num_clients={self.num_clients}", self.gamma)
        check(is_int(self.validation_size) and self.validation_size >= 0, "validation_size", "an integer >= 0", self.validation_size)


@dataclass(frozen=True)
class Training:
    """Local training (E epochs of minibatch SGD) and the server step w <- w - eta_s * Delta."""

    rounds: int = 150
    local_epochs: int = 2
    batch_size: int = 32
    client_lr: float = 0.05
    server_lr: float = 1.0
    eval_every: int = 5
    eval_last: int = 10

    def validate(self) -> None:
        for name in ("rounds", "local_epochs", "batch_size", "eval_every"):
            value = getattr(self, name)
            check(is_int(value) and value >= 1, name, "an integer >= 1", value)
        check(is_int(self.eval_last) and self.eval_last >= 0, "eval_last", "an integer >= 0", self.eval_last)
        check(is_real(self.client_lr) and self.client_lr > 0, "client_lr", "a finite number > 0", self.client_lr)
        check(is_real(self.server_lr) and self.server_lr > 0, "server_lr", "a finite number > 0", self.server_lr)

    def evaluates(self, round_number: int) -> bool:
        """Whether the model after round `round_number` (1..rounds) is evaluated: every
        `eval_every`-th round, each of the last `eval_last` rounds, and always the last round, so
        that a run's final accuracy is that of the model it ends with."""
        return (round_number % self.eval_every == 0 or round_number > self.rounds - self.eval_last
                or round_number == self.rounds)


@dataclass(frozen=True)
class Diagnostics:
    """Extra measurements (paper-book figures); never fed back into training.

    probe_every: every this many rounds (0: never) compute every client's true update at w_t.
    track_coords: FedSteer clients whose coordinates s_i are recorded every round (Fig. 8).
    """

    probe_every: int = 0
    probe_mc_samples: int = 200
    track_coords: tuple[int, ...] = ()

    def validate(self) -> None:
        check(is_int(self.probe_every) and self.probe_every >= 0, "probe_every", "an integer >= 0", self.probe_every)
        check(is_int(self.probe_mc_samples) and self.probe_mc_samples >= 2, "probe_mc_samples", "an integer >= 2", self.probe_mc_samples)
