"""Figures of the stability of FedSteer's coordinates s_i (chapter 8, Fig. 8), from the tables
of `fedsteer_lib.book.coordinates`."""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


__all__ = ["plot_coordinate_heatmaps", "plot_refresh_changes"]


def plot_coordinate_heatmaps(histories: Mapping[str, Mapping[int, np.ndarray]], *,
                             marks: Mapping[str, Mapping[int, Sequence[int]]] | None = None, cmap: str = "RdBu_r",
                             title: str | None = None) -> plt.Figure:
    """Fig. 8: one heatmap of s_i per (setting, tracked client); rows of the grid are settings,
    columns clients. In each heatmap rows are the coordinate index j (1..|X|), columns the
    round; every setting has its own symmetric colour scale. `marks[setting][client]` (e.g.
    the refresh rounds) are drawn as small triangles above the heatmap."""
    settings = list(histories)
    clients = sorted({c for h in histories.values() for c in h})
    fig, axes = plt.subplots(len(settings), len(clients), figsize=(3.6 * len(clients) + 1.0, 2.6 * len(settings)),
                             squeeze=False, constrained_layout=True)
    for r, name in enumerate(settings):
        vmax = max(float(np.abs(h).max()) for h in histories[name].values()) or 1.0
        image = None
        for c, client in enumerate(clients):
            ax = axes[r, c]
            h = histories[name].get(client)
            if h is None:
                ax.set_axis_off()
                continue
            image = ax.imshow(h.T, aspect="auto", origin="lower", cmap=cmap, vmin=-vmax, vmax=vmax,
                              interpolation="nearest", extent=(-0.5, h.shape[0] - 0.5, 0.5, h.shape[1] + 0.5))
            for t in (marks or {}).get(name, {}).get(client, []):
                ax.plot(t, h.shape[1] + 0.5, marker="v", ms=5, color="k", clip_on=False)
            ax.set_title(f"{name}: client {client}", fontsize=9)
            ax.set_xlabel("round")
            ax.set_ylabel("coordinate j of s_i")
            ax.grid(False)
        if image is not None:
            fig.colorbar(image, ax=list(axes[r]), shrink=0.9, label="s_ij")
    fig.suptitle(title or "Coordinates s_i of three clients over the rounds")
    return fig


def plot_refresh_changes(events: pd.DataFrame, title: str | None = None) -> plt.Figure:
    """Cosine and relative change of s_i at each refresh (`coordinates.coordinate_stability`
    rows with a `setting` column), one colour per setting."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, col, lab in ((axes[0], "cosine", "cosine(s before, s after)"),
                         (axes[1], "relative_change", "||Δs|| / ||s before||")):
        for name, g in events.groupby("setting", sort=False):
            ax.scatter(g["round"], g[col], s=22, label=name)
        ax.set_xlabel("round of the refresh")
        ax.set_ylabel(lab)
        ax.set_title(f"{lab} at each refresh")
    axes[0].axhline(0, color="0.5", lw=0.8)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
