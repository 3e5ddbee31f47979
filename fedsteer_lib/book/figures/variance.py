"""Figure of Theorem 2's partial-update variance term along training (chapter 5), from
`fedsteer_lib.book.variance.variance_probe_table`, sized for the book's column."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..methods import method_display, method_order, palette
from .style import COLUMN_WIDTH, fit_to_column, highlight_colours

__all__ = ["plot_variance_term", "plot_variance_term_panels"]

_YLABELS = {"mse_to_mean": "E‖Δ_t − Σ d_i g_i‖²", "mc_variance": "E‖Δ_t − EΔ_t‖²",
            "relative_mse": "E‖Δ_t − Σ d_i g_i‖² / ‖Σ d_i g_i‖²"}
_MARKERS = "osD^v<>ph*X"


def plot_variance_term(table: pd.DataFrame, ax: plt.Axes | None = None, *, metric: str = "mse_to_mean",
                       title: str | None = None, colours: dict[str, tuple] | None = None) -> plt.Axes:
    """`metric` (default E||Delta_t - sum_i d_i g_i||^2) per method over the probe rounds, log scale;
    mean over seeds. `table` is `variance.variance_probe_table(...)` for one gamma; `colours`
    ({label: colour}, default `methods.palette`) — a label coloured grey is drawn thin, behind."""
    ax = ax or plt.gca()
    labels = method_order(table["label"].unique())
    colours = colours or palette(labels)
    for n, label in enumerate(labels):
        g = table[table["label"] == label].groupby("round")[metric].mean()
        muted = len(set(colours[label])) == 1 and colours[label] != (0.0, 0.0, 0.0)
        ax.plot(g.index, g.values, marker=_MARKERS[n % len(_MARKERS)], ms=3.5 if muted else 4.5,
                lw=1.0 if muted else 2.2, color=colours[label], label=method_display(label), zorder=1 if muted else 3)
    ax.set_yscale("log")
    ax.set_xlabel("round t")
    ax.set_ylabel(_YLABELS.get(metric, metric))
    if title:
        ax.set_title(title)
    return ax


def _colours(labels: Sequence[str], best: str | None) -> dict[str, tuple]:
    """`style.highlight_colours` for FedSteer, FedAvg and `best`; every other label in a grey shade."""
    greys = [(0.45, 0.45, 0.45), (0.62, 0.62, 0.62), (0.75, 0.75, 0.75)]
    ordered = method_order(labels)
    colours = highlight_colours(ordered, best)
    muted = [label for label in ordered if label not in colours]
    return {label: colours.get(label) or greys[muted.index(label) % len(greys)] for label in ordered}


def plot_variance_term_panels(table: pd.DataFrame, best: dict[float, str] | None = None) -> plt.Figure:
    """One row per gamma of `table` (`variance.variance_probe_table`): term (b) (left) and the
    same relative to ||sum_i d_i g_i||^2 (right), FedSteer, FedAvg and `best[gamma]` in colour,
    the other methods grey; one legend per row, under it."""
    gammas = sorted(table["gamma"].unique())
    fig = plt.figure(figsize=(COLUMN_WIDTH, 3.9 * len(gammas)), layout="constrained")
    for sub, gamma in zip(np.atleast_1d(fig.subfigures(len(gammas), 1)), gammas):
        g = table[table["gamma"] == gamma]
        colours = _colours(g["label"].unique(), (best or {}).get(gamma))
        axes = sub.subplots(1, 2)
        plot_variance_term(g, axes[0], metric="mse_to_mean", title=f"term (b), γ = {gamma}", colours=colours)
        plot_variance_term(g, axes[1], metric="relative_mse", title=f"relative to ‖Σ d_i g_i‖², γ = {gamma}",
                           colours=colours)
        axes[1].set_ylabel("relative term (b)")
        handles, names = axes[0].get_legend_handles_labels()
        sub.legend(handles, names, loc="outside lower center", ncol=3, frameon=False, columnspacing=1.0,
                   handlelength=1.6)
    return fit_to_column(fig)
