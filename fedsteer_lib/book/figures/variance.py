"""Figure of Theorem 2's partial-update variance term along training (chapter 5), from
`fedsteer_lib.book.variance.variance_probe_table`."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from ..methods import method_display, method_order, palette

__all__ = ["plot_variance_term"]


def plot_variance_term(table: pd.DataFrame, ax: plt.Axes | None = None, *, metric: str = "mse_to_mean",
                       title: str | None = None) -> plt.Axes:
    """`metric` (default E||Delta_t - sum_i d_i g_i||^2) per method over the probe rounds, log scale;
    mean over seeds. `table` is `variance.variance_probe_table(...)` for one gamma."""
    ax = ax or plt.gca()
    labels = method_order(table["label"].unique())
    colours = palette(labels)
    markers = "osD^v<>ph*X"
    for n, label in enumerate(labels):
        g = table[table["label"] == label].groupby("round")[metric].mean()
        lw = 2.4 if label.startswith("fedsteer") else 1.3
        ax.plot(g.index, g.values, marker=markers[n % len(markers)], ms=4, lw=lw, color=colours[label],
                label=method_display(label))
    ax.set_yscale("log")
    ax.set_xlabel("round t")
    ax.set_ylabel({"mse_to_mean": "E||Δ_t − Σ d_i g_i||²", "mc_variance": "E||Δ_t − EΔ_t||²",
                   "relative_mse": "E||Δ_t − Σ d_i g_i||² / ||Σ d_i g_i||²"}.get(metric, metric))
    ax.set_title(title or "Partial-update variance term along training")
    ax.legend(fontsize=7, ncol=2)
    return ax
