"""Figures of aggregation rules as estimators (chapters 1 and 3): the weight each client group gets,
the error of one round's aggregate over participation draws, Theorem 1's variance by group and
per estimator against Monte Carlo, the bias of the two orderings of Eq. 4, and the variance of
several choices of coordinates, from the tables of `fedsteer_lib.book.aggregation`."""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ..clients import GROUPS as _GROUPS
from .style import CB as _cb
from .style import GROUP_COLOURS

__all__ = ["plot_effective_weights", "plot_error_distribution", "plot_variance_shares", "plot_variance_comparison",
           "plot_relative_by_seed", "plot_bias", "plot_relative_variances"]


def plot_effective_weights(table: pd.DataFrame, ax: plt.Axes | None = None) -> plt.Axes:
    """Per group, the expected total coefficient sum_i E[c_i(A)] that an aggregation rule gives
    the group's updates, next to its share sum_i d_i of the objective. Columns: group, rule, weight."""
    ax = ax or plt.gca()
    sns.barplot(data=table, x="group", y="weight", hue="rule", ax=ax, order=[g for g in _GROUPS if g in set(table["group"])])
    ax.set_xlabel("client group")
    ax.set_ylabel("total weight of the group's updates")
    ax.set_title("Weight each group gets in expectation")
    ax.legend()
    return ax


def plot_error_distribution(errors: Mapping[str, np.ndarray], target_norm: float, ax: plt.Axes | None = None) -> plt.Axes:
    """Histogram over participation draws of ||Delta - sum_i d_i g_i|| / ||sum_i d_i g_i||, one per rule."""
    ax = ax or plt.gca()
    allv = np.concatenate([np.asarray(v) / target_norm for v in errors.values()])
    bins = np.linspace(0, np.quantile(allv, 0.995), 60)
    for j, (label, v) in enumerate(errors.items()):
        ax.hist(np.asarray(v) / target_norm, bins=bins, histtype="step", lw=1.8, density=True, color=_cb[j], label=label)
    ax.set_xlabel("relative error  ‖Δ − Σ d_i g_i‖ / ‖Σ d_i g_i‖")
    ax.set_ylabel("density over draws")
    ax.set_title("Distance of one round's aggregate from full participation")
    ax.legend()
    return ax


def plot_variance_shares(table: pd.DataFrame, ax: plt.Axes | None = None, value: str = "share",
                         hue: str | None = None, ylabel: str = "share of the aggregate's variance",
                         title: str = "Who makes the aggregate noisy (Theorem 1, term by term)") -> plt.Axes:
    """Theorem 1's variance by client group (columns: group, `value`[, `hue`]): one bar per
    group, or per group and `hue` (e.g. the estimator)."""
    ax = ax or plt.gca()
    order = [g for g in _GROUPS if g in set(table["group"])]
    if hue is None:
        ax.bar(order, table.set_index("group").loc[order, value], color=[GROUP_COLOURS[g] for g in order])
    else:
        sns.barplot(data=table, x="group", y=value, hue=hue, order=order, ax=ax)
        ax.legend()
    ax.set_xlabel("client group")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return ax


def plot_variance_comparison(table: pd.DataFrame, ax: plt.Axes | None = None, *, title: str | None = None) -> plt.Axes:
    """Bars: Theorem 1's closed-form variance per estimator; dots with error bars: the
    Monte-Carlo estimate +- 2 standard errors where available. Columns: estimator,
    closed_form, mc_variance (NaN if none), mc_variance_se. No title unless `title`."""
    ax = ax or plt.gca()
    x = np.arange(len(table))
    ax.bar(x, table["closed_form"], color=_cb[0], alpha=0.7, label="Theorem 1 (closed form)")
    mc = table["mc_variance"].to_numpy(dtype=float)
    ok = ~np.isnan(mc)
    ax.errorbar(x[ok], mc[ok], yerr=2 * table["mc_variance_se"].to_numpy(dtype=float)[ok], fmt="o", color="black",
                capsize=4, label="Monte Carlo ± 2 SE")
    ax.set_xticks(x, table["estimator"])
    ax.set_ylabel("E‖Δ − E[Δ]‖²")
    if title:
        ax.set_title(title)
    ax.legend(loc="lower right")
    return ax


