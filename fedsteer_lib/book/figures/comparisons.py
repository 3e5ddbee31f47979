"""Figures that compare: the paired differences of the ablations, every seed a dot (chapter 7,
from `stats.family_verdicts`). Our numbers against the paper's are in `paper_comparison`."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

__all__ = ["plot_differences"]



def plot_differences(family: pd.DataFrame) -> plt.Figure:
    """One panel per gamma (largest first), one bar per comparison (`stats.family_verdicts`
    rows): the mean paired difference a − b in final accuracy, every seed's difference as a dot.
    The bar is coloured only where the test allows a verdict (Holm-adjusted p < 0.05 with at
    least 5 seeds), grey otherwise. Sized for the book's column (6.4 in wide, text >= 9 pt)."""
    gammas = sorted(family["gamma"].unique(), reverse=True)
    counts = [int(np.isclose(family["gamma"], g).sum()) for g in gammas]
    fig, axes = plt.subplots(len(gammas), 1, figsize=(6.4, 0.3 * sum(counts) + 1.0 * len(gammas) + 0.6),
                             squeeze=False, sharex=True, gridspec_kw={"height_ratios": counts or [1]})
    kinds = {"bar: mean, a higher (Holm p < 0.05)": "tab:green", "bar: mean, a lower (Holm p < 0.05)": "tab:red",
             "bar: mean, no verdict (n < 5 or p ≥ 0.05)": "0.75"}
    for ax, gamma in zip(axes[:, 0], gammas):
        rows = family[np.isclose(family["gamma"], gamma)].reset_index(drop=True)
        y = np.arange(len(rows))[::-1]
        higher, lower, neither = kinds.values()
        colours = [(higher if d > 0 else lower) if s else neither for s, d in zip(rows["significant"], rows["difference"])]
        ax.barh(y, rows["difference"], color=colours, height=0.7)
        for yi, diffs in zip(y, rows["differences"]):
            ax.scatter(diffs, np.full(len(diffs), yi), s=10, color="black", zorder=3)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(y, [f"{c} (n = {n})" for c, n in zip(rows["comparison"], rows["n"])], fontsize=9)
        ax.tick_params(axis="x", labelsize=9)
        ax.set_title(f"γ = {gamma:g}", fontsize=10)
    axes[-1, 0].set_xlabel("a − b in final test accuracy", fontsize=10)
    dot = Line2D([], [], marker="o", ls="", color="black", markersize=4, label="one seed's difference")
    fig.legend(handles=[Patch(color=c, label=k) for k, c in kinds.items()] + [dot], fontsize=9, loc="lower center",
               ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.55 / fig.get_figheight(), 1, 1))
    return fig
