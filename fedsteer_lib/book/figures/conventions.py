"""Figures of `fedsteer_lib.book.conventions`: Table 1 under both baseline conventions (with
every seed as a point) and the regime map as heatmaps. Sized for the book's column (6.4 in
wide, fonts of at least 9 pt)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...experiments.registry import colour, display_name
from ..conventions import at_best_fedstale_beta

__all__ = ["plot_conventions", "plot_regime_map"]

_MUTED = "#9a9a9a"
_HIGHLIGHT = ("fedsteer", "fedsteer_as_written", "fedavg", "fedavg_unbiased")


def plot_conventions(runs: pd.DataFrame, rows: list[tuple[str, str, str]], metric: str = "final_accuracy") -> plt.Figure:
    """One panel per gamma (largest first); per method row the mean under today's convention
    (left, lighter bar) and the FedStale code base's (right bar), every seed as a dot; FedStale
    at its best beta of that gamma, as in the tables. FedSteer and FedAvg in colour, the rest muted."""
    gammas = sorted(runs["gamma"].unique(), reverse=True)
    fig, axes = plt.subplots(len(gammas), 1, figsize=(6.4, 3.1 * len(gammas) + 0.3), squeeze=False, sharex=True)
    width = 0.38
    for ax, gamma in zip(axes[:, 0], gammas):
        at = at_best_fedstale_beta(runs[np.isclose(runs["gamma"], gamma)], metric)
        for i, (name, normalised, framework) in enumerate(rows):
            for j, key in enumerate((normalised, framework)):
                sel = at[at["role"] == key][metric].dropna()
                if sel.empty:
                    continue
                x = i + (j - 0.5) * width
                face = colour(key) if key in _HIGHLIGHT else _MUTED
                ax.bar(x, sel.mean(), width * 0.92, color=face, alpha=0.55 if j == 0 else 0.95,
                       edgecolor="black", linewidth=0.4)
                ax.scatter(np.full(len(sel), x), sel, s=9, color="black", zorder=3)
        ax.set_ylabel("final test accuracy", fontsize=10)
        ax.set_ylim(0, 1)
        ax.tick_params(axis="y", labelsize=9)
        ax.set_title(f"γ = {gamma:g}: left bar today's convention, right bar the FedStale code base's", fontsize=10)
    axes[-1, 0].set_xticks(range(len(rows)), [r[0] for r in rows], rotation=35, ha="right", fontsize=9)
    fig.tight_layout()
    return fig


def _grid(table: pd.DataFrame, value: str) -> pd.DataFrame:
    return table.pivot(index="local_epochs", columns="client_lr", values=value).sort_index(ascending=False)


def _heat(ax, grid: pd.DataFrame, text: pd.DataFrame, cmap: str, vmin: float, vmax: float, title: str):
    im = ax.imshow(grid.values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.grid(False)
    ax.set_xticks(range(grid.shape[1]), [f"{c:g}" for c in grid.columns], fontsize=9)
    ax.set_yticks(range(grid.shape[0]), [str(r) for r in grid.index], fontsize=9)
    ax.set_xlabel("client lr", fontsize=9)
    ax.set_ylabel("local epochs E", fontsize=9)
    ax.set_title(title, fontsize=10)
    for (r, c), label in np.ndenumerate(text.values):
        if isinstance(label, str) and label:
            shade = im.cmap(im.norm(grid.values[r, c]))
            dark = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] < 0.5
            ax.text(c, r, label, ha="center", va="center", fontsize=8, color="white" if dark else "black")
    return im


def plot_regime_map(summary: pd.DataFrame, gains: pd.DataFrame, roles: list[str]) -> plt.Figure:
    """Left: each role's mean final accuracy per (client lr, E) cell, one small panel per role;
    right-most: FedSteer's paired gain over the cell's best baseline (mean ± std over seeds),
    on a diverging scale centred at zero whose range is set by the 90th percentile of |gain|
    (robust to one outlying cell)."""
    n = len(roles) + 1
    cols = 4
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(6.4, 1.9 * rows + 0.4), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, role in zip(axes.flat, roles):
        sel = summary[summary["role"] == role]
        if sel.empty:
            ax.set_visible(False)
            continue
        grid = _grid(sel, "mean")
        text = grid.map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
        _heat(ax, grid, text, "viridis", 0.1, 0.9, display_name(role))
    ax = axes.flat[len(roles)]
    if gains.empty:
        ax.set_visible(False)
    else:
        scale = max(float(np.nanpercentile(gains["gain"].abs(), 90)), 0.01)
        grid = _grid(gains, "gain")
        std = _grid(gains, "gain_std")
        text = grid.copy().astype(object)
        for idx in grid.index:
            for col in grid.columns:
                g, s = grid.loc[idx, col], std.loc[idx, col]
                text.loc[idx, col] = "" if pd.isna(g) else (f"{g:+.2f}" + ("" if pd.isna(s) else f"\n±{s:.2f}"))
        _heat(ax, grid, text, "RdBu", -scale, scale, "gain over best")
    fig.tight_layout()
    return fig
