"""Figures of chapters 6, 7 and 9: accuracy curves (Fig. 4, 6/7), Table 1 as bars next to the
paper's numbers, Fig. 5 (core-set size x lambda), ablation differences and server memory.

Every function takes the tidy tables of `Book.curves` / `fedsteer_lib.analysis` and returns
the matplotlib Figure it drew (titles, labelled axes and legends included); call
`plt.show()` after it.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from matplotlib.ticker import PercentFormatter

from ..analysis import clean_label
from .common import display_name, method_order, palette, plot_curves

_SHORT = {"gain_vs_fedavg": "gain vs FedAvg", "gain_vs_best_baseline": "gain vs best baseline",
          "min_gain_vs_best_baseline": "min gain vs best baseline", "subsample_drop": "subsampling drop"}

__all__ = ["plot_accuracy_by_gamma", "plot_convergence", "plot_table1_bars", "plot_ours_vs_paper",
           "plot_coreset_lambda", "plot_differences", "plot_memory"]


def _clean(curves: pd.DataFrame) -> pd.DataFrame:
    out = curves.copy()
    out["label"] = out["label"].map(clean_label)
    return out


def _shared_legend(fig: plt.Figure, axes) -> None:
    """One legend under the panels instead of one inside each."""
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8, frameon=False)


def _labels_at(t1: pd.DataFrame | None, gamma: float, curves: pd.DataFrame) -> list[str]:
    """Table 1's run labels at gamma (one FedStale β), else every label of the curves at gamma."""
    if t1 is not None and not t1.empty:
        return list(t1.loc[np.isclose(t1["gamma"], gamma), "label"])
    return list(curves.loc[np.isclose(curves["gamma"], gamma), "label"].unique())


