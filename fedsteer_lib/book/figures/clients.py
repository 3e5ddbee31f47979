"""Figures of the FL system (chapter 1): label histograms of the two data groups and the staleness
of each client group, from the tables of `fedsteer_lib.book.clients`."""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..clients import GROUPS as _GROUPS
from .style import CB as _cb
from .style import GROUP_COLOURS

__all__ = ["plot_label_histograms", "plot_staleness_distribution", "plot_mean_staleness"]


def plot_label_histograms(table: pd.DataFrame, axes: Sequence[plt.Axes]) -> Sequence[plt.Axes]:
    """One panel per gamma: number of training points per label in the common-label and the
    rare-label group (`clients.label_histograms`)."""
    colours = {"common": _cb[0], "rare": (0.80, 0.10, 0.10)}
    for ax, (gamma, g) in zip(axes, table.groupby("gamma")):
        labels = sorted(g["label"].unique())
        x = np.arange(len(labels))
        for off, group in ((-0.2, "common"), (0.2, "rare")):
            gg = g[g["group"] == group].set_index("label").reindex(labels)
            n, per = int(gg["clients"].iloc[0]), int(gg["points_per_client"].iloc[0])
            ax.bar(x + off, gg["count"], width=0.4, color=colours[group],
                   label=f"{group}: {n} clients × {per} points")
        ax.set_xticks(x, [str(v) for v in labels])
        ax.set_ylim(0, 1.1 * float(g["count"].max()))
        ax.set_xlabel("label")
        ax.set_ylabel("training points" if ax is axes[0] else "")
        ax.set_title(f"γ = {gamma:g}")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, handlelength=1.2)
    return axes


def plot_staleness_distribution(table: pd.DataFrame, ax: plt.Axes | None = None) -> plt.Axes:
    """Share of (round, client) pairs with each staleness value, per group
    (`clients.staleness_table`); the weak rare-label group is drawn thick."""
    ax = ax or plt.gca()
    top = int(table["staleness"].max())
    bins = np.arange(1, top + 2)
    for group in _GROUPS:
        v = table.loc[table["group"] == group, "staleness"].to_numpy()
        if len(v) == 0:
            continue
        hist, _ = np.histogram(v, bins=bins)
        ax.step(bins[:-1], hist / len(v), where="mid", color=GROUP_COLOURS[group],
                lw=3.0 if group == "weak/rare" else 1.4, label=group)
    ax.set_xlabel("staleness (rounds)")
    ax.set_ylabel("share of (round, client) pairs")
    ax.set_title("Staleness of each group")
    ax.legend()
    return ax


def plot_mean_staleness(table: pd.DataFrame, expected: Mapping[str, np.ndarray], limits: Mapping[str, float],
                        ax: plt.Axes | None = None) -> plt.Axes:
    """Mean staleness per round and group (points) against its finite-horizon expectation
    (lines, `clients.expected_staleness`) and the stationary value 1/p (dashed)."""
    ax = ax or plt.gca()
    mean = table.groupby(["group", "round"])["staleness"].mean().reset_index()
    for group in _GROUPS:
        m = mean[mean["group"] == group]
        if m.empty:
            continue
        c = GROUP_COLOURS[group]
        ax.plot(m["round"], m["staleness"], "o", ms=3.5, color=c, label=f"{group} (simulated)")
        ax.plot(m["round"], expected[group], "-", color=c, lw=2.5 if group == "weak/rare" else 1.2)
        ax.axhline(limits[group], ls="--", lw=0.8, color=c)
    ax.set_xlabel("round t")
    ax.set_ylabel("mean staleness")
    ax.set_title("Mean staleness over the rounds")
    ax.legend(ncol=2)
    return ax
