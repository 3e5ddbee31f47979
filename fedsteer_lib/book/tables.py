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

from ..experiments.config import DATASET_DEFAULTS
from .methods import BASELINES, FEDSTEER_ROLES, ROLE_NAMES, ROLES, by_role, method_specs
from .paper import DATASET_NAMES, HEADLINE_FEDSTEER, NUM_CLASSES, PAPER, paper_value_for, plain
from .stats import format_pct, mean_ci, summarize

__all__ = ["FEDSTALE_NOTE", "SHORT_DATASET_NAMES", "NBSP", "table1", "table1_display", "table1_reading", "metric_table", "gains", "gains_display", "fedstale_table",
           "subsample_table", "compare_with_paper", "compare_display", "choices_table", "model_table"]

NBSP = "\u00a0"  # keeps a number and its unit ('%', 'pp') on one line in a narrow column
SHORT_DATASET_NAMES = {"fmnist": "F-MNIST", "emnist": "EMNIST", "cifar10": "CIFAR-10"}
FEDSTALE_NOTE = "β chosen by test accuracy (the paper's protocol; favours FedStale)"


def table1(runs: pd.DataFrame, metric: str = "final_accuracy") -> pd.DataFrame:
    """Table 1 in long form: one row per (dataset, gamma, role) with mean, std, n, the paper's
    number where its text quotes one, and ours - paper.

    FedStale's row is the beta with the best mean (test) accuracy; `beta` holds it (NaN in the
    other rows), `selected_by_test` marks it and `note` says so. Rows are in `ROLES` order; a
    role with no run is left out.
    """
    s = summarize(runs, metric)
    s = s[s["role"].notna()]
    rows = []
    if not s.empty:
        first = runs.drop_duplicates("label")
        spec_of = dict(zip(first["label"], method_specs(first)))
    for (dataset, gamma), grp in s.groupby(["dataset", "gamma"], sort=True):
        for r in ROLES:
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
    out = pd.DataFrame({"method": [ROLE_NAMES[r] for r in ROLES if ROLE_NAMES[r] in set(t1["method"])]})
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


def table1_display(t1: pd.DataFrame) -> pd.DataFrame:
    """Table 1 for the page: one row per method, two columns per γ (ours: mean ± std over the
    seeds; the paper's number where its text quotes one). A cell with collapsed runs says how
    many of its n collapsed (they count at the accuracy of the model they end with) and the mean
    of the others; FedStale's cell names its β (chosen by test accuracy, `FEDSTALE_NOTE`)."""
    if t1.empty:
        return pd.DataFrame()
    out = pd.DataFrame({"method": [ROLE_NAMES[r] for r in ROLES if ROLE_NAMES[r] in set(t1["method"])]})
    for gamma, grp in t1.groupby("gamma", sort=True):
        grp = grp.set_index("method")
        cells = {}
        for name, r in grp.iterrows():
            text = _fmt(r["mean"], r["std"], r["n"])
            if r["role"] == "fedstale" and r["beta"] == r["beta"]:
                text += f", β={r['beta']:g}"
            if r["collapsed"]:
                others = "" if r["mean_not_collapsed"] != r["mean_not_collapsed"] else f"; the others {r['mean_not_collapsed']:.3f}"
                text += f" ({r['collapsed']} of {r['n']} collapsed{others})"
            cells[name] = text
        out[f"γ={gamma:g}: ours"] = out["method"].map(cells).fillna("—")
        out[f"γ={gamma:g}: paper"] = out["method"].map(grp["paper"].map(lambda v: f"{v:.3f}" if v == v else "—")).fillna("—")
    return out


