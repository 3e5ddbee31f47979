"""Figures that compare: every number the paper quotes against ours (chapter 10, from
`tables.compare_with_paper`) and the paired differences of the ablations (chapter 7, from
`stats.paired_comparison`)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from matplotlib.ticker import PercentFormatter

__all__ = ["plot_ours_vs_paper", "plot_differences"]

_SHORT = {"gain_vs_fedavg": "gain vs FedAvg", "gain_vs_best_baseline": "gain vs best baseline",
          "min_gain_vs_best_baseline": "min gain vs best baseline", "subsample_drop": "subsampling drop"}


def plot_ours_vs_paper(compare: pd.DataFrame) -> plt.Figure:
    """Every compared number of `tables.compare_with_paper`: ours against the paper's, with
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


def plot_differences(comparisons: pd.DataFrame, *, title: str = "Ablations: paired differences") -> plt.Figure:
    """One bar per comparison and gamma (`stats.paired_comparison` rows): mean paired
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
