"""Figures of the geometry of steering (chapter 2): the toy 3-D subspace and its rotation, and the
reconstruction errors of real updates, from the tables of `fedsteer_lib.book.geometry`."""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from .style import CB as _cb
from .style import KIND_COLOURS as _KIND_COLOURS

__all__ = ["plot_toy_subspace", "plot_toy_rotation", "plot_reconstruction"]


def _unit(v: torch.Tensor) -> np.ndarray:
    v = v.double()
    return (v / v.norm()).numpy()


def plot_toy_subspace(ax, core: torch.Tensor, grad: torch.Tensor, recon: Mapping[str, torch.Tensor],
                      title: str, stale: torch.Tensor | None = None):
    """A 3-D axes: the plane spanned by the two core vectors (Eq. 1), the core vectors, the
    client gradient g, its reconstructions Q s for the labels of `recon` and, if given, the
    stale update h; labelled arrows, no legend (draw one for the figure)."""
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
    first = 2 if stale is not None else 0  # the steered estimate (next to a stale h) in green, projections in blue/orange
    for j, (label, vec) in enumerate(recon.items(), start=first):
        arrow(vec, _cb[j % 8 if j % 8 != 3 else 5], label, lw=1.6)
    lim = 1.1 * max(float(t.double().norm()) for t in [a, b, grad, *recon.values()])
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_zlim(-lim, lim)
    ax.set_title(title)
    return ax


def plot_toy_rotation(table: pd.DataFrame, axes: Sequence[plt.Axes]) -> Sequence[plt.Axes]:
    """One panel per scenario of `geometry.toy_rotation_study`: cos(h_i, g') and
    cos(Q_{t+k} s_i, g') against the angle the subspace turned."""
    for ax, (scenario, g) in zip(axes, table.groupby("scenario", sort=False)):
        ax.plot(g["angle_deg"], g["cos_stale"], color=_KIND_COLOURS["stale h_i"], lw=2, label="stale h_i")
        ax.plot(g["angle_deg"], g["cos_steered"], color=_KIND_COLOURS["steered Q_t s_i"], lw=2, ls="--",
                label="steered Q_{t+k} s_i")
        ax.set_xlabel("angle the core turned (degrees)")
        ax.set_ylabel("cosine with the true gradient g'")
        ax.set_title(f"client gradient {scenario}")
        ax.set_ylim(-0.05, 1.05)
        ax.legend()
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
        ax.legend()
    return axes
