"""Figures of chapters 1-3 (problem formulation, corrective projection, variance minimisation).

Every function takes tidy tables (pandas, from `fedsteer_lib.probes`) or tensors, draws on the
matplotlib axes it is given (or the current ones) and returns them.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch

__all__ = [
    "GROUP_COLOURS", "plot_label_histograms", "plot_staleness_distribution", "plot_mean_staleness",
    "plot_effective_weights", "plot_error_distribution", "plot_variance_shares", "plot_toy_subspace",
    "plot_toy_rotation", "plot_reconstruction", "plot_alignment", "plot_alignment_by_group",
    "plot_variance_comparison", "plot_bias", "plot_relative_variances",
]

_GROUPS = ("weak/common", "weak/rare", "powerful/common", "powerful/rare")
_cb = sns.color_palette("colorblind", 8)
# weak/rare (the clients the paper worries about) in a strong red, the others muted
GROUP_COLOURS = {"weak/common": _cb[0], "weak/rare": (0.80, 0.10, 0.10), "powerful/common": _cb[2],
                 "powerful/rare": _cb[4]}
_KIND_COLOURS = {"stale h_i": _cb[7], "steered Q_t s_i": (0.80, 0.10, 0.10), "difference": _cb[0]}


def plot_label_histograms(table: pd.DataFrame, axes: Sequence[plt.Axes]) -> Sequence[plt.Axes]:
    """One panel per gamma: number of training points per label in the common-label and the
    rare-label group (`probes.label_histograms`)."""
    colours = {"common": _cb[0], "rare": (0.80, 0.10, 0.10)}
    for ax, (gamma, g) in zip(axes, table.groupby("gamma")):
        labels = sorted(g["label"].unique())
        x = np.arange(len(labels))
        for off, group in ((-0.2, "common"), (0.2, "rare")):
            gg = g[g["group"] == group].set_index("label").reindex(labels)
            n, per = int(gg["clients"].iloc[0]), int(gg["points_per_client"].iloc[0])
            ax.bar(x + off, gg["count"], width=0.4, color=colours[group],
                   label=f"{group}-label group: {n} clients x {per} points")
        ax.set_xticks(x, [str(v) for v in labels])
        ax.set_ylim(0, 1.35 * float(g["count"].max()))
        ax.set_xlabel("label")
        ax.set_ylabel("training points")
        ax.set_title(f"γ = {gamma:g}")
        ax.legend(fontsize=8, loc="upper center")
    return axes


def plot_staleness_distribution(table: pd.DataFrame, ax: plt.Axes | None = None) -> plt.Axes:
    """Share of (round, client) pairs with each staleness value, per group
    (`probes.staleness_table`); the weak rare-label group is drawn thick."""
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
    ax.set_xlabel("staleness (rounds since last participation; t+1 if never)")
    ax.set_ylabel("share of (round, client) pairs")
    ax.set_title("How stale each group's last update is")
    ax.legend(fontsize=8)
    return ax


def plot_mean_staleness(table: pd.DataFrame, expected: Mapping[str, np.ndarray], limits: Mapping[str, float],
                        ax: plt.Axes | None = None) -> plt.Axes:
    """Mean staleness per round and group (points) against its finite-horizon expectation
    (lines, `probes.expected_staleness`) and the stationary value 1/p (dashed)."""
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
    ax.set_title("Mean staleness: simulation (dots), E[S_t] (lines), 1/p (dashed)")
    ax.legend(fontsize=7, ncol=2)
    return ax


def plot_effective_weights(table: pd.DataFrame, ax: plt.Axes | None = None) -> plt.Axes:
    """Per group, the expected total coefficient sum_i E[c_i(A)] that an aggregation rule gives
    the group's updates, next to its share sum_i d_i of the objective. Columns: group, rule, weight."""
    ax = ax or plt.gca()
    sns.barplot(data=table, x="group", y="weight", hue="rule", ax=ax, order=[g for g in _GROUPS if g in set(table["group"])])
    ax.set_xlabel("client group")
    ax.set_ylabel("total weight of the group's updates")
    ax.set_title("Weight each group gets in expectation")
    ax.legend(fontsize=8)
    return ax


def plot_error_distribution(errors: Mapping[str, np.ndarray], target_norm: float, ax: plt.Axes | None = None) -> plt.Axes:
    """Histogram over participation draws of ||Delta - sum_i d_i g_i|| / ||sum_i d_i g_i||, one per rule."""
    ax = ax or plt.gca()
    allv = np.concatenate([np.asarray(v) / target_norm for v in errors.values()])
    bins = np.linspace(0, np.quantile(allv, 0.995), 60)
    for j, (label, v) in enumerate(errors.items()):
        ax.hist(np.asarray(v) / target_norm, bins=bins, histtype="step", lw=1.8, density=True, color=_cb[j], label=label)
    ax.set_xlabel("relative error of the aggregate  ||Δ − Σ d_i g_i|| / ||Σ d_i g_i||")
    ax.set_ylabel("density over participation draws")
    ax.set_title("How far one round's aggregate is from the full-participation update")
    ax.legend(fontsize=8)
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
        ax.legend(fontsize=8)
    ax.set_xlabel("client group")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return ax


