"""Table 1: the final test accuracy of every method of the paper, in long form (`table1`) and for
reading (`table1_reading`). FedStale's row is the β with the best mean *test* accuracy per (data
set, γ), as in the paper ("We report FedStale's best result"); the row says so, since choosing
on the test set favours the baseline. Used by chapters 6 and 9."""
from __future__ import annotations

import numpy as np
import pandas as pd


from ..experiments.registry import TABLE1_ROLES, display_name
from .methods import method_specs
from .paper import paper_value_for
from .stats import estimate, summarize

__all__ = ["FEDSTALE_NOTE", "table1", "table1_reading"]

FEDSTALE_NOTE = "β chosen by test accuracy (the paper's protocol; favours FedStale)"


def table1(runs: pd.DataFrame, metric: str = "final_accuracy", row_roles: tuple[str, ...] = TABLE1_ROLES) -> pd.DataFrame:
    """Table 1 in long form: one row per (dataset, gamma, role) with mean, std, n, the paper's
    number where its text quotes one, and ours - paper.

    FedStale's row is the beta with the best mean (test) accuracy; `beta` holds it (NaN in the
    other rows), `selected_by_test` marks it and `note` says so. Rows are the roles `row_roles`, in
    that order (the paper's Table 1 by default; chapter 6 adds the literal reading of
    Algorithm 2); a role with no run is left out.
    """
    s = summarize(runs, metric)
    s = s[s["role"].notna()]
    rows = []
    if not s.empty:
        first = runs.drop_duplicates("label")
        spec_of = dict(zip(first["label"], method_specs(first)))
    for (dataset, gamma), grp in s.groupby(["dataset", "gamma"], sort=True):
        for r in row_roles:
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
            interval = estimate(own[metric].tolist(), "bootstrap")  # accuracies are bounded: a bootstrap interval
            rows.append({"dataset": dataset, "gamma": float(gamma), "role": r, "method": display_name(r),
                         "label": best["label"], "beta": beta, "mean": float(best["mean"]), "std": float(best["std"]),
                         "ci_low": interval["ci_low"], "ci_high": interval["ci_high"],
                         "n": int(best["n"]), "collapsed": int(best["collapsed"]),
                         "mean_not_collapsed": float(kept.mean()) if len(kept) else np.nan,
                         "paper": paper, "diff": float(best["mean"]) - paper if paper == paper else np.nan,
                         "selected_by_test": r == "fedstale" and len(cand) > 1,
                         "candidates": len(cand),
                         "note": FEDSTALE_NOTE + f", among {len(cand)} β" if r == "fedstale" else ""})
    return pd.DataFrame(rows)


def table1_reading(t1: pd.DataFrame) -> pd.DataFrame:
    """Table 1 for the page: one row per method, per γ our mean final test accuracy with its 95 %
    interval over the seeds ("0.763 [0.741, 0.785]", a bootstrap over the seeds, which stays in
    [0, 1] however the seeds spread; n in the header), and the paper's number where its
    text quotes one. A cell with collapsed runs says how many (they count at the accuracy of the
    model they end with); FedStale's names its β (chosen on test accuracy, as the paper does)."""
    if t1.empty:
        return pd.DataFrame()
    out = pd.DataFrame({"method": list(dict.fromkeys(t1["method"]))})
    for gamma, grp in t1.groupby("gamma", sort=False):
        grp = grp.set_index("method")
        n = int(grp["n"].max())
        cells = {}
        for name, r in grp.iterrows():
            text = "—" if r["mean"] != r["mean"] else f"{r['mean']:.3f}" + (
                f" [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if r["ci_low"] == r["ci_low"] else "")
            if r["role"] == "fedstale" and r["beta"] == r["beta"]:
                text += f" (β = {r['beta']:g})"
            if r["collapsed"]:
                text += f"; {r['collapsed']} of {r['n']} collapsed"
            cells[name] = text
        out[f"γ = {gamma:g}: ours (n = {n})"] = out["method"].map(cells).fillna("—")
        out[f"γ = {gamma:g}: paper"] = out["method"].map(grp["paper"].map(lambda v: f"{v:.3f}" if v == v else "—")).fillna("—")
    return out