def metric_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Table 1's means under two metrics side by side, per method (rows) and γ: the paper's final
    accuracy (one round) and our addition, the mean accuracy over the last evaluated rounds
    (`mean_last_accuracy`), with FedSteer's gain over the best baseline under each."""
    cols = {}
    for metric, name in (("final_accuracy", "final round"), ("mean_last_accuracy", "mean of last rounds")):
        t = table1(runs, metric)
        for gamma, grp in t.groupby("gamma", sort=True):
            cols[(f"γ={gamma:g}", name)] = grp.set_index("method")["mean"]
    if not cols:
        return pd.DataFrame()
    out = pd.DataFrame(cols)
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    out = out[sorted(out.columns, key=lambda c: (c[0], c[1] != "final round"))]
    return out.loc[[ROLE_NAMES[r] for r in ROLES if ROLE_NAMES[r] in out.index]]


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


def gains_display(g: pd.DataFrame) -> pd.DataFrame:
    """`gains` with percentages as '+8.8 %' strings and readable column names."""
    cols = {"gamma": "γ", "method": "FedSteer variant", "fedsteer": "FedSteer", "fedavg": "FedAvg",
            "gain_vs_fedavg": "gain vs FedAvg", "paper_gain_vs_fedavg": "paper",
            "best_baseline": "best baseline", "best_baseline_mean": "its accuracy",
            "gain_vs_best_baseline": "gain vs best baseline", "paper_gain_vs_best_baseline": "paper "}
    out = g[list(cols)].rename(columns=cols)
    for c in ("gain vs FedAvg", "paper", "gain vs best baseline", "paper "):
        out[c] = out[c].map(format_pct)
    return out.round(3)


def fedstale_table(runs: pd.DataFrame) -> pd.DataFrame:
    """FedStale's mean final accuracy for every β (rows) and γ (columns), with the β Table 1
    reports (best by test accuracy, as in the paper) marked."""
    stale = by_role(runs, "fedstale").copy()
    if stale.empty:
        return pd.DataFrame()
    stale["β"] = [float(s.get("beta")) for s in method_specs(stale)]
    mean = stale.groupby(["β", "gamma"])["final_accuracy"].mean().unstack("gamma")
    out = pd.DataFrame(index=mean.index)
    for gamma in mean.columns:
        best = mean[gamma].idxmax()
        out[f"γ={gamma:g}"] = [f"{v:.3f}" + ("  ← reported (best on test)" if b == best else "")
                               for b, v in mean[gamma].items()]
    return out


def subsample_table(main_runs: pd.DataFrame, sub_runs: pd.DataFrame) -> pd.DataFrame:
    """Table 3: subsampled (N_sub = 20) vs full greedy core-set selection, per gamma, paired
    by seed. Columns: full / subsampled mean, absolute drop (full - sub, accuracy points) and
    relative drop ((full - sub) / full, on the means)."""
    full = by_role(main_runs, "fedsteer")
    sub = sub_runs[[s.name == "fedsteer" and s.get("subsample") != 0 for s in method_specs(sub_runs)]]
    m = full.merge(sub, on=["dataset", "gamma", "seed"], suffixes=("_full", "_sub"))
    rows = []
    for (dataset, gamma), grp in m.groupby(["dataset", "gamma"], sort=True):
        f, s = grp["final_accuracy_full"], grp["final_accuracy_sub"]
        rows.append({"dataset": dataset, "gamma": float(gamma), "n": len(grp), "greedy (all N)": f.mean(),
                     "subsampled": s.mean(), "drop (points)": (f - s).mean(),
                     "drop (relative)": (f.mean() - s.mean()) / f.mean()})
    return pd.DataFrame(rows)