def _unit(v: torch.Tensor) -> np.ndarray:
    v = v.double()
    return (v / v.norm()).numpy()


def plot_toy_subspace(ax, core: torch.Tensor, grad: torch.Tensor, recon: Mapping[str, torch.Tensor],
                      title: str, stale: torch.Tensor | None = None):
    """A 3-D axes: the plane spanned by the two core vectors (Eq. 1), the core vectors, the
    client gradient g, its reconstructions Q s for the labels of `recon` and, if given, the
    stale update h."""
    core = core.double()
    a, b = core[0], core[1]
    u, v = np.meshgrid(np.linspace(-1.2, 1.2, 2), np.linspace(-1.2, 1.2, 2))
    ea, eb = _unit(a), _unit(b)
    plane = u[..., None] * ea + v[..., None] * eb
    ax.plot_surface(plane[..., 0], plane[..., 1], plane[..., 2], alpha=0.15, color="grey")

    def arrow(vec, colour, label, ls="-", lw=2.0):
        vec = vec.double().numpy()
        ax.quiver(0, 0, 0, *vec, color=colour, lw=lw, linestyle=ls, arrow_length_ratio=0.08, label=label)

    arrow(a, "black", "core vectors h_j (span Q)", lw=1.5)
    arrow(b, "black", None, lw=1.5)
    arrow(grad, (0.80, 0.10, 0.10), "client gradient g")
    if stale is not None:
        arrow(stale, _cb[7], "stale update h_i", ls="--")
    for j, (label, vec) in enumerate(recon.items()):
        arrow(vec, _cb[j % 8 if j % 8 != 3 else 5], label, lw=1.6)
    lim = 1.1 * max(float(t.double().norm()) for t in [a, b, grad, *recon.values()])
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_zlim(-lim, lim)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_zlabel("z")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    return ax


def plot_toy_rotation(table: pd.DataFrame, axes: Sequence[plt.Axes]) -> Sequence[plt.Axes]:
    """One panel per scenario of `probes.toy_rotation_study`: cos(h_i, g') and
    cos(Q_{t+k} s_i, g') against the angle the subspace turned."""
    for ax, (scenario, g) in zip(axes, table.groupby("scenario", sort=False)):
        ax.plot(g["angle_deg"], g["cos_stale"], color=_KIND_COLOURS["stale h_i"], lw=2, label="stale h_i")
        ax.plot(g["angle_deg"], g["cos_steered"], color=_KIND_COLOURS["steered Q_t s_i"], lw=2, ls="--",
                label="steered Q_{t+k} s_i")
        ax.set_xlabel("angle the core turned (degrees)")
        ax.set_ylabel("cosine with the true gradient g'")
        ax.set_title(f"client gradient {scenario}", fontsize=10)
        ax.set_ylim(-0.05, 1.05)
        ax.legend(fontsize=8)
    return axes


def plot_reconstruction(summary: pd.DataFrame, axes: Sequence[plt.Axes], value: str = "rel_error") -> Sequence[plt.Axes]:
    """Panels per λ: median over clients (line) and interquartile range (band) of `value`
    against the core size k, one line per kind ('in-sample', 'steered', 'fresh', 'stale').
    Columns of `summary`: lam, k, kind, median, q25, q75."""
    colours = {"in-sample": _cb[0], "steered": (0.80, 0.10, 0.10), "fresh": _cb[2], "stale": _cb[7]}
    for ax, (lam, g) in zip(axes, summary.groupby("lam")):
        for kind, gk in g.groupby("kind", sort=False):
            gk = gk.sort_values("k")
            ax.plot(gk["k"], gk["median"], "o-", color=colours.get(kind), label=kind, lw=1.8)
            ax.fill_between(gk["k"], gk["q25"], gk["q75"], color=colours.get(kind), alpha=0.15, lw=0)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(g["k"].unique()), [str(k) for k in sorted(g["k"].unique())])
        ax.set_xlabel("core size k = |X|")
        ax.set_ylabel("‖g − ĝ‖² / ‖g‖²" if value == "rel_error" else value)
        if value == "rel_error":
            ax.axhline(1.0, color="black", lw=0.8, ls=":")
        ax.set_title(f"λ = {lam:g}")
        ax.legend(fontsize=8)
    return axes


