"""The one registry of methods: everything that names a method comes from here.

For every method: its `Strategy` class, its parameters (default, allowed values, and whether
it was added after results were first cached), its display name and colour. For the book:
the named rows ("roles") of Table 1 and of the conventions table, each a method with some
parameters fixed. Adding a method is one `MethodInfo` entry in `METHODS` below (plus its
`Strategy` class and its test); config validation, result keys, run tables, display names,
colours and the sweep's CLI all read it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..fedsteer import FedSteer
from ..simulator.baselines import (FedAvg, FedAvgUnbiased, FedProx, FedStale, FedVARP, FullParticipation, MIFA,
                                   Scaffold)
from ..simulator.settings import is_int, is_real
from ..strategy import Strategy

__all__ = ["Param", "MethodInfo", "METHODS", "Role", "ROLES", "TABLE1_ROLES", "FRAMEWORK_ROLES", "BASELINE_ROLES",
           "role_of", "display_name", "colour", "style", "make_strategy", "ORDERINGS", "SELECTIONS", "WEIGHTINGS",
           "MIFA_STARTS"]

ORDERINGS = ("unbiased", "as_written")
SELECTIONS = ("greedy", "random")
# How FedAvg-style rules weight the active clients: "normalized" = sum_A d_i g_i / sum_A d_i (the
# FedProx / NIID-Bench convention), "unbiased" = sum_A (d_i / p_i) g_i (the FedStale code base's).
WEIGHTINGS = ("normalized", "unbiased")
MIFA_STARTS = ("zero", "wait_all")


@dataclass(frozen=True)
class Param:
    """A method parameter. `ok(value, num_clients)` says whether a value is allowed and
    `allowed` says so in words; `late`: added after results were cached, so it is left out
    of a run's key while at its default (earlier results keep their names)."""

    default: Any
    ok: Callable[[Any, int], bool]
    allowed: str
    late: bool = False


def _one_of(values: tuple, default: Any, late: bool = False) -> Param:
    return Param(default, lambda v, n: v in values, f"one of {values}", late)


def _int(default: int, low: int = 0, late: bool = False) -> Param:
    return Param(default, lambda v, n: is_int(v) and v >= low,
                 f"an integer >= {low}", late)


def _real(default: float, low: float = 0.0, high: float | None = None) -> Param:
    allowed = f"in [{low:g}, {high:g}]" if high is not None else f"a finite number >= {low:g}"
    return Param(default, lambda v, n: is_real(v) and low <= v and (high is None or v <= high), allowed)


_CORE = Param(40, lambda v, n: is_int(v) and 1 <= v <= n, "an integer in [1, num_clients]")
_SUBSAMPLE = Param(0, lambda v, n: is_int(v) and (v == 0 or 1 <= v <= n), "0 (off) or an integer in [1, num_clients]")


@dataclass(frozen=True)
class MethodInfo:
    name: str
    strategy: type[Strategy]
    display: str
    colour: str
    params: Mapping[str, Param] = field(default_factory=dict)
    summary: str = ""

    @property
    def defaults(self) -> dict[str, Any]:
        return {k: p.default for k, p in self.params.items()}


# In the book's order. One colour per method for the whole book, each in a hue family of its own
# (vermillion, blue, teal, green, gold, olive, pink, purple; full participation black), so that
# no two methods are told apart by shade alone; FedSteer is always vermillion. Grey is no
# method's: the schematics draw in greys (`book.figures.style.SCHEMATIC`).
METHODS: dict[str, MethodInfo] = {m.name: m for m in [
    MethodInfo("full", FullParticipation, "Full participation", "#000000",
               summary="every client every round (the upper bound)"),
    MethodInfo("fedsteer", FedSteer, "FedSteer", "#D55E00", {
        "core_size": _CORE, "lam": _real(0.5), "refresh_every": _int(1, low=1),
        "ordering": _one_of(ORDERINGS, "unbiased"), "warmup_cycles": _int(5), "max_swaps": _int(5),
        "subsample": _SUBSAMPLE, "selection": _one_of(SELECTIONS, "greedy"), "enforce_every": _int(0, late=True)},
        summary="corrective projections onto the core set's subspace (Eq. 4)"),
    MethodInfo("fedavg", FedAvg, "FedAvg", "#0072B2",
               summary="normalised average of the active clients (the tables' FedAvg)"),
    MethodInfo("fedavg_unbiased", FedAvgUnbiased, "FedAvg (unbiased)", "#44AA99",
               summary="sum over the active clients of d_i / p_i g_i"),
    MethodInfo("fedvarp", FedVARP, "FedVARP", "#228833", {"warmup_cycles": _int(0)},
               summary="SAGA-like control variate from every client's last update; warm-up > 0: fair start"),
    MethodInfo("fedstale", FedStale, "FedStale", "#B8A000", {"beta": _real(0.7, 0.0, 1.0)},
               summary="FedVARP with the stale part down-weighted by beta"),
    MethodInfo("mifa", MIFA, "MIFA", "#CC79A7",
               {"warmup_cycles": _int(0), "start": _one_of(MIFA_STARTS, "zero", late=True)},
               summary="average of every client's last update; start=wait_all: MIFA's fdu.py"),
    MethodInfo("scaffold", Scaffold, "SCAFFOLD", "#6A3D9A", {"weighting": _one_of(WEIGHTINGS, "normalized", late=True)},
               summary="control variates c, c_i correct the local steps"),
    MethodInfo("fedprox", FedProx, "FedProx", "#6B8E23",
               {"mu": _real(0.1), "weighting": _one_of(WEIGHTINGS, "normalized", late=True)},
               summary="proximal term (mu/2)||w - w_t||^2 in the local objective"),
]}


