"""Figures of accuracy: curves over the rounds (Fig. 4, Fig. 6/7), Table 1 as bars next to the
paper's numbers, and Fig. 5 (core-set size x lambda), from `Book.curves` and the tables of
`fedsteer_lib.book.tables` / `stats`. Each returns the matplotlib Figure it drew (titles, labelled
axes and legends included), except `plot_curves`, which draws on the axes it is given; call
`plt.show()` after it.

Used by chapters 6 and 7.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..methods import clean_labels, display_name, method_order, palette

__all__ = ["plot_curves", "plot_accuracy_by_gamma", "plot_convergence", "plot_table1_bars", "plot_coreset_lambda"]


def _clean_lookup(curves: pd.DataFrame) -> dict[str, str]:
    """Each run label of `curves` -> its label for reading (`methods.clean_label`, from the
    method columns)."""
    first = curves.drop_duplicates("label")
    return dict(zip(first["label"], clean_labels(first)))


def _clean(curves: pd.DataFrame, lookup: dict[str, str]) -> pd.DataFrame:
    out = curves.copy()
    out["label"] = out["label"].map(lookup)
    return out


def plot_curves(history: pd.DataFrame, ax: plt.Axes | None = None, *, metric: str = "accuracy",
                labels=None, title: str | None = None) -> plt.Axes:
    """Mean (line) and +-1 std over seeds (band) of `metric` per method label, vs round.

    `history` is `Book.curves(...)`'s table: columns round, label, seed, metric.
    """
    ax = ax or plt.gca()
    data = history.dropna(subset=[metric])
    labels = method_order(labels or data["label"].unique())
    colours = palette(labels)
    for label in labels:
        g = data[data["label"] == label].groupby("round")[metric]
        mean, std = g.mean(), g.std().fillna(0.0)
        ax.plot(mean.index, mean.values, label=display_name(label), color=colours[label], lw=1.6)
        ax.fill_between(mean.index, mean - std, mean + std, color=colours[label], alpha=0.15, lw=0)
    ax.set_xlabel("round")
    ax.set_ylabel(metric)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, ncol=2)
    return ax


def _shared_legend(fig: plt.Figure, axes) -> None:
    """One legend under the panels instead of one inside each."""
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8, frameon=False)


def _labels_at(t1: pd.DataFrame | None, gamma: float, curves: pd.DataFrame) -> list[str]:
    """Table 1's run labels at gamma (one FedStale β), else every label of the curves at gamma."""
    if t1 is not None and not t1.empty:
        return list(t1.loc[np.isclose(t1["gamma"], gamma), "label"])
    return list(curves.loc[np.isclose(curves["gamma"], gamma), "label"].unique())


