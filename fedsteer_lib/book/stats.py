"""Statistics of result tables: means over seeds, paired comparisons and their verdicts,
collapse counts, and Fig. 5's core-set size x lambda grid.

Every function takes the tidy tables of `Book.runs` (one row per run: dataset, method, label,
gamma, seed, final_accuracy, collapsed, ..., one column per method parameter) and returns a
pandas DataFrame or a sentence. With more than one seed, a difference counts as real only when
it exceeds two standard errors (`verdict`); with one seed no conclusion is drawn.

Used by Table 1 and the collapse counts (chapter 6), every ablation comparison and Fig. 5
(chapter 7), and the claim checks (chapter 10).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from .methods import method_order, method_specs, roles, table_name
from .paper import NUM_CLASSES

__all__ = ["summarize", "format_pct", "collapse_counts", "verdict", "paired_comparison", "coreset_lambda_table",
           "fig5_verdicts", "MIN_SEEDS_FOR_VERDICT", "t_two_sided_p", "paired_t_test", "holm", "tested_verdicts"]

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


def verdict(diffs: Sequence[float], a: str, b: str, tol: float = 0.0) -> str:
    """A plain-language reading of paired differences a - b (one per seed).

    With one seed no conclusion is drawn; with more, the difference counts as real only when
    |mean| > 2 standard errors (and > tol)."""
    d = np.asarray([x for x in diffs if x == x], dtype=float)
    if d.size == 0:
        return f"no paired runs of {a} and {b}"
    mean = float(d.mean())
    direction = "higher" if mean > 0 else "lower" if mean < 0 else "equal"
    if d.size == 1:
        return (f"{a} is {abs(mean):.3f} {direction} than {b} on the single seed run — one seed cannot "
                "separate this from seed-to-seed noise")
    sem = float(d.std(ddof=1) / math.sqrt(d.size))
    if abs(mean) > max(2 * sem, tol):
        return f"{a} is {abs(mean):.3f} {direction} than {b} (mean over {d.size} seeds, ±{sem:.3f} s.e.): a clear difference"
    return (f"{a} and {b} differ by {mean:+.3f} (mean over {d.size} seeds, ±{sem:.3f} s.e.): "
            "within noise, no clear difference")


def paired_comparison(a_runs: pd.DataFrame, b_runs: pd.DataFrame, a_name: str, b_name: str,
                      metric: str = "final_accuracy") -> pd.DataFrame:
    """a vs b per (dataset, gamma), paired by seed: means, mean difference a - b, its standard
    error, how many seeds a wins, and `verdict`'s sentence. Each of a_runs / b_runs must hold
    one label per (dataset, gamma)."""
    cols = ["dataset", "gamma", "seed", metric]
    m = a_runs[cols].merge(b_runs[cols], on=["dataset", "gamma", "seed"], suffixes=("_a", "_b"))
    rows = []
    for (dataset, gamma), grp in m.groupby(["dataset", "gamma"], sort=True):
        d = grp[f"{metric}_a"] - grp[f"{metric}_b"]
        rows.append({"dataset": dataset, "gamma": float(gamma), "comparison": f"{a_name} vs {b_name}",
                     "n": len(grp), a_name: grp[f"{metric}_a"].mean(), b_name: grp[f"{metric}_b"].mean(),
                     "difference": float(d.mean()),
                     "s.e.": float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan"),
                     "wins": f"{int((d > 0).sum())}/{len(d)}", "verdict": verdict(d.tolist(), a_name, b_name)})
    return pd.DataFrame(rows)


def coreset_lambda_table(runs: pd.DataFrame, metric: str = "final_accuracy") -> pd.DataFrame:
    """Fig. 5's grid: mean, std and n of `metric` per (dataset, gamma, |X|, λ)."""
    specs = method_specs(runs)
    r = runs.assign(core_size=[int(s.get("core_size")) for s in specs], lam=[float(s.get("lam")) for s in specs])
    g = r.groupby(["dataset", "gamma", "core_size", "lam"])[metric]
    out = g.agg(mean="mean", n="count").reset_index()
    out["std"] = g.agg(_std).values
    return out


def fig5_verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, gamma, |X|): which λ gives the higher mean accuracy, by how much, and what
    the paper's Fig. 5 text says for that size (λ = 0.5 better for |X| ≤ 30, λ = 0 better for
    40 ≤ |X| ≤ 80; nothing for other sizes)."""
    rows = []
    for (dataset, gamma, k), grp in table.groupby(["dataset", "gamma", "core_size"], sort=True):
        by = grp.set_index("lam")["mean"]
        if not {0.0, 0.5} <= set(by.index):
            continue
        diff = float(by[0.5] - by[0.0])
        better = "λ=0.5" if diff > 0 else "λ=0" if diff < 0 else "tie"
        paper = "λ=0.5" if k <= 30 else "λ=0" if 40 <= k <= 80 else "both degrade (|X| > 80)"
        agrees = None if k > 80 or better == "tie" else better == paper
        rows.append({"dataset": dataset, "gamma": float(gamma), "|X|": int(k), "λ=0": float(by[0.0]),
                     "λ=0.5": float(by[0.5]), "λ=0.5 − λ=0": diff, "better here": better,
                     "paper (EMNIST)": paper, "agrees": agrees, "n": int(grp["n"].min())})
    return pd.DataFrame(rows)


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
    otherwise, "indicative (n < 5)" below that many seeds (those do not enter the family)."""
    tests = [paired_t_test(d) for d in diffs_by_comparison]
    eligible = [t["p"] if t["n"] >= MIN_SEEDS_FOR_VERDICT else float("nan") for t in tests]
    adjusted = holm(eligible)
    rows = []
    for t, adj in zip(tests, adjusted):
        if t["n"] < MIN_SEEDS_FOR_VERDICT:
            word = f"indicative (n < {MIN_SEEDS_FOR_VERDICT})"
        elif adj == adj and adj < alpha:
            word = f"{a} higher" if t["mean"] > 0 else f"{a} lower"
        else:
            word = "no clear difference"
        rows.append({**t, "p_holm": adj, "verdict": word})
    return pd.DataFrame(rows)