def plot_relative_by_seed(table: pd.DataFrame, columns: Sequence[str], ax: plt.Axes | None = None, *,
                          labels: Sequence[str] | None = None) -> plt.Axes:
    """One column of dots per comparison (`columns` of `table`, one row per seed, e.g.
    `aggregation.variance_by_seed`'s FedSteer / other - 1; tick `labels`, default the column
    names): every seed a dot, the mean over seeds ± one standard deviation as a black diamond
    with a bar, a line at 0 (no difference)."""
    ax = ax or plt.gca()
    for j, col in enumerate(columns):
        v = table[col].to_numpy(dtype=float)
        jitter = np.linspace(-0.12, 0.12, len(v)) if len(v) > 1 else np.zeros(1)
        ax.scatter(j + jitter, v, s=22, color=_cb[j], alpha=0.8, edgecolor="none", zorder=3)
        spread = float(v.std(ddof=1)) if len(v) > 1 else 0.0
        ax.errorbar([j + 0.3], [v.mean()], yerr=[spread], fmt="D", ms=5, color="black", capsize=4, zorder=4)
    ax.axhline(0.0, color="black", lw=0.8, ls=":")
    ax.set_xticks(range(len(columns)), list(labels or columns))
    ax.set_xlim(-0.5, len(columns) - 0.3)
    ax.set_ylabel("FedSteer / other − 1")
    return ax


def plot_bias(table: pd.DataFrame, ax: plt.Axes | None = None, *, title: str | None = None) -> plt.Axes:
    """Relative bias ||E[Delta] - sum d_i g_i|| / ||sum d_i g_i|| per estimator (bars) and the
    level Monte-Carlo noise alone produces (4 x noise_norm, black ticks). Columns: estimator,
    relative_bias, relative_noise."""
    ax = ax or plt.gca()
    x = np.arange(len(table))
    ax.bar(x, table["relative_bias"], color=[_cb[2], (0.80, 0.10, 0.10)][: len(table)] + [_cb[0]] * max(0, len(table) - 2))
    ax.scatter(x, 4 * table["relative_noise"], marker="_", s=900, color="black", zorder=3,
               label="4 × Monte-Carlo noise level")
    ax.set_yscale("log")
    ax.set_xticks(x, table["estimator"])
    ax.set_ylabel("‖mean(Δ) − Σ d_i g_i‖ / ‖Σ d_i g_i‖")
    if title:
        ax.set_title(title)
    ax.legend(loc="center left")
    return ax


def plot_relative_variances(table: pd.DataFrame, ax: plt.Axes | None = None, *, title: str | None = None) -> plt.Axes:
    """Horizontal bars of Theorem 1's variance relative to unbiased FedAvg for several choices
    of coordinates on the same cache. Columns: coordinates, subspace, relative_to_unbiased_FedAvg;
    rows whose coordinates mention 'oracle' are hatched."""
    ax = ax or plt.gca()
    y = np.arange(len(table))
    vals = table["relative_to_unbiased_FedAvg"].to_numpy(dtype=float)
    oracle = table["coordinates"].str.contains("oracle").to_numpy()
    colours = [_cb[2] if o else (_cb[0] if v <= 1 else (0.80, 0.10, 0.10)) for o, v in zip(oracle, vals)]
    bars = ax.barh(y, vals, color=colours)
    for bar, o in zip(bars, oracle):
        if o:
            bar.set_hatch("//")
    ax.set_yticks(y, [f"{c}\n[{s}]" for c, s in zip(table["coordinates"], table["subspace"])])
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("variance / unbiased FedAvg's (log scale)")
    if title:
        ax.set_title(title)
    return ax