def plot_alignment(summary: pd.DataFrame, ax: plt.Axes | None = None, title: str = "",
                   measures: Sequence[str] = ("stale h_i", "steered Q_t s_i"),
                   categories: Sequence[str] | None = None) -> plt.Axes:
    """Mean +- standard error of the cosine with the true update per staleness bin
    (`probes.alignment_by_staleness`), one line per measure. `categories`: the bins of the x
    axis (default: those present in `summary`)."""
    ax = ax or plt.gca()
    if categories is None:
        cats = list(summary["bin"].cat.categories) if hasattr(summary["bin"], "cat") else sorted(summary["bin"].unique())
        present = [c for c in cats if c in set(summary["bin"].astype(str))]
    else:
        present = list(categories)
    x = {c: j for j, c in enumerate(present)}
    for off, m in zip(np.linspace(-0.08, 0.08, len(measures)), measures):
        g = summary[summary["measure"] == m]
        if g.empty:
            continue
        xs = np.array([x[str(b)] for b in g["bin"]]) + off
        ax.errorbar(xs, g["mean"], yerr=g["se"].fillna(0.0), fmt="o-", capsize=3, lw=1.6,
                    color=_KIND_COLOURS.get(m), label=f"cos({m}, g_i)" if m != "difference" else "steered − stale")
    ax.set_xticks(range(len(present)), present)
    ax.set_xlim(-0.5, len(present) - 0.5)
    ax.set_xlabel("staleness of client i (rounds)")
    if tuple(measures) == ("difference",):
        ax.set_ylabel("cos(Q_t s_i, g_i) − cos(h_i, g_i)")
    else:
        ax.set_ylabel("cosine with the true update g_i")
    if "difference" in measures:
        ax.axhline(0.0, color="black", lw=0.8)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return ax


def plot_alignment_by_group(summary: pd.DataFrame, axes: Sequence[plt.Axes]) -> Sequence[plt.Axes]:
    """`plot_alignment` in one panel per client group (column 'group' of `summary`), all on the
    same staleness bins; the legend is drawn in the first panel only."""
    cats = list(summary["bin"].cat.categories) if hasattr(summary["bin"], "cat") else sorted(summary["bin"].unique())
    present = [c for c in cats if c in set(summary["bin"].astype(str))]
    for j, (ax, group) in enumerate(zip(axes, _GROUPS)):
        g = summary[summary["group"] == group]
        if g.empty:
            ax.set_title(f"{group}: no probe rows")
            ax.axis("off")
            continue
        plot_alignment(g, ax, title=group, categories=present)
        if j and ax.get_legend() is not None:
            ax.get_legend().remove()
    return axes


def plot_variance_comparison(table: pd.DataFrame, ax: plt.Axes | None = None) -> plt.Axes:
    """Bars: Theorem 1's closed-form variance per estimator; dots with error bars: the
    Monte-Carlo estimate +- 2 standard errors where available. Columns: estimator,
    closed_form, mc_variance (NaN if none), mc_variance_se."""
    ax = ax or plt.gca()
    x = np.arange(len(table))
    ax.bar(x, table["closed_form"], color=_cb[0], alpha=0.7, label="Theorem 1 (closed form)")
    mc = table["mc_variance"].to_numpy(dtype=float)
    ok = ~np.isnan(mc)
    ax.errorbar(x[ok], mc[ok], yerr=2 * table["mc_variance_se"].to_numpy(dtype=float)[ok], fmt="o", color="black",
                capsize=4, label="Monte Carlo ± 2 SE")
    ax.set_xticks(x, table["estimator"], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("E‖Δ − E[Δ]‖²")
    ax.set_title("Variance of one round's aggregate")
    ax.legend(fontsize=8)
    return ax


def plot_bias(table: pd.DataFrame, ax: plt.Axes | None = None) -> plt.Axes:
    """Relative bias ||E[Delta] - sum d_i g_i|| / ||sum d_i g_i|| per estimator (bars) and the
    level Monte-Carlo noise alone produces (4 x noise_norm, black ticks). Columns: estimator,
    relative_bias, relative_noise."""
    ax = ax or plt.gca()
    x = np.arange(len(table))
    ax.bar(x, table["relative_bias"], color=[_cb[2], (0.80, 0.10, 0.10)][: len(table)] + [_cb[0]] * max(0, len(table) - 2))
    ax.scatter(x, 4 * table["relative_noise"], marker="_", s=900, color="black", zorder=3,
               label="4 × Monte-Carlo noise level")
    ax.set_yscale("log")
    ax.set_xticks(x, table["estimator"], fontsize=9)
    ax.set_ylabel("‖mean(Δ) − Σ d_i g_i‖ / ‖Σ d_i g_i‖")
    ax.set_title("Bias of the two orderings of FedSteer")
    ax.legend(fontsize=8, loc="center left")
    return ax


def plot_relative_variances(table: pd.DataFrame, ax: plt.Axes | None = None) -> plt.Axes:
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
    ax.set_yticks(y, [f"{c}\n[{s}]" for c, s in zip(table["coordinates"], table["subspace"])], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("Theorem 1 variance / variance of unbiased FedAvg (log scale)")
    ax.set_title("Same cache, different coordinates (hatched: oracle, uses the current g_i)")
    return ax
