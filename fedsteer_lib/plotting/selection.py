"""Figures of chapters 4 (core-set selection), 5 (convergence: the variance term) and
8 (coordinate stability). Inputs are the tidy tables of `fedsteer_lib.diagnostics`."""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter
import pandas as pd
import seaborn as sns

from .common import display_name, method_order, palette

__all__ = ["method_display", "plot_swap_traces", "plot_selection_comparison", "plot_exhaustive", "plot_memory",
           "plot_variance_term", "plot_coordinate_heatmaps", "plot_refresh_changes"]


def method_display(label: str) -> str:
    """`common.display_name`, plus FedStale's beta when it is the default (the label omits it):
    'fedstale' -> 'FedStale (β=0.7)'."""
    from ..config import METHODS

    if label == "fedstale":
        return f"{display_name(label)} (β={METHODS['fedstale']['beta']})"
    return display_name(label)


def plot_swap_traces(trace: pd.DataFrame, ax: plt.Axes | None = None, *, value: str = "relative_J",
                     random_reference: Sequence[float] | None = None, title: str | None = None) -> plt.Axes:
    """J after the initial core and after each executed swap, cycle after cycle (Algorithm 3).

    `trace` is `diagnostics.swap_trace_table(...)`; `random_reference[c]`, if given, is the
    median J (same units as `value`) of random core sets on cycle c's snapshot.
    """
    ax = ax or plt.gca()
    colours = sns.color_palette("colorblind", n_colors=max(3, trace["cycle"].nunique()))
    for cycle, g in trace.groupby("cycle"):
        ax.plot(g["step"], g[value], marker="o", ms=4, lw=1.5, color=colours[cycle], label=f"cycle {cycle + 1}")
        if random_reference is not None:
            ax.hlines(random_reference[cycle], g["step"].min(), g["step"].max(), colors=colours[cycle],
                      linestyles=":", lw=1.2)
        if cycle > 0:
            ax.axvline(g["step"].min() - 0.5, color="0.6", lw=0.8, ls="--")
    if random_reference is not None:
        ax.plot([], [], color="0.3", ls=":", label="median random core (same snapshot)")
    ax.set_xlabel("step (initial core of each cycle, then one executed swap per step)")
    ax.set_ylabel("J(X) / Σ d_i ||g_i||²" if value == "relative_J" else "J(X)")
    ax.set_title(title or "Algorithm 3: J(X) through the greedy swaps and selection cycles")
    ax.legend(fontsize=8, loc="center right")
    return ax


def plot_selection_comparison(df: pd.DataFrame, ax: plt.Axes | None = None, *, title: str | None = None) -> plt.Axes:
    """Relative J on the last snapshot per selection rule (box + one dot per draw), one colour per k."""
    ax = ax or plt.gca()
    order = [s for s in ("random", "subsampled", "greedy", "greedy (converged)") if s in set(df["selection"])]
    data = df.assign(core=df["k"].map(lambda k: f"|X| = {k}"))
    sns.boxplot(data=data, x="selection", y="relative_J", hue="core", order=order, ax=ax, fliersize=0,
                boxprops={"alpha": 0.35})
    sns.stripplot(data=data, x="selection", y="relative_J", hue="core", order=order, ax=ax, dodge=True, size=4,
                  legend=False)
    ax.set_xlabel("core-set selection")
    ax.set_ylabel("J(X) / Σ d_i ||g_i||²  (last snapshot)")
    ax.set_title(title or "Core sets compared by the objective J (lower is better)")
    ax.legend(title="core size", fontsize=8)
    return ax


def plot_exhaustive(df: pd.DataFrame, ax: plt.Axes | None = None, *, title: str | None = None) -> plt.Axes:
    """Greedy (converged) and random J against the exhaustive optimum, one point per instance."""
    ax = ax or plt.gca()
    ax.scatter(df["J_opt"], df["J_random"], s=14, color="0.6", label="random core")
    ax.scatter(df["J_opt"], df["J_greedy"], s=18, color=sns.color_palette("colorblind")[3], label="greedy swaps")
    lo = float(min(df["J_opt"].min(), df["J_greedy"].min()))
    hi = float(max(df["J_random"].max(), df["J_greedy"].max()))
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, label="optimum (y = x)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("J of the exhaustive optimum")
    ax.set_ylabel("J of the selected core")
    ax.set_title(title or "Greedy swaps vs exhaustive search")
    ax.legend(fontsize=8)
    return ax


def plot_memory(table: pd.DataFrame, model: str, ax: plt.Axes | None = None, *, title: str | None = None) -> plt.Axes:
    """Server-state bytes against N (log-log) for one model size of `diagnostics.server_memory_table`."""
    ax = ax or plt.gca()
    data = table[table["model"] == model]
    labels = list(dict.fromkeys(data["label"]))
    colours = dict(zip(labels, sns.color_palette("colorblind", n_colors=max(3, len(labels)))))
    styles = iter(["--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 2))])
    for label in labels:
        g = data[data["label"] == label].sort_values("N")
        ls = "-" if label.startswith("FedSteer") else next(styles, "--")
        ax.plot(g["N"], g["bytes"], marker="o", ms=4, ls=ls, lw=1.8, color=colours[label], label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of clients N")
    ax.set_ylabel("server state (bytes)")
    d = int(data["d"].iloc[0])
    ax.set_title(title or f"Server memory, {model} (d = {d:,})")
    ax.legend(fontsize=8)
    return ax


def plot_variance_term(table: pd.DataFrame, ax: plt.Axes | None = None, *, metric: str = "mse_to_mean",
                       title: str | None = None) -> plt.Axes:
    """`metric` (default E||Delta_t - sum_i d_i g_i||^2) per method over the probe rounds, log scale;
    mean over seeds. `table` is `diagnostics.probe_table(...)` for one gamma."""
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
    """Cosine and relative change of s_i at each refresh (`diagnostics.coordinate_stability`
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
