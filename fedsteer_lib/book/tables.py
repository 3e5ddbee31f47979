"""The book's result tables: Table 1 (long form and for reading), gains over FedAvg and the best
baseline, FedStale's β, Table 3 (subsampled core-set selection), every quoted number of the paper
next to ours, the choices we made where the paper is silent, and the models' sizes.

Every function takes the tidy tables of `Book.runs` (one row per run, with one column per method
parameter) or the tables built here, and returns a pandas DataFrame. Nothing here trains a model.

Conventions
-----------
- FedStale's row is the beta with the best mean *test* accuracy per (data set, gamma), as in
  the paper ("We report FedStale's best result"); the row says so, since choosing on the test
  set favours the baseline.
- The best baseline is the best of FedAvg (both forms), FedVARP, FedStale (best beta), MIFA,
  SCAFFOLD and FedProx, again by mean test accuracy.

Used by chapter 6 (Table 1, its gains and metrics, FedStale's β), chapter 7 (Table 3) and
chapter 10 (the comparison with the paper, the choices and models tables).
"""
from __future__ import annotations

import numpy as np
import pandas as pd


from .methods import BASELINES, FEDSTEER_ROLES, ROLE_NAMES, TABLE1_ROLES, method_specs
from .paper import HEADLINE_FEDSTEER, paper_value_for
from .stats import format_pct, mean_ci, summarize

__all__ = ["FEDSTALE_NOTE", "SHORT_DATASET_NAMES", "NBSP", "table1", "table1_reading", "gains"]

NBSP = "\u00a0"  # keeps a number and its unit ('%', 'pp') on one line in a narrow column
SHORT_DATASET_NAMES = {"fmnist": "F-MNIST", "emnist": "EMNIST", "cifar10": "CIFAR-10"}
FEDSTALE_NOTE = "β chosen by test accuracy (the paper's protocol; favours FedStale)"


def table1(runs: pd.DataFrame, metric: str = "final_accuracy") -> pd.DataFrame:
    """Table 1 in long form: one row per (dataset, gamma, role) with mean, std, n, the paper's
    number where its text quotes one, and ours - paper.

    FedStale's row is the beta with the best mean (test) accuracy; `beta` holds it (NaN in the
    other rows), `selected_by_test` marks it and `note` says so. Rows are in `TABLE1_ROLES` order; a
    role with no run is left out.
    """
    s = summarize(runs, metric)
    s = s[s["role"].notna()]
    rows = []
    if not s.empty:
        first = runs.drop_duplicates("label")
        spec_of = dict(zip(first["label"], method_specs(first)))
    for (dataset, gamma), grp in s.groupby(["dataset", "gamma"], sort=True):
        for r in TABLE1_ROLES:
            cand = grp[grp["role"] == r]
            if cand.empty:
                continue
            best = cand.loc[cand["mean"].idxmax()] if cand["mean"].notna().any() else cand.iloc[0]
            if r != "fedstale" and len(cand) > 1:
                raise ValueError(f"several run labels for role {r!r} at {dataset}, γ={gamma}: {list(cand['label'])}")
            paper = paper_value_for(dataset, gamma, "final_accuracy", r)
            beta = float(spec_of[best["label"]].get("beta")) if r == "fedstale" else np.nan
            own = runs[(runs["dataset"] == dataset) & np.isclose(runs["gamma"], gamma) & (runs["label"] == best["label"])]
            kept = own.loc[~own["collapsed"].astype(bool), metric] if "collapsed" in own else own[metric]
            ci = mean_ci(own[metric].tolist())[1]
            rows.append({"dataset": dataset, "gamma": float(gamma), "role": r, "method": ROLE_NAMES[r],
                         "label": best["label"], "beta": beta, "mean": float(best["mean"]), "std": float(best["std"]), "ci": ci,
                         "n": int(best["n"]), "collapsed": int(best["collapsed"]),
                         "mean_not_collapsed": float(kept.mean()) if len(kept) else np.nan,
                         "paper": paper, "diff": float(best["mean"]) - paper if paper == paper else np.nan,
                         "selected_by_test": r == "fedstale" and len(cand) > 1,
                         "candidates": len(cand),
                         "note": FEDSTALE_NOTE + f", among {len(cand)} β" if r == "fedstale" else ""})
    return pd.DataFrame(rows)


def _fmt(mean: float, std: float, n: int) -> str:
    if mean != mean:
        return "—"
    return f"{mean:.3f} ± {std:.3f}" if std == std else f"{mean:.3f} (n={n})"