def compare_with_paper(t1: pd.DataFrame, gains_table: pd.DataFrame | None = None,
                       subsample: pd.DataFrame | None = None, memory: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every number of `PAPER` next to ours (NaN where we have no run for it), with ours − paper.

    Accuracies are compared as accuracies, gains and drops as fractions, the memory reduction
    as a ratio. `status` says "compared" or why not (data set not run here, run missing).
    """
    have = set(t1["dataset"]) if not t1.empty else set()
    g = gains_table if gains_table is not None else (gains(t1) if not t1.empty else pd.DataFrame())
    rows = []
    for p in PAPER:
        ours, setting, n, collapsed = float("nan"), "", np.nan, np.nan
        if p.quantity == "final_accuracy":
            hit = t1[(t1["dataset"] == p.dataset) & np.isclose(t1["gamma"], p.gamma) & (t1["role"] == p.role)] if have else t1
            if not hit.empty:
                ours, setting = float(hit["mean"].iloc[0]), f"n={int(hit['n'].iloc[0])}"
                n, collapsed = int(hit["n"].iloc[0]), int(hit["collapsed"].iloc[0])
        elif p.quantity in ("gain_vs_fedavg", "gain_vs_best_baseline"):
            hit = g[(g["dataset"] == p.dataset) & np.isclose(g["gamma"], p.gamma) & (g["role"] == p.role)] if not g.empty else g
            if not hit.empty:
                ours = float(hit[p.quantity].iloc[0])
                setting = f"best baseline: {hit['best_baseline'].iloc[0]}" if p.quantity == "gain_vs_best_baseline" else ""
        elif p.quantity == "min_gain_vs_best_baseline" and not g.empty:
            head = g[g["headline"]]
            if not head.empty:
                ours = float(head["gain_vs_best_baseline"].min())
                setting = f"min over {len(head)} setting(s) run here"
        elif p.quantity == "subsample_drop" and subsample is not None and not subsample.empty:
            ours = float(subsample["drop (relative)"].mean())
            setting = (f"relative, mean over γ ∈ {sorted(subsample['gamma'])}; absolute: "
                       f"{subsample['drop (points)'].mean():+.3f}")
        elif p.quantity == "memory_reduction" and memory is not None and not memory.empty:
            steer = memory[memory["core_size"].notna()]
            if not steer.empty and steer["fedvarp_over_this"].notna().any():
                idx = (steer["core_size"] - 10).abs().idxmin()
                ours = float(steer.loc[idx, "fedvarp_over_this"])
                setting = f"measured at |X|={int(steer.loc[idx, 'core_size'])}, N=100"
        if p.dataset is not None and p.dataset not in have:
            status = f"not run here ({p.dataset}): the paper's number only"
        elif ours != ours:
            status = "no run of ours for this number"
        else:
            status = "compared"
        rows.append({"key": p.key, "data set": p.dataset or "all", "γ": p.gamma if p.gamma is not None else np.nan,
                     "quantity": p.quantity, "method": ROLE_NAMES.get(p.role, "—") if p.role else "—",
                     "paper": p.value, "ours": ours, "ours − paper": ours - p.value if ours == ours else np.nan,
                     "our setting": setting, "status": status, "section": p.section, "sentence": plain(p.quote),
                     "n": n, "collapsed": collapsed})
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


def compare_display(compare: pd.DataFrame) -> pd.DataFrame:
    """`compare_with_paper` for reading, one short row per quoted number (no index): its number
    (the footnote's, `prose.describe_quoted_sources`), what it is, the setting, the paper's
    value, ours ("not run" where the data set is not run here; with n and the collapsed runs for
    accuracies) and ours − paper; a number never split from its '%' or 'pp' (`NBSP`)."""
    rows = []
    for k, (_, r) in enumerate(compare.iterrows(), start=1):
        what = _QUANTITY.get(r["quantity"], r["quantity"])
        what = f"{r['method']} {what}" if r["quantity"] == "final_accuracy" else what
        where = SHORT_DATASET_NAMES.get(r["data set"], r["data set"]) + (f", γ={r['γ']:g}" if r["γ"] == r["γ"] else "")
        ours = _quoted(r["ours"], r["quantity"])
        if r["status"].startswith("not run here"):
            ours = "not run"
        elif r.get("n") == r.get("n") and r.get("n") is not None:
            ours += f" (n={int(r['n'])}" + (f", {int(r['collapsed'])} collapsed)" if r["collapsed"] else ")")
        rows.append({"#": str(k), "number": what, "setting": where, "paper": _quoted(r["paper"], r["quantity"]),
                     "ours": ours, "ours − paper": _quoted(r["ours − paper"], r["quantity"], diff=True)})
    return pd.DataFrame(rows).apply(lambda col: col.str.replace(" %", NBSP + "%").str.replace(" pp", NBSP + "pp"))


def choices_table() -> pd.DataFrame:
    """The choices we made where the paper is silent, each rendered from the code that makes it."""
    import inspect

    from ..experiments import tuning
    from ..fedsteer import FedSteer
    from ..simulator import baselines, engine
    from ..experiments.config import METHODS, TUNED

    def first_line(obj) -> str:
        return " ".join((inspect.getdoc(obj) or "").split("\n\n")[0].split()).rstrip(".")

    def between(doc: str, start: str, stop: str | None) -> str:
        """The docstring text from `start` up to (not including) `stop`, on one line."""
        i = doc.find(start)
        j = doc.find(stop, i + 1) if stop else -1
        return " ".join(doc[i: j if j > i else None].split()) if i >= 0 else ""

    steer_doc = inspect.getdoc(FedSteer) or ""
    ordering = between(steer_doc, 'ordering="unbiased"', 'ordering="as_written"')
    refresh = between(steer_doc, "refresh_every=R", "Core members")
    protocol = between(inspect.getdoc(tuning) or "", "Protocol:", None)
    prepare_src = inspect.getsource(engine.prepare)
    augmented = any(w in prepare_src.lower() for w in ("augment", "flip", "crop"))
    return pd.DataFrame([
        ("training hyperparameters (E, batch size, learning rates)", protocol, "tuning, config.TUNED"),
        ("hyperparameters of EMNIST and CIFAR-10",
         "the Fashion-MNIST choice (not tuned on their own data)" if TUNED["emnist"] == TUNED["fmnist"]
         and TUNED["cifar10"] == TUNED["fmnist"] else "tuned per data set (config.TUNED)", "config.TUNED"),
        ("FedAvg in the tables", first_line(baselines.FedAvg)
         + "; the unbiased form is reported as well: " + first_line(baselines.FedAvgUnbiased), "simulator.baselines.FedAvg"),
        ("FedSteer estimator ordering", f"default ordering={METHODS['fedsteer']['ordering']!r}: " + ordering,
         "fedsteer.FedSteer"),
        ("enforce=5", refresh, "fedsteer.FedSteer (refresh_every, enforce_every)"),
        ("FedStale β in Table 1", FEDSTALE_NOTE + "; all five β are shown in chapter 6", "book.tables.table1"),
        ("EMNIST split", f"{DATASET_DEFAULTS['emnist']['split']!r} ({NUM_CLASSES['emnist']} classes)",
         "config.DATASET_DEFAULTS"),
        ("data augmentation", "none: images are only scaled to [0, 1] and standardised per channel"
         if not augmented else "applied in engine.prepare", "engine.prepare"),
        ("collapse", "a run stops and is marked collapsed at the first non-finite update; chapter 6 also counts runs "
         "that end below 1.5 × chance accuracy (the paper's sense)", "engine.run, book.stats.collapse_counts"),
    ], columns=["where the paper is silent", "our choice", "in the code"])


def model_table() -> pd.DataFrame:
    """Each data set's model and its number of trainable parameters d (built, not typed)."""
    from ..simulator.models import MODEL_FOR_DATASET, build_model, num_parameters

    shapes = {"fmnist": (10, 1), "emnist": (NUM_CLASSES["emnist"], 1), "cifar10": (10, 3)}
    rows = []
    for ds, (classes, channels) in shapes.items():
        model = build_model(ds, classes, channels)
        rows.append({"data set": DATASET_NAMES[ds], "model": MODEL_FOR_DATASET[ds].__name__, "classes": classes,
                     "parameters": num_parameters(model)})
    return pd.DataFrame(rows)
