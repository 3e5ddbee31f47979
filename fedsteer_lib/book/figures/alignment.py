"""Figures of the alignment of stale and steered estimates with the true updates by staleness
(chapter 2), from `fedsteer_lib.book.alignment.alignment_by_staleness`."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..clients import GROUPS as _GROUPS
from .style import KIND_COLOURS as _KIND_COLOURS

__all__ = ["plot_alignment", "plot_alignment_by_group"]


def plot_alignment(summary: pd.DataFrame, ax: plt.Axes | None = None, title: str = "",
                   measures: Sequence[str] = ("stale h_i", "steered Q_t s_i"),
                   categories: Sequence[str] | None = None) -> plt.Axes:
    """Mean +- standard error of the cosine with the true update per staleness bin
    (`alignment.alignment_by_staleness`), one line per measure. `categories`: the bins of the x
    axis (default: those present in `summary`)."""
    ax = ax or plt.gca()
    if categories is None:
        cats = list(summary["bin"].cat.categories) if hasattr(summary["bin"], "cat") else sorted(summary["bin"].unique())
        present = [c for c in cats if c in set(summary["bin"].astype(str))]
    else:
        present = list(categories)
    x = {c: j for j, c in enumerate(present)}
    for off, m in zip(np.linspace(-0.08, 0.08, len(measures)), measures):
        g = summary[summary["measure"] == m]
        if g.empty:
            continue
        xs = np.array([x[str(b)] for b in g["bin"]]) + off
        ax.errorbar(xs, g["mean"], yerr=g["se"].fillna(0.0), fmt="o-", capsize=3, lw=1.6,
                    color=_KIND_COLOURS.get(m), label=f"cos({m}, g_i)" if m != "difference" else "steered − stale")
    many = len(present) > 5  # long bin names side by side would overlap
    ax.set_xticks(range(len(present)), present, rotation=45 if many else 0, ha="right" if many else "center",
                  rotation_mode="anchor")
    ax.set_xlim(-0.5, len(present) - 0.5)
    ax.set_xlabel("staleness of client i (rounds)")
    if tuple(measures) == ("difference",):
        ax.set_ylabel("cos(Q_t s_i, g_i) − cos(h_i, g_i)")
    else:
        ax.set_ylabel("cosine with the true update g_i")
    if "difference" in measures:
        ax.axhline(0.0, color="black", lw=0.8)
    ax.set_title(title)
    ax.legend()
    return ax


def plot_alignment_by_group(summary: pd.DataFrame, axes: Sequence[plt.Axes]) -> Sequence[plt.Axes]:
    """`plot_alignment` in one panel per client group (column 'group' of `summary`), all on the
    same staleness bins; the legend is drawn in the first panel only."""
    cats = list(summary["bin"].cat.categories) if hasattr(summary["bin"], "cat") else sorted(summary["bin"].unique())
    present = [c for c in cats if c in set(summary["bin"].astype(str))]
    for j, (ax, group) in enumerate(zip(axes, _GROUPS)):
        g = summary[summary["group"] == group]
        if g.empty:
            ax.set_title(f"{group}: no probe rows")
            ax.axis("off")
            continue
        plot_alignment(g, ax, title=group, categories=present)
        if j and ax.get_legend() is not None:
            ax.get_legend().remove()
    return axes
