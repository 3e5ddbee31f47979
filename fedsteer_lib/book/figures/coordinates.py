"""Figures of the stability of FedSteer's coordinates s_i (chapter 8, Fig. 8), from the tables
of `fedsteer_lib.book.coordinates`, sized for the book's column."""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .style import CB, column_figure, fit_to_column, symmetric_limit

__all__ = ["plot_coordinate_heatmaps", "plot_refresh_changes"]


def plot_coordinate_heatmaps(histories: Mapping[str, Mapping[int, np.ndarray]], *,
                             marks: Mapping[str, Mapping[int, Sequence[int]]] | None = None, cmap: str = "RdBu_r",
                             title: str | None = None) -> plt.Figure:
    """Fig. 8: one heatmap of s_i per (setting, tracked client); rows of the grid are settings,
    columns clients. In each heatmap rows are the coordinate index j (1..|X|), columns the
    round. Each heatmap has its own symmetric colour scale, ±(98th percentile of its |s_ij|), so
    that neither one large coordinate nor another client's magnitude flattens it: the colours
    show s_ij relative to that scale (one shared colour bar, -1..1). `marks[setting][client]`
    (e.g. the refresh rounds) are drawn as small triangles above the heatmap."""
    settings = list(histories)
    clients = sorted({c for h in histories.values() for c in h})
    fig, axes = column_figure(len(settings), len(clients), height=1.75 * len(settings) + 0.6,
                              sharex=True)
    image = None
    for r, name in enumerate(settings):
        for c, client in enumerate(clients):
            ax, h = axes[r, c], histories[name].get(client)
            if h is None:
                ax.set_axis_off()
                continue
            scale = symmetric_limit(h)
            image = ax.imshow(h.T / scale, aspect="auto", origin="lower", cmap=cmap, vmin=-1, vmax=1,
                              interpolation="nearest", extent=(-0.5, h.shape[0] - 0.5, 0.5, h.shape[1] + 0.5))
            for t in (marks or {}).get(name, {}).get(client, []):
                ax.plot(t, h.shape[1] + 0.5, marker="v", ms=4, color="k", clip_on=False)
            ax.grid(False)
            if r == 0:
                ax.set_title(f"client {client}", pad=8)
            if c == 0:
                ax.set_ylabel(f"{name}\ncoordinate j")
            if r == len(settings) - 1:
                ax.set_xlabel("round")
    if image is not None:
        fig.colorbar(image, ax=axes, orientation="horizontal", location="bottom", shrink=0.6, aspect=30, ticks=[-1, -0.5, 0, 0.5, 1],
                     label=r"$s_{ij}$ / 98th percentile of $|s_{ij}|$ in the panel")
    if title:
        fig.suptitle(title)
    return fit_to_column(fig)


def plot_refresh_changes(events: pd.DataFrame, title: str | None = None, *, min_cosine: float | None = None,
                         max_change: float | None = None) -> plt.Figure:
    """Cosine and relative change of s_i at each refresh (`coordinates.coordinate_stability`
    rows with a `setting` column), one colour per setting, one legend under both panels; the
    verdict's thresholds `min_cosine` and `max_change`, when given, as dashed lines."""
    fig, axes = column_figure(1, 2, height=3.3)
    settings = list(dict.fromkeys(events["setting"]))
    for ax, col, lab in ((axes[0, 0], "cosine", "cos(s before, s after)"),
                         (axes[0, 1], "relative_change", "‖Δs‖ / ‖s before‖")):
        for n, name in enumerate(settings):
            g = events[events["setting"] == name]
            ax.scatter(g["round"], g[col], s=18, color=CB[n % len(CB)], label=name, alpha=0.8)
        ax.set_xlabel("round of the refresh")
        ax.set_ylabel(lab)
    axes[0, 0].axhline(0, color="0.5", lw=0.8)
    axes[0, 1].set_yscale("log")
    for ax, level in ((axes[0, 0], min_cosine), (axes[0, 1], max_change)):
        if level is not None:
            ax.axhline(level, color="k", ls="--", lw=1)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, frameon=False)
    if title:
        fig.suptitle(title)
    return fit_to_column(fig)
