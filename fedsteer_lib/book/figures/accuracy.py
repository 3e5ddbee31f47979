"""Figures of accuracy: curves over the rounds (Fig. 4, Fig. 6/7) and Table 1 as bars next to the
paper's numbers, from `Book.curves` and the tables of `fedsteer_lib.book.tables` / `stats`. Each returns the matplotlib Figure it drew, sized
for the book's column (`style.COLUMN_WIDTH` wide, every text at least `style.MIN_FONT`).

In the curves and bars, FedSteer, FedAvg and the best baseline of each gamma (Table 1's best
mean among `methods.BASELINES`) are in colour, the other methods thin and grey, full
participation dashed. Each panel has its own legend, named from that panel's Table 1 rows
(FedStale with its own beta). A curve is drawn at the regular evaluation cadence only (rounds
that are multiples of `eval_every`, plus the final round). A run that collapses (its last history
row has `collapsed` True, scored on the diverged model) keeps that score for the rounds it did
not run, as in Table 1; an x marks the mean collapse round and the legend says how many seeds
collapsed.

Used by chapter 6.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..methods import BASELINES

from .style import column_figure, fit_to_column, highlight_colours

__all__ = ["role_legend_names", "cadence_curve",
           "plot_table1_bars"]

_MUTED = "#a3a3a3"


def _best_baseline(t1_gamma: pd.DataFrame) -> str | None:
    """The role of the best baseline at one gamma (`t1_gamma`: Table 1's rows of that gamma):
    the best mean among `BASELINES`, None when none has a mean."""
    base = t1_gamma[t1_gamma["role"].isin(BASELINES) & t1_gamma["mean"].notna()]
    return None if base.empty else base.loc[base["mean"].idxmax(), "role"]


def _role_colours(t1_gamma: pd.DataFrame) -> dict[str, tuple]:
    """Role -> colour for the roles drawn in colour at one gamma (`style.highlight_colours`):
    FedSteer, FedAvg and the best baseline; the other roles are drawn grey."""
    best = _best_baseline(t1_gamma)
    return highlight_colours([r for r in t1_gamma["role"] if r in ("fedsteer", "fedavg", best)], best)


def role_legend_names(t1_gamma: pd.DataFrame) -> dict[str, str]:
    """Role -> its name in a panel's legend: Table 1's name, FedStale with the beta of that
    gamma, the best baseline marked as such."""
    colours = _role_colours(t1_gamma)
    out = {}
    for _, row in t1_gamma.iterrows():
        name = f"FedStale (β={row['beta']:g})" if row["role"] == "fedstale" else row["method"]
        if row["role"] in colours and row["role"] not in ("fedsteer", "fedavg"):
            name += ", best baseline"
        out[row["role"]] = name
    return out


def cadence_curve(history: pd.DataFrame, metric: str, eval_every: int) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Mean and std over seeds of `metric` at the regular cadence (rounds that are multiples of
    `eval_every`, plus the final round `rounds`), and each collapsed seed's collapse round.
    `history` holds one run label at one gamma (`Book.curves` rows). A collapsed seed keeps its
    collapse row's value (its diverged model) for every later round, so the mean counts it as
    Table 1 does (a non-finite loss stays missing, and the mean loss stops there)."""
    final = int(history["rounds"].max())
    flags = history["collapsed"] if "collapsed" in history else pd.Series(False, index=history.index)
    collapsed = flags.fillna(False).astype(bool)
    stops = history[collapsed].set_index("seed")
    keep = (history["round"] % eval_every == 0) | (history["round"] == final)
    grid = history[keep & ~collapsed].pivot_table(index="round", columns="seed", values=metric, aggfunc="first",
                                                  dropna=False)
    rounds = sorted(set(range(eval_every, final + 1, eval_every)) | {final} | set(grid.index))
    grid = grid.reindex(index=rounds, columns=sorted(history["seed"].unique()))
    for seed, row in stops.iterrows():
        grid.loc[grid.index >= row["round"], seed] = row[metric]
    grid = grid.replace([np.inf, -np.inf], np.nan)
    mean = grid.mean(axis=1, skipna=False)
    return mean, grid.std(axis=1, skipna=False).fillna(0.0), stops["round"]


def _draw_panel(ax: plt.Axes, curves: pd.DataFrame, t1_gamma: pd.DataFrame, metric: str, eval_every: int,
                bottom: bool) -> None:
    """One panel: every Table 1 row of one gamma as a curve (colours per `_role_colours`),
    with its collapse marks and its own legend under it (below the x axis' label if `bottom`)."""
    colours, names = _role_colours(t1_gamma), role_legend_names(t1_gamma)
    handles, marks = [], []
    grey = False
    for _, row in t1_gamma.iterrows():
        hist = curves[curves["label"] == row["label"]]
        if hist.empty:
            continue
        mean, std, stops = cadence_curve(hist, metric, eval_every)
        role, colour = row["role"], colours.get(row["role"])
        style = dict(color="black", lw=1.1, ls="--") if role == "full" else (
            dict(color=colour, lw=2.0, zorder=4) if colour else dict(color=_MUTED, lw=0.9, zorder=2))
        line, = ax.plot(mean.index, mean.values, label=names[role], **style)
        if colour:
            ax.fill_between(mean.index, mean - std, mean + std, color=colour, alpha=0.15, lw=0)
        if role == "full" or colour:
            handles.append(line)
        else:
            grey = True
        if len(stops):
            finite = mean.dropna()
            x = float(stops.mean())
            y = float(np.interp(x, finite.index, finite.values)) if len(finite) else np.nan
            ax.plot([x], [y], marker="x", ms=9, mew=2.2, color="black", ls="", zorder=5)
            marks.append(Line2D([], [], marker="x", ms=7, mew=2, ls="", color="black",
                                label=f"{names[role]}: collapsed ({len(stops)} of {hist['seed'].nunique()} seeds)"))
    if grey:
        handles.append(Line2D([], [], color=_MUTED, lw=0.9, label="other methods"))
    ax.legend(handles=handles + marks, loc="upper center", bbox_to_anchor=(0.5, -0.24 if bottom else -0.06), ncol=2,
              frameon=False, columnspacing=1.0, handlelength=1.6)


def plot_table1_bars(t1: pd.DataFrame, runs: pd.DataFrame, *, metric: str = "final_accuracy") -> plt.Figure:
    """Table 1 as bars, one panel per gamma: mean final accuracy per method (FedStale at its
    best beta, named), every seed's run as a dot, the paper's quoted number as a black diamond
    where its text gives one; a method with collapsed runs says how many."""
    gammas = sorted(t1["gamma"].unique())
    fig, axes = column_figure(len(gammas), 1, height=2.9 * len(gammas) + 0.4, sharex=True)
    for ax, gamma in zip(axes[:, 0], gammas):
        sub = t1[np.isclose(t1["gamma"], gamma)].iloc[::-1]
        colours, names = _role_colours(sub), role_legend_names(sub)
        y = np.arange(len(sub))
        ax.barh(y, sub["mean"], color=[colours.get(r, _MUTED) for r in sub["role"]], alpha=0.85, height=0.7)
        at = runs[np.isclose(runs["gamma"], gamma)]
        for yi, label in zip(y, sub["label"]):
            vals = at.loc[at["label"] == label, metric].dropna()
            ax.scatter(vals, np.full(len(vals), yi), s=10, color="black", alpha=0.7, edgecolor="none", zorder=3)
        known = sub["paper"].notna().values
        ax.scatter(sub.loc[known, "paper"], y[known], marker="D", s=28, color="white", edgecolor="black", zorder=4)
        ticks = [names[r] + (f" ({c} of {n} collapsed)" if c else "")
                 for r, c, n in zip(sub["role"], sub["collapsed"], sub["n"])]
        ax.set_yticks(y, ticks)
        ax.grid(axis="y", visible=False)
        ax.set_xlim(0, 1)
        ax.set_title(f"γ = {gamma:g}")
    axes[-1, 0].set_xlabel("final test accuracy")
    key = [Patch(color=_MUTED, label="mean over seeds"),
           Line2D([], [], marker="o", ls="", color="black", alpha=0.7, ms=4, label="one seed"),
           Line2D([], [], marker="D", ls="", color="white", markeredgecolor="black", ms=5, label="paper (quoted)")]
    fig.legend(handles=key, loc="outside lower center", ncol=3, frameon=False)
    return fit_to_column(fig)
