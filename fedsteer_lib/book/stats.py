"""The book's statistics, one convention everywhere: an estimate over independent units (seeds,
or runs where a run is the unit) with a 95 % interval on the quantity's own scale, a two-sided
test against a target, and Holm's adjustment over one family of tests.

Three scales (`estimate`):

- ``"mean"``: the mean with its Student-t interval and t-test (accuracy gains, paired by seed);
- ``"log_ratio"``: for ratios of positive quantities (a variance over another): the t-interval
  and t-test of the mean log ratio, shown as a change exp(mean) - 1, so its interval never falls
  below -100 %;
- ``"bootstrap"``: for bounded quantities (cosines and their differences): the mean with a
  percentile bootstrap interval over the units and the test that inverts it, so the interval
  stays inside the quantity's range.

`estimate(..., confidence=1 - ALPHA / m)` gives the family-level (Bonferroni) interval of a
family of m tests: a target outside it is rejected by Holm's method as well.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from .methods import roles

__all__ = ["ALPHA", "MIN_UNITS", "SCALES", "summarize", "t_two_sided_p", "t_critical", "mean_ci", "paired_t_test",
           "one_sample_t_test", "bootstrap_means", "estimate", "holm"]

ALPHA = 0.05  # the book's one test level (two-sided), for a whole family with Holm's method
MIN_UNITS = 5  # independent units (seeds, runs) a verdict needs; fewer: the numbers are indicative only
SCALES = ("mean", "log_ratio", "bootstrap")
BOOTSTRAP_DRAWS = 20_000


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


def t_critical(df: int, confidence: float = 0.95) -> float:
    """The t value with P(|T| >= t) = 1 - confidence for `df` degrees of freedom (bisection on
    `t_two_sided_p`): 12.706 for df = 1, 2.365 for df = 7 at 95 %."""
    lo, hi = 0.0, 1e6
    for _ in range(300):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > 1 - confidence else (lo, mid)
    return (lo + hi) / 2


def _finite(values: Sequence[float]) -> np.ndarray:
    return np.asarray([x for x in values if x == x], dtype=float)


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width of its `confidence` t-interval, n) of the finite `values` (NaN
    half-width below two values)."""
    v = _finite(values)
    n = int(v.size)
    if n == 0:
        return float("nan"), float("nan"), 0
    if n < 2:
        return float(v.mean()), float("nan"), n
    return float(v.mean()), float(t_critical(n - 1, confidence) * v.std(ddof=1) / math.sqrt(n)), n


def paired_t_test(diffs: Sequence[float]) -> dict:
    """The t-test of differences (one per unit) against zero: n, mean, standard error, t and
    the two-sided p (NaN with fewer than 2 differences or none that vary)."""
    d = _finite(diffs)
    n = int(d.size)
    mean = float(d.mean()) if n else float("nan")
    if n < 2:
        return {"n": n, "mean": mean, "se": float("nan"), "t": float("nan"), "p": float("nan")}
    se = float(d.std(ddof=1) / math.sqrt(n))
    if se == 0:
        return {"n": n, "mean": mean, "se": 0.0, "t": float("nan"), "p": float("nan")}
    t = mean / se
    return {"n": n, "mean": mean, "se": se, "t": t, "p": t_two_sided_p(t, n - 1)}


def one_sample_t_test(values: Sequence[float], target: float = 0.0) -> dict:
    """The t-test of the mean of `values` (one per independent unit) against `target`."""
    v = _finite(values)
    return paired_t_test(v - target) | {"mean": float(v.mean()) if v.size else float("nan")}


def bootstrap_means(values: Sequence[float], draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> np.ndarray:
    """The means of `draws` resamples (with replacement, over the units) of the finite `values`;
    a fixed seed, so the same values give the same interval on every machine."""
    v = _finite(values)
    rng = np.random.default_rng(seed)
    return v[rng.integers(0, v.size, size=(draws, v.size))].mean(axis=1)


def estimate(values: Sequence[float], scale: str = "mean", target: float = 0.0,
             confidence: float = 0.95) -> dict[str, float]:
    """The estimate of `values` (one per independent unit) on `scale` (see the module docstring):
    {"estimate", "ci_low", "ci_high", "n", "p"}, p being the two-sided test against `target`
    (on the scale's own terms: for "log_ratio" the values are ratios and `target` a change, so
    0.0 tests a ratio of 1). NaN interval below two units, NaN p where no test is possible."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    v = _finite(values)
    n = int(v.size)
    nan = float("nan")
    if n == 0:
        return {"estimate": nan, "ci_low": nan, "ci_high": nan, "n": 0, "p": nan}
    if scale == "log_ratio":
        if (v <= 0).any():
            raise ValueError(f"a log ratio needs positive ratios, got {v[v <= 0].tolist()}")
        logs = np.log(v)
        mean, half, _ = mean_ci(logs, confidence)
        p = one_sample_t_test(logs, math.log1p(target))["p"] if n >= 2 else nan
        return {"estimate": math.expm1(mean), "ci_low": math.expm1(mean - half), "ci_high": math.expm1(mean + half),
                "n": n, "p": p}
    if scale == "bootstrap":
        mean = float(v.mean())
        if n < 2:
            return {"estimate": mean, "ci_low": nan, "ci_high": nan, "n": n, "p": nan}
        means = bootstrap_means(v)
        lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
        below = float(np.mean(means <= target))
        above = float(np.mean(means >= target))
        return {"estimate": mean, "ci_low": float(lo), "ci_high": float(hi), "n": n,
                "p": min(1.0, 2 * min(below, above))}
    mean, half, _ = mean_ci(v, confidence)
    return {"estimate": mean, "ci_low": mean - half, "ci_high": mean + half, "n": n,
            "p": one_sample_t_test(v, target)["p"] if n >= 2 else nan}


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