def plot_accuracy_by_gamma(curves: pd.DataFrame, t1: pd.DataFrame | None = None, *, dataset_name: str = "",
                           metric: str = "accuracy") -> plt.Figure:
    """Fig. 4: test accuracy vs round, one panel per gamma, mean ± std over seeds. With `t1`
    (`tables.table1`) only Table 1's rows are drawn (FedStale at its best β)."""
    gammas = sorted(curves["gamma"].unique())
    fig, axes = plt.subplots(1, len(gammas), figsize=(max(7.0, 6.2 * len(gammas)), 5.0), squeeze=False, sharey=True)
    for ax, gamma in zip(axes[0], gammas):
        sub = curves[np.isclose(curves["gamma"], gamma)]
        seeds = sub["seed"].nunique()
        lookup = _clean_lookup(sub)
        plot_curves(_clean(sub, lookup), ax, metric=metric, labels=[lookup[l] for l in _labels_at(t1, gamma, sub)],
                    title=f"{dataset_name} γ={gamma:g} ({seeds} seed{'s' if seeds != 1 else ''})".strip())
        ax.set_ylabel(f"test {metric}")
    _shared_legend(fig, axes[0])
    fig.suptitle("Fig. 4 — test accuracy during training (mean ± std over seeds)")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def plot_convergence(curves: pd.DataFrame, gamma: float, labels: Sequence[str] | None = None, *,
                     dataset_name: str = "", figure: str = "Fig. 6/7") -> plt.Figure:
    """Fig. 6/7: convergence at one gamma of every method (full participation included):
    test accuracy and test loss vs round, mean ± std over seeds."""
    sub = curves[np.isclose(curves["gamma"], gamma)]
    labels = list(labels) if labels is not None else list(sub["label"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(12.4, 5.0))
    lookup = _clean_lookup(sub)
    clean, shown = _clean(sub, lookup), [lookup[l] for l in labels]
    plot_curves(clean, axes[0], metric="accuracy", labels=shown, title="test accuracy")
    plot_curves(clean, axes[1], metric="loss", labels=shown, title="test loss")
    axes[0].set_ylabel("test accuracy")
    axes[1].set_ylabel("test loss (cross-entropy)")
    finite = sub.loc[sub["label"].isin(labels), "loss"].replace([np.inf, -np.inf], np.nan).dropna()
    if not finite.empty:
        axes[1].set_ylim(0, min(float(finite.quantile(0.98)) * 1.1, float(finite.max()) * 1.05))
    _shared_legend(fig, axes)
    fig.suptitle(f"{figure} — {dataset_name} convergence at γ={gamma:g}".replace("  ", " "))
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def plot_table1_bars(t1: pd.DataFrame, *, dataset_name: str = "") -> plt.Figure:
    """Table 1 as bars: mean final accuracy ± std per method and gamma; the paper's quoted
    numbers as black diamonds where its text gives one."""
    gammas = sorted(t1["gamma"].unique())
    fig, axes = plt.subplots(1, len(gammas), figsize=(5.6 * len(gammas), 4.4), squeeze=False, sharex=True)
    for ax, gamma in zip(axes[0], gammas):
        sub = t1[np.isclose(t1["gamma"], gamma)].iloc[::-1]
        colours = palette(sub["label"])
        y = np.arange(len(sub))
        ax.barh(y, sub["mean"], xerr=sub["std"].fillna(0.0), color=[colours[l] for l in sub["label"]],
                alpha=0.85, label="ours (mean ± std)")
        has_paper = sub["paper"].notna()
        if has_paper.any():
            ax.scatter(sub.loc[has_paper, "paper"], y[has_paper.values], marker="D", color="black", zorder=3,
                       label="paper (quoted in the text)")
        ax.set_yticks(y, sub["method"])
        ax.set_xlabel("final test accuracy")
        ax.set_xlim(0, 1)
        ax.set_title(f"{dataset_name} γ={gamma:g}".strip())
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("Table 1 — final accuracy per method")
    fig.tight_layout()
    return fig


def plot_coreset_lambda(table: pd.DataFrame, *, dataset_name: str = "") -> plt.Figure:
    """Fig. 5: final accuracy vs core-set size |X| for λ = 0 and λ = 0.5 (enforce=5), mean ±
    std over seeds, one panel per gamma."""
    gammas = sorted(table["gamma"].unique())
    fig, axes = plt.subplots(1, len(gammas), figsize=(5.6 * len(gammas), 4.0), squeeze=False, sharey=True)
    for ax, gamma in zip(axes[0], gammas):
        sub = table[np.isclose(table["gamma"], gamma)]
        for lam, grp in sub.groupby("lam"):
            grp = grp.sort_values("core_size")
            ax.errorbar(grp["core_size"], grp["mean"], yerr=grp["std"].fillna(0.0), marker="o", capsize=3,
                        label=f"λ={lam:g}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(sub["core_size"].unique()), [str(k) for k in sorted(sub["core_size"].unique())])
        ax.set_xlabel("core-set size |X|")
        ax.set_ylabel("final test accuracy")
        n = int(sub["n"].min()) if not sub.empty else 0
        ax.set_title(f"{dataset_name} γ={gamma:g} ({n} seed{'s' if n != 1 else ''})".strip())
        ax.legend(title="ridge λ", fontsize=8)
    fig.suptitle("Fig. 5 — core-set size × regularisation (FedSteer, enforce=5)")
    fig.tight_layout()
    return fig
