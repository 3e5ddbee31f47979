"""Statistics of result tables: means over seeds, paired comparisons and the verdicts a test
allows, collapse counts.

Every function takes the tidy tables of `Book.runs` (one row per run: dataset, method, label,
gamma, seed, final_accuracy, collapsed, ..., one column per method parameter) and returns a
pandas DataFrame or a sentence. Comparisons are paired by seed and tested with the paired
two-sided t-test (`paired_t_test`, exact p from `t_two_sided_p`); the p-values of one family of
comparisons (a chapter's, or one table's) are adjusted with Holm's method (`holm`,
`family_verdicts`, `tested_verdicts`). A verdict ("higher", "lower") is stated only with at least
MIN_SEEDS_FOR_VERDICT = 5 paired seeds and a Holm-adjusted p below 0.05; with fewer seeds the
numbers are shown as indicative, with no test and no verdict.

Used by Table 1 and the collapse counts (chapter 6), FedSteer's paired gains (chapter 9), the
claim checks (chapter 10) and the claims ledger.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from .methods import roles

__all__ = ["summarize", "format_pct", "counted",
           "MIN_SEEDS_FOR_VERDICT", "t_two_sided_p", "paired_t_test", "holm", "t_critical", "mean_ci",
           "one_sample_t_test"]

# Verdict words need at least this many paired seeds; fewer are shown as indicative only.
MIN_SEEDS_FOR_VERDICT = 5
ALPHA = 0.05


def _std(values: pd.Series) -> float:
    return float(values.std(ddof=1)) if values.notna().sum() > 1 else float("nan")


def summarize(runs: pd.DataFrame, metric: str = "final_accuracy") -> pd.DataFrame:
    """Mean, std (over seeds, ddof=1; NaN with one seed), n and collapses per (dataset, gamma, label)."""
    if runs.empty:
        return pd.DataFrame(columns=["dataset", "gamma", "label", "role", "mean", "std", "n", "collapsed"])
    g = runs.groupby(["dataset", "gamma", "label"], sort=False)
    out = g[metric].agg(mean="mean", n="count").reset_index()
    out["std"] = g[metric].agg(_std).values
    out["collapsed"] = g["collapsed"].sum().astype(int).values if "collapsed" in runs else 0
    out["role"] = list(roles(runs.drop_duplicates(["dataset", "gamma", "label"])))  # groups in order of appearance
    return out[["dataset", "gamma", "label", "role", "mean", "std", "n", "collapsed"]]


def format_pct(value: float, signed: bool = True) -> str:
    """0.088 -> '+8.8 %' (NaN -> '—')."""
    if value is None or value != value:
        return "—"
    return f"{100 * value:+.1f} %" if signed else f"{100 * value:.1f} %"


def counted(n: int, noun: str) -> str:
    """1 -> '1 seed', 3 -> '3 seeds', 0 -> '0 seeds'."""
    return f"{n} {noun if n == 1 else noun + 's'}"


def _word(n: int, mean: float, p_holm: float, higher: str, lower: str, same: str = "no clear difference",
          alpha: float = ALPHA) -> str:
    """The verdict a test allows: `higher` / `lower` when the Holm-adjusted p < alpha with at
    least MIN_SEEDS_FOR_VERDICT seeds, `same` otherwise, "indicative (n = .., no test)" below
    that many seeds."""
    if n < MIN_SEEDS_FOR_VERDICT:
        return f"indicative (n = {n}, no test)"
    if p_holm == p_holm and p_holm < alpha:
        return higher if mean > 0 else lower
    return same


def t_two_sided_p(t: float, df: int) -> float:
    """Two-sided p-value of Student's t with integer `df` degrees of freedom, P(|T| >= |t|).

    The closed-form series of Abramowitz & Stegun 26.7.3 (odd df) and 26.7.4 (even df), with
    theta = atan(|t| / sqrt(df)); exact for integer df, no SciPy needed."""
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    if math.isnan(t):
        return float("nan")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: A = 2/pi (theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...)), df - 3 powers
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        inside = 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    else:  # even: A = sin (1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...), df - 2 powers
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = math.sin(theta) * total
    return min(1.0, max(0.0, 1.0 - inside))


def paired_t_test(diffs: Sequence[float]) -> dict:
    """The paired t-test of differences (one per seed) against zero: n, mean, standard error,
    t and the two-sided p-value (NaN with fewer than 2 differences or none that vary)."""
    d = np.asarray([x for x in diffs if x == x], dtype=float)
    n = int(d.size)
    mean = float(d.mean()) if n else float("nan")
    if n < 2:
        return {"n": n, "mean": mean, "se": float("nan"), "t": float("nan"), "p": float("nan")}
    se = float(d.std(ddof=1) / math.sqrt(n))
    if se == 0:
        return {"n": n, "mean": mean, "se": 0.0, "t": float("nan"), "p": float("nan")}
    t = mean / se
    return {"n": n, "mean": mean, "se": se, "t": t, "p": t_two_sided_p(t, n - 1)}


def t_critical(df: int, confidence: float = 0.95) -> float:
    """The t value with P(|T| >= t) = 1 - confidence for `df` degrees of freedom (bisection on
    `t_two_sided_p`): 12.706 for df = 1, 2.365 for df = 7 at 95 %."""
    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > 1 - confidence else (lo, mid)
    return (lo + hi) / 2


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width of its `confidence` t-interval, n) of the finite `values`: the book's
    one uncertainty (NaN half-width below two values)."""
    v = np.asarray([x for x in values if x == x], dtype=float)
    n = int(v.size)
    if n == 0:
        return float("nan"), float("nan"), 0
    if n < 2:
        return float(v.mean()), float("nan"), n
    return float(v.mean()), float(t_critical(n - 1, confidence) * v.std(ddof=1) / math.sqrt(n)), n


def one_sample_t_test(values: Sequence[float], target: float = 0.0) -> dict:
    """The t-test of the mean of `values` (one per independent unit: a seed, a run) against
    `target`: n, mean, standard error, t and the two-sided p (NaN below two values)."""
    return paired_t_test([x - target for x in values if x == x]) | {
        "mean": float(np.mean([x for x in values if x == x])) if any(x == x for x in values) else float("nan")}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (NaN entries stay NaN and do not
    count in the family): p_(j) * (m - j + 1), made monotone, capped at 1."""
    p = [(v, i) for i, v in enumerate(pvalues) if v == v]
    m = len(p)
    out = [float("nan")] * len(pvalues)
    running = 0.0
    for rank, (v, i) in enumerate(sorted(p)):
        running = max(running, min(1.0, v * (m - rank)))
        out[i] = running
    return out