@dataclass(frozen=True)
class Role:
    """A named row of a results table: a method with some parameters `fixed`; the parameters in
    `free` may take any value (FedStale's beta, FedSteer's warm-up length); every other
    parameter must be at its default, FedSteer's |X| and lambda at the data set's. It is drawn
    in its method's colour, with its own marker and line style (`style`)."""

    key: str
    display: str
    method: str
    fixed: Mapping[str, Any] = field(default_factory=dict)
    free: tuple[str, ...] = ()
    marker: str = "o"
    linestyle: str = "-"

    def matches(self, name: str, params: Mapping[str, Any], dataset_defaults: Mapping[str, Any] | None = None) -> bool:
        if name != self.method:
            return False
        expected = {**METHODS[name].defaults, **(dataset_defaults or {}), **self.fixed}
        return all(params.get(k, v) == v for k, v in expected.items() if k not in self.free)


_STEER = ("warmup_cycles",)
ROLES: dict[str, Role] = {r.key: r for r in [
    Role("full", "Full participation", "full", marker="", linestyle="--"),
    Role("fedsteer", "FedSteer", "fedsteer", free=_STEER, marker="o"),
    Role("fedsteer_enforce5", "FedSteer (enforce=5)", "fedsteer", {"refresh_every": 5}, _STEER, marker="s", linestyle="-."),
    Role("fedavg", "FedAvg", "fedavg", marker="v"),
    Role("fedavg_unbiased", "FedAvg (unbiased)", "fedavg_unbiased", marker="^"),
    Role("fedvarp", "FedVARP", "fedvarp", marker="D"),
    Role("fedstale", "FedStale (best β)", "fedstale", free=("beta",), marker="P"),
    Role("mifa", "MIFA", "mifa", marker="X"),
    Role("scaffold", "SCAFFOLD", "scaffold", marker="*"),
    Role("fedprox", "FedProx", "fedprox", marker="h"),
    # the FedStale code base's conventions (the appendix) and the paper's other reading of Algorithm 2
    Role("fedsteer_as_written", "FedSteer (as written)", "fedsteer", {"ordering": "as_written"}, _STEER, marker="d",
         linestyle=":"),
    Role("fedprox_unbiased", "FedProx (unbiased)", "fedprox", {"weighting": "unbiased"}, marker="H", linestyle=":"),
    Role("scaffold_unbiased", "SCAFFOLD (unbiased)", "scaffold", {"weighting": "unbiased"}, marker="p", linestyle=":"),
    Role("mifa_wait_all", "MIFA (wait for all)", "mifa", {"start": "wait_all"}, marker="x", linestyle=":"),
]}
# The rows of the paper's Table 1, in the book's order.
TABLE1_ROLES: tuple[str, ...] = ("full", "fedsteer", "fedsteer_enforce5", "fedavg", "fedavg_unbiased", "fedvarp",
                                 "fedstale", "mifa", "scaffold", "fedprox")
# The baselines of Table 1: "the best baseline" is the one of these with the highest mean (FedStale
# at its best β), full participation being the upper bound and FedSteer's variants the method.
BASELINE_ROLES: tuple[str, ...] = ("fedavg", "fedavg_unbiased", "fedvarp", "fedstale", "mifa", "scaffold", "fedprox")
# The same table in the FedStale code base's conventions (FedVARP and FedStale are the same in both).
FRAMEWORK_ROLES: tuple[str, ...] = ("full", "fedsteer", "fedsteer_as_written", "fedavg_unbiased", "fedvarp",
                                    "fedstale", "mifa_wait_all", "scaffold_unbiased", "fedprox_unbiased")


def role_of(name: str, params: Mapping[str, Any], dataset_defaults: Mapping[str, Any] | None = None) -> str | None:
    """The role (row key) of a run, from its method name and parameters; None for a variant
    that is no row (e.g. FedVARP with a warm-up: the fair-start check)."""
    for role in ROLES.values():
        if role.matches(name, params, dataset_defaults):
            return role.key
    return None


def display_name(key: str) -> str:
    """The display name of a role or a method."""
    return ROLES[key].display if key in ROLES else METHODS[key].display


def colour(key: str) -> str:
    """The colour of a role (its method's: one colour per method in the whole book) or a method."""
    return METHODS[ROLES[key].method].colour if key in ROLES else METHODS[key].colour


def style(key: str) -> dict[str, str]:
    """Matplotlib keyword arguments that draw a role (or a method, as its main role): its
    method's colour, its marker and its line style, e.g. `ax.plot(x, y, **style("fedsteer"))`."""
    role = ROLES.get(key) or next(r for r in ROLES.values() if r.method == key)
    return {"color": colour(role.key), "marker": role.marker, "linestyle": role.linestyle}


def make_strategy(spec) -> Strategy:
    """The server strategy of a `MethodSpec` (e.g. `make_strategy(method("fedvarp"))`)."""
    if spec.name not in METHODS:
        raise ValueError(f"no strategy registered for method {spec.name!r}; known: {sorted(METHODS)}")
    return METHODS[spec.name].strategy(spec)
