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

from .methods import method_order, method_specs, roles, table_name
from .paper import NUM_CLASSES

__all__ = ["summarize", "format_pct", "counted", "collapse_counts", "paired_comparison", "family_verdicts",
           "MIN_SEEDS_FOR_VERDICT", "t_two_sided_p", "paired_t_test", "holm", "tested_verdicts", "t_critical", "mean_ci",
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


def collapse_counts(runs: pd.DataFrame, chance_factor: float = 1.5) -> pd.DataFrame:
    """Per (dataset, gamma, label): runs, runs stopped on a non-finite update (`collapsed`),
    and runs whose final accuracy is below `chance_factor` x chance (the paper's sense of
    collapse: SCAFFOLD / FedProx at 0.048 / 0.051 on EMNIST's 47 classes)."""
    if runs.empty:
        return pd.DataFrame(columns=["dataset", "gamma", "label", "method", "runs", "non_finite", "near_chance"])
    r = runs.copy()
    chance = r["dataset"].map(NUM_CLASSES).rdiv(1.0)
    r["near_chance"] = r["final_accuracy"].isna() | (r["final_accuracy"] < chance_factor * chance)
    g = r.groupby(["dataset", "gamma", "label"], sort=False)
    out = g.agg(runs=("seed", "count"), non_finite=("collapsed", "sum"), near_chance=("near_chance", "sum")).reset_index()
    out["non_finite"] = out["non_finite"].astype(int)
    out["near_chance"] = out["near_chance"].astype(int)
    first = r.drop_duplicates(["dataset", "gamma", "label"])  # the groups, in order of appearance
    out["method"] = [table_name(s, ds) for s, ds in zip(method_specs(first), first["dataset"])]
    order = {lab: i for i, lab in enumerate(method_order(out["label"]))}
    out = out.sort_values(["dataset", "gamma", "label"], key=lambda c: c.map(order) if c.name == "label" else c)
    return out[["dataset", "gamma", "label", "method", "runs", "non_finite", "near_chance"]].reset_index(drop=True)


def paired_comparison(a_runs: pd.DataFrame, b_runs: pd.DataFrame, a_name: str, b_name: str,
                      metric: str = "final_accuracy") -> pd.DataFrame:
    """a vs b per (dataset, gamma), paired by seed: n, the means of a and b (columns named
    `a_name`, `b_name`) and their stds ("std a", "std b"), the mean difference a − b, its
    standard error, how many seeds a wins, the paired t-test's two-sided p ("p", NaN below two
    seeds), the per-seed differences ("differences") and the names ("pair"). No verdict: that
    needs the whole family of comparisons (`family_verdicts`). Each of a_runs / b_runs must hold
    one label per (dataset, gamma)."""
    cols = ["dataset", "gamma", "seed", metric]
    m = a_runs[cols].merge(b_runs[cols], on=["dataset", "gamma", "seed"], suffixes=("_a", "_b"))
    rows = []
    for (dataset, gamma), grp in m.groupby(["dataset", "gamma"], sort=True):
        grp = grp.sort_values("seed")
        a, b = grp[f"{metric}_a"], grp[f"{metric}_b"]
        test = paired_t_test((a - b).tolist())
        rows.append({"dataset": dataset, "gamma": float(gamma), "comparison": f"{a_name} vs {b_name}",
                     "n": len(grp), a_name: a.mean(), b_name: b.mean(), "std a": _std(a), "std b": _std(b),
                     "difference": test["mean"], "s.e.": test["se"], "wins": f"{int((a > b).sum())}/{len(grp)}",
                     "p": test["p"], "differences": tuple((a - b).tolist()), "pair": (a_name, b_name)})
    return pd.DataFrame(rows)


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


def family_verdicts(comparisons: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """`paired_comparison` rows taken as one family: Holm's adjustment of their p-values over the
    rows with at least MIN_SEEDS_FOR_VERDICT seeds ("p_holm"; NaN for the others, which do not
    enter the family), "significant" (p_holm < alpha) and the verdict ("a higher than b", "a
    lower than b", "no clear difference between a and b" or "indicative (n = 2, no test)")."""
    out = comparisons.reset_index(drop=True).copy()
    if out.empty:
        return out.assign(p_holm=[], significant=[], verdict=[])
    tested = out["n"] >= MIN_SEEDS_FOR_VERDICT
    out["p_holm"] = holm([p if t else float("nan") for p, t in zip(out["p"], tested)])
    out["significant"] = out["p_holm"] < alpha
    out["verdict"] = [_word(n, d, ph, f"{a} higher than {b}", f"{a} lower than {b}",
                            f"no clear difference between {a} and {b}", alpha)
                      for n, d, ph, (a, b) in zip(out["n"], out["difference"], out["p_holm"], out["pair"])]
    return out


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


def tested_verdicts(diffs_by_comparison: Sequence[Sequence[float]], a: str = "FedSteer",
                    alpha: float = ALPHA) -> pd.DataFrame:
    """One family of paired comparisons (each a list of per-seed differences a - b): paired
    t-test, Holm-adjusted p over the family, and the verdict it allows: "a higher" / "a lower"
    when the adjusted p < alpha with at least MIN_SEEDS_FOR_VERDICT seeds, "no clear difference"
    otherwise, "indicative (n = 2, no test)" below that many seeds (those do not enter the family).
    An empty family gives an empty table with the same columns."""
    tests = [paired_t_test(d) for d in diffs_by_comparison]
    adjusted = holm([t["p"] if t["n"] >= MIN_SEEDS_FOR_VERDICT else float("nan") for t in tests])
    return pd.DataFrame([{**t, "p_holm": adj, "verdict": _word(t["n"], t["mean"], adj, f"{a} higher", f"{a} lower",
                                                                alpha=alpha)}
                         for t, adj in zip(tests, adjusted)], columns=["n", "mean", "se", "t", "p", "p_holm", "verdict"])
