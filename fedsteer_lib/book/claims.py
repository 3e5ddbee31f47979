"""One claim of the paper as the book tests it, and how a family of claims becomes the ledger.

A `Claim` holds the per-unit values whose estimate it reports (one per seed, or per run where
a run is the unit), the scale its interval is computed on (`stats.estimate`), the range its
quantity lives in, and the target and direction of its test. `assemble` turns a list of claims
into the ledger's table: every tested claim with at least `stats.MIN_UNITS` units is one test of
ONE family, adjusted by Holm's method; beside the plain 95 % interval each tested row shows its
family-level interval: the interval at the level Holm's method tested that row at (its step's
ALPHA / (m - j + 1), or the level of the step where the method stopped). A target lies outside
a row's family-level interval exactly when Holm's method rejects it, so interval and verdict never
disagree (Bonferroni's ALPHA / m interval would be wider than Holm's decisions: a target can be
rejected by Holm's method and still lie inside it). The verdict words come from the test:

- a claim with a direction (+1: the paper says above `target`, -1: below): the claim's own words
  for "above" and "below" when Holm's p < ALPHA, prefixed "holds:" or "does not hold:", else
  "cannot be decided";
- a claim without one (0: the paper's own number as target): "the paper's x lies above / below
  our interval" when Holm's p < ALPHA, else "the paper's x cannot be ruled out";
- fewer than MIN_UNITS units: "indicative only", no verdict;
- kind "our check" (the book's own comparisons, exploratory): intervals, no test, no verdict, and
  no place in the family, so they do not dilute the paper's tests;
- `exact` rows are computed, not estimated (server memory).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .stats import ALPHA, MIN_UNITS, estimate, holm

__all__ = ["Claim", "COLUMNS", "KINDS", "TESTED_KINDS", "assemble", "holm_levels", "OutOfRange"]

COLUMNS = ["id", "kind", "reading", "claim", "source", "setting", "paper", "ours", "statistic", "estimate", "ci_low",
           "ci_high", "family_low", "family_high", "n", "unit", "scale", "percent", "target", "p", "p_holm", "verdict",
           "evidence"]
KINDS = ("accuracy", "mechanism", "memory", "ablation", "our check", "not run here")
TESTED_KINDS = ("accuracy", "mechanism", "ablation")  # the paper's claims: one Holm family


class OutOfRange(ValueError):
    """An interval left its quantity's range: a wrong scale, never something to clip."""


@dataclass
class Claim:
    """One row of the ledger before the family's adjustment (see the module docstring).

    `statistic` says in words what the estimate is (e.g. "mean over seeds of the paired gain");
    `bounds` is the quantity's range, which no interval may leave; `percent`: shown as a
    percentage; `reading`: "default" or "literal" for the accuracy claims of Algorithm 2's two
    readings, "" otherwise."""

    id: str
    kind: str
    claim: str
    source: str
    setting: str
    paper: str
    evidence: str
    values: Sequence[float] = ()
    unit: str = "seeds"
    statistic: str = "mean over seeds"
    scale: str = "mean"
    bounds: tuple[float, float] = (-math.inf, math.inf)
    percent: bool = True
    target: float = 0.0
    direction: int = 1
    words: tuple[str, ...] = ("higher", "lower")  # above / below target (direction 0: and "not ruled out")
    reading: str = ""
    ours: str = ""
    exact: float | None = None
    exact_holds: bool | None = None

    def numbers(self, confidence: float = 0.95) -> dict[str, Any]:
        if self.exact is not None:
            return {"estimate": self.exact, "ci_low": np.nan, "ci_high": np.nan, "n": np.nan, "p": np.nan}
        return estimate(self.values, self.scale, self.target, confidence)

    def check_range(self, lo: float, hi: float) -> None:
        low, high = self.bounds
        for v in (lo, hi):
            if v == v and not low <= v <= high:
                raise OutOfRange(f"claim {self.id}: interval [{lo:.4g}, {hi:.4g}] leaves the quantity's range "
                                 f"[{low:g}, {high:g}] (scale {self.scale!r})")


def _tested(c: Claim, nums: dict[str, Any]) -> bool:
    return c.kind in TESTED_KINDS and c.exact is None and nums["n"] == nums["n"] and nums["n"] >= MIN_UNITS \
        and nums["p"] == nums["p"]


def _verdict(c: Claim, nums: dict[str, Any], p_holm: float) -> str:
    if c.kind == "not run here":
        return "not run here"
    if c.exact is not None:
        return "holds (computed exactly)" if c.exact_holds else (
            "does not hold (computed exactly)" if c.exact_holds is False else "computed exactly")
    if c.kind == "our check":
        return "exploratory (no test)"
    if not nums["n"] or nums["n"] < MIN_UNITS or p_holm != p_holm:
        return "indicative only"
    above = nums["estimate"] > c.target
    if c.direction == 0:
        return (c.words[0] if above else c.words[1]) if p_holm < ALPHA else c.words[2]
    if p_holm >= ALPHA:
        return "cannot be decided"
    holds = above == (c.direction > 0)
    return f"{'holds' if holds else 'does not hold'}: {c.words[0] if above else c.words[1]}"


def holm_levels(pvalues: Sequence[float]) -> list[float]:
    """The level Holm's step-down method tests each p-value at (NaN: not in the family): the j-th
    smallest at ALPHA / (m - j + 1) while the method rejects, every later one at the level of the
    step where it stopped. p < its level exactly when Holm's method rejects it."""
    order = sorted((v, i) for i, v in enumerate(pvalues) if v == v)
    m = len(order)
    out = [float("nan")] * len(pvalues)
    stopped = None
    for rank, (v, i) in enumerate(order):
        level = ALPHA / (m - rank) if stopped is None else stopped
        if stopped is None and not v < level:
            stopped = level
        out[i] = level
    return out


def assemble(claims: Sequence[Claim]) -> pd.DataFrame:
    """The ledger's table (`COLUMNS`) of `claims`, in their order, with Holm's adjustment over the
    tested ones and the family-level interval beside each; raises OutOfRange when an interval
    (plain or family-level) leaves its quantity's range."""
    nums = [c.numbers() for c in claims]
    tested = [n["p"] if _tested(c, n) else np.nan for c, n in zip(claims, nums)]
    adjusted = holm(tested)
    levels = holm_levels(tested)
    rows = []
    for c, n, p, ph, level in zip(claims, nums, tested, adjusted, levels):
        family = c.numbers(1 - level) if p == p else {"ci_low": np.nan, "ci_high": np.nan}
        c.check_range(n["ci_low"], n["ci_high"])
        c.check_range(family["ci_low"], family["ci_high"])
        rows.append({"id": c.id, "kind": c.kind, "reading": c.reading, "claim": c.claim, "source": c.source,
                     "setting": c.setting, "paper": c.paper, "ours": c.ours,
                     "statistic": c.statistic if c.exact is None else "computed exactly", **n,
                     "family_low": family["ci_low"], "family_high": family["ci_high"],
                     "unit": c.unit if c.exact is None else "", "scale": c.scale if c.exact is None else "",
                     "percent": c.percent, "target": c.target, "p": p if c.kind != "our check" else np.nan,
                     "p_holm": ph, "verdict": _verdict(c, n, ph), "evidence": c.evidence})
    out = pd.DataFrame(rows, columns=COLUMNS)
    out["n"] = out["n"].astype("Int64")
    return out