def table1_reading(t1: pd.DataFrame) -> pd.DataFrame:
    """Table 1 for the page: one row per method, per γ our mean final test accuracy with its 95 %
    interval over the seeds ("0.763 ± 0.041", n in the header), and the paper's number where its
    text quotes one. A cell with collapsed runs says how many (they count at the accuracy of the
    model they end with); FedStale's names its β (chosen on test accuracy, as the paper does)."""
    if t1.empty:
        return pd.DataFrame()
    out = pd.DataFrame({"method": [ROLE_NAMES[r] for r in TABLE1_ROLES if ROLE_NAMES[r] in set(t1["method"])]})
    for gamma, grp in t1.groupby("gamma", sort=False):
        grp = grp.set_index("method")
        n = int(grp["n"].max())
        cells = {}
        for name, r in grp.iterrows():
            text = "—" if r["mean"] != r["mean"] else f"{r['mean']:.3f}" + (f" ± {r['ci']:.3f}" if r["ci"] == r["ci"] else "")
            if r["role"] == "fedstale" and r["beta"] == r["beta"]:
                text += f" (β = {r['beta']:g})"
            if r["collapsed"]:
                text += f"; {r['collapsed']} of {r['n']} collapsed"
            cells[name] = text
        out[f"γ = {gamma:g}: ours (n = {n})"] = out["method"].map(cells).fillna("—")
        out[f"γ = {gamma:g}: paper"] = out["method"].map(grp["paper"].map(lambda v: f"{v:.3f}" if v == v else "—")).fillna("—")
    return out


def gains(t1: pd.DataFrame) -> pd.DataFrame:
    """Relative gains of each FedSteer variant per (dataset, gamma): vs FedAvg (the tables'
    form) and vs the best baseline (`BASELINES`, FedStale at its best β), with the paper's
    numbers where quoted. gain = (FedSteer - other) / other, on mean final accuracy."""
    rows = []
    for (dataset, gamma), grp in t1.groupby(["dataset", "gamma"], sort=True):
        by_role = grp.set_index("role")
        base = by_role.loc[[r for r in BASELINES if r in by_role.index]]
        best = base["mean"].idxmax() if not base.empty and base["mean"].notna().any() else None
        for r in FEDSTEER_ROLES:
            if r not in by_role.index:
                continue
            steer = float(by_role.loc[r, "mean"])
            avg = float(by_role.loc["fedavg", "mean"]) if "fedavg" in by_role.index else float("nan")
            best_mean = float(base.loc[best, "mean"]) if best is not None else float("nan")
            headline = HEADLINE_FEDSTEER.get(dataset) == r
            rows.append({
                "dataset": dataset, "gamma": float(gamma), "role": r, "method": ROLE_NAMES[r], "fedsteer": steer,
                "fedavg": avg, "gain_vs_fedavg": steer / avg - 1 if avg else float("nan"),
                "paper_gain_vs_fedavg": paper_value_for(dataset, gamma, "gain_vs_fedavg", r) if headline else np.nan,
                "best_baseline": ROLE_NAMES[best] if best else None,
                "best_baseline_label": by_role.loc[best, "label"] if best else None,
                "best_baseline_mean": best_mean,
                "gain_vs_best_baseline": steer / best_mean - 1 if best_mean else float("nan"),
                "paper_gain_vs_best_baseline": paper_value_for(dataset, gamma, "gain_vs_best_baseline", r) if headline else np.nan,
                "headline": headline,
            })
    return pd.DataFrame(rows)


_QUANTITY = {"final_accuracy": "accuracy", "gain_vs_fedavg": "gain vs FedAvg", "gain_vs_best_baseline":
             "gain vs best baseline", "min_gain_vs_best_baseline": "min gain vs best", "subsample_drop":
             "subsampling drop", "memory_reduction": "memory reduction"}


def _quoted(v: float, quantity: str, diff: bool = False) -> str:
    """One number of `compare_with_paper` for reading: accuracies to 3 decimals, gains and drops
    as percentages (differences in percentage points), the memory ratio with a '×'."""
    if v != v:
        return "—"
    if "gain" in quantity or "drop" in quantity:
        return f"{100 * v:+.1f} pp" if diff else format_pct(v, signed="gain" in quantity)
    if quantity == "memory_reduction":
        return f"{v:+.1f}×" if diff else f"{v:.1f}×"
    return f"{v:+.3f}" if diff else f"{v:.3f}"


