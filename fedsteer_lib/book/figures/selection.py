"""Figures of core-set selection (chapter 4): Algorithm 3's J traces, core sets compared by J, and
greedy swaps against the exhaustive optimum, from the tables of `fedsteer_lib.book.selection`."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
import pandas as pd
import seaborn as sns


__all__ = ["plot_swap_traces", "plot_selection_comparison", "plot_exhaustive"]


def plot_swap_traces(trace: pd.DataFrame, ax: plt.Axes | None = None, *, value: str = "relative_J",
                     random_reference: Sequence[float] | None = None, title: str | None = None) -> plt.Axes:
    """J after the initial core and after each executed swap, cycle after cycle (Algorithm 3).

    `trace` is `selection.swap_trace_table(...)`; `random_reference[c]`, if given, is the
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
    ax.set_xlabel("step (each cycle: its initial core, then one step per executed swap)")
    ax.set_ylabel("J(X) / Σ d_i ‖g_i‖²" if value == "relative_J" else "J(X)")
    if title:
        ax.set_title(title)
    ax.legend(loc="upper right")
    return ax


def plot_selection_comparison(df: pd.DataFrame, ax: plt.Axes | None = None, *, title: str | None = None) -> plt.Axes:
    """Relative J on the last snapshot per selection rule (box + one dot per draw), one colour per k;
    no title unless `title` (the book's caption says what it shows)."""
    ax = ax or plt.gca()
    order = [s for s in ("random", "subsampled", "greedy", "greedy (converged)") if s in set(df["selection"])]
    data = df.assign(core=df["k"].map(lambda k: f"|X| = {k}"))
    sns.boxplot(data=data, x="selection", y="relative_J", hue="core", order=order, ax=ax, fliersize=0,
                boxprops={"alpha": 0.35})
    sns.stripplot(data=data, x="selection", y="relative_J", hue="core", order=order, ax=ax, dodge=True, size=4,
                  legend=False)
    ax.set_xlabel("core-set selection")
    ax.set_ylabel("J(X) / Σ d_i ‖g_i‖²")
    if title:
        ax.set_title(title)
    ax.legend(title="core size")
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
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("J of the exhaustive optimum")
    ax.set_ylabel("J of the selected core")
    if title:
        ax.set_title(title)
    ax.legend()
    return ax