def plot_accuracy_by_gamma(curves: pd.DataFrame, t1: pd.DataFrame | None = None, *, dataset_name: str = "",
                           metric: str = "accuracy") -> plt.Figure:
    """Fig. 4: test accuracy vs round, one panel per gamma, mean ± std over seeds. With `t1`
    (analysis.table1) only Table 1's rows are drawn (FedStale at its best β)."""
    gammas = sorted(curves["gamma"].unique())
    fig, axes = plt.subplots(1, len(gammas), figsize=(max(7.0, 6.2 * len(gammas)), 5.0), squeeze=False, sharey=True)
    for ax, gamma in zip(axes[0], gammas):
        sub = curves[np.isclose(curves["gamma"], gamma)]
        seeds = sub["seed"].nunique()
        plot_curves(_clean(sub), ax, metric=metric, labels=[clean_label(l) for l in _labels_at(t1, gamma, sub)],
                    title=f"{dataset_name} γ={gamma:g} ({seeds} seed{'s' if seeds != 1 else ''})".strip())
        ax.set_ylabel(f"test {metric}")
    _shared_legend(fig, axes[0])
    fig.suptitle("Fig. 4 — test accuracy during training (mean ± std over seeds)")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def plot_convergence(curves: pd.DataFrame, gamma: float, labels: Sequence[str] | None = None, *,
                     dataset_name: str = "", figure: str = "Fig. 6/7") -> plt.Figure:
    """Fig. 6/7: convergence at one gamma of every method (full participation included):
    test accuracy and test loss vs round, mean ± std over seeds."""
    sub = curves[np.isclose(curves["gamma"], gamma)]
    labels = list(labels) if labels is not None else list(sub["label"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(12.4, 5.0))
    clean, clean_labels = _clean(sub), [clean_label(l) for l in labels]
    plot_curves(clean, axes[0], metric="accuracy", labels=clean_labels, title="test accuracy")
    plot_curves(clean, axes[1], metric="loss", labels=clean_labels, title="test loss")
    axes[0].set_ylabel("test accuracy")
    axes[1].set_ylabel("test loss (cross-entropy)")
    finite = sub.loc[sub["label"].isin(labels), "loss"].replace([np.inf, -np.inf], np.nan).dropna()
    if not finite.empty:
        axes[1].set_ylim(0, min(float(finite.quantile(0.98)) * 1.1, float(finite.max()) * 1.05))
    _shared_legend(fig, axes)
    fig.suptitle(f"{figure} — {dataset_name} convergence at γ={gamma:g}".replace("  ", " "))
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def plot_table1_bars(t1: pd.DataFrame, *, dataset_name: str = "") -> plt.Figure:
    """Table 1 as bars: mean final accuracy ± std per method and gamma; the paper's quoted
    numbers as black diamonds where its text gives one."""
    gammas = sorted(t1["gamma"].unique())
    fig, axes = plt.subplots(1, len(gammas), figsize=(5.6 * len(gammas), 4.4), squeeze=False, sharex=True)
    for ax, gamma in zip(axes[0], gammas):
        sub = t1[np.isclose(t1["gamma"], gamma)].iloc[::-1]
        colours = palette(sub["label"])
        y = np.arange(len(sub))
        ax.barh(y, sub["mean"], xerr=sub["std"].fillna(0.0), color=[colours[l] for l in sub["label"]],
                alpha=0.85, label="ours (mean ± std)")
        has_paper = sub["paper"].notna()
        if has_paper.any():
            ax.scatter(sub.loc[has_paper, "paper"], y[has_paper.values], marker="D", color="black", zorder=3,
                       label="paper (quoted in the text)")
        ax.set_yticks(y, sub["method"])
        ax.set_xlabel("final test accuracy")
        ax.set_xlim(0, 1)
        ax.set_title(f"{dataset_name} γ={gamma:g}".strip())
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("Table 1 — final accuracy per method")
    fig.tight_layout()
    return fig


def plot_ours_vs_paper(compare: pd.DataFrame) -> plt.Figure:
    """Every compared number of `analysis.compare_with_paper`: ours against the paper's, with
    the line ours = paper (accuracies on the left, relative gains / drops on the right)."""
    done = compare[compare["status"] == "compared"]
    acc = done[done["quantity"] == "final_accuracy"]
    rel = done[done["quantity"].str.contains("gain|drop")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, part, unit in ((axes[0], acc, "final accuracy"), (axes[1], rel, "relative gain / drop")):
        lo = min([0.0] + list(part["paper"]) + list(part["ours"]))
        hi = max([1.0 if unit == "final accuracy" else 0.1] + list(part["paper"]) + list(part["ours"]))
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--", label="ours = paper")
        for i, (_, r) in enumerate(part.iterrows()):
            what = r["method"] if unit == "final accuracy" else _SHORT.get(r["quantity"], r["quantity"])
            where = f" γ={r['γ']:g}" if r["γ"] == r["γ"] else ""
            ax.scatter(r["paper"], r["ours"], s=40, zorder=3)
            ax.annotate(what + where, (r["paper"], r["ours"]), fontsize=7, xytext=(4, 4 - 9 * (i % 2)),
                        textcoords="offset points")
        if unit != "final accuracy":
            ax.xaxis.set_major_formatter(PercentFormatter(1.0))
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_xlabel(f"paper ({unit})")
        ax.set_ylabel(f"ours ({unit})")
        ax.set_title(f"{unit}: {len(part)} number{'s' if len(part) != 1 else ''} compared")
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("Our results against every number the paper's text quotes (where we ran the setting)")
    fig.tight_layout()
    return fig


def plot_coreset_lambda(table: pd.DataFrame, *, dataset_name: str = "") -> plt.Figure:
    """Fig. 5: final accuracy vs core-set size |X| for λ = 0 and λ = 0.5 (enforce=5), mean ±
    std over seeds, one panel per gamma."""
    gammas = sorted(table["gamma"].unique())
    fig, axes = plt.subplots(1, len(gammas), figsize=(5.6 * len(gammas), 4.0), squeeze=False, sharey=True)
    for ax, gamma in zip(axes[0], gammas):
        sub = table[np.isclose(table["gamma"], gamma)]
        for lam, grp in sub.groupby("lam"):
            grp = grp.sort_values("core_size")
            ax.errorbar(grp["core_size"], grp["mean"], yerr=grp["std"].fillna(0.0), marker="o", capsize=3,
                        label=f"λ={lam:g}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(sub["core_size"].unique()), [str(k) for k in sorted(sub["core_size"].unique())])
        ax.set_xlabel("core-set size |X|")
        ax.set_ylabel("final test accuracy")
        n = int(sub["n"].min()) if not sub.empty else 0
        ax.set_title(f"{dataset_name} γ={gamma:g} ({n} seed{'s' if n != 1 else ''})".strip())
        ax.legend(title="ridge λ", fontsize=8)
    fig.suptitle("Fig. 5 — core-set size × regularisation (FedSteer, enforce=5)")
    fig.tight_layout()
    return fig


def plot_differences(comparisons: pd.DataFrame, *, title: str = "Ablations: paired differences") -> plt.Figure:
    """One bar per comparison and gamma (analysis.paired_comparison rows): mean paired
    difference a − b in final accuracy, with ±2 standard errors where there are ≥ 2 seeds."""
    rows = comparisons.reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(rows) + 1.6))
    y = np.arange(len(rows))[::-1]
    err = (2 * rows["s.e."]).fillna(0.0)
    colours = ["tab:green" if d > 0 else "tab:red" for d in rows["difference"]]
    ax.barh(y, rows["difference"], xerr=err if (err > 0).any() else None, color=colours, alpha=0.8, capsize=3)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, [f"{c} (γ={g:g}, n={n})" for c, g, n in zip(rows["comparison"], rows["gamma"], rows["n"])],
                  fontsize=8)
    ax.set_xlabel("difference in final test accuracy (a − b)")
    ax.set_title(title)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color="tab:green", label="a higher"), Patch(color="tab:red", label="a lower")],
              fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def plot_memory(memory: pd.DataFrame) -> plt.Figure:
    """Server memory per method (MiB), as measured at the end of the runs; FedSteer
    variants in red with FedVARP's memory over theirs written at the bar. Methods that keep no
    server state (FedAvg, FedProx, full participation) are named in the title, not drawn."""
    m = memory.copy()
    m["label"] = m["label"].map(clean_label)
    m = m.drop_duplicates("label").set_index("label").loc[method_order(m["label"].unique())].reset_index()
    stateless = m[m["bytes"] <= 0]
    m = m[m["bytes"] > 0]
    steer = m["label"].str.startswith("fedsteer")
    fig, ax = plt.subplots(figsize=(7.5, 0.4 * len(m) + 1.8))
    y = np.arange(len(m))[::-1]
    ax.barh(y, m["MiB"], color=np.where(steer, "tab:red", "tab:blue"))
    for yi, (_, r) in zip(y, m.iterrows()):
        if r["label"].startswith("fedsteer") and r["fedvarp_over_this"] == r["fedvarp_over_this"]:
            ax.text(r["MiB"] + 0.01 * float(m["MiB"].max()), yi, f"{r['fedvarp_over_this']:.1f}× less than FedVARP", va="center", fontsize=7)
    ax.set_yticks(y, [display_name(l) for l in m["label"]], fontsize=8)
    ax.set_xlabel("server memory (MiB)")
    if not m.empty:
        ax.set_xlim(0, float(m["MiB"].max()) * 1.35)
    title = "Server memory (state tensors at the end of a run)"
    if not stateless.empty:
        title += "\nno server state: " + ", ".join(display_name(l) for l in stateless["label"])
    ax.set_title(title, fontsize=10)
    from matplotlib.patches import Patch
    fig.legend(handles=[Patch(color="tab:red", label="FedSteer: O(N|X| + |X|d)"),
                        Patch(color="tab:blue", label="one vector per client: O(Nd)")],
               fontsize=8, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig
