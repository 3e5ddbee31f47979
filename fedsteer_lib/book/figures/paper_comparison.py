"""Our results against the numbers the paper quotes, every seed a dot (chapter 10, from
`claim_verdicts.quoted_number_seeds`)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import PercentFormatter

from .style import CB, RED

__all__ = ["plot_quoted_numbers"]

_UNITS = {"accuracy": "final test accuracy", "gain": "relative gain of FedSteer"}


def plot_quoted_numbers(seeds: pd.DataFrame) -> plt.Figure:
    """One row per quoted number we compare (accuracies above, relative gains below): our
    per-seed values as dots, their mean as a black bar, the paper's number as a red diamond.
    6.4 in wide, for the book's column."""
    kinds = [k for k in ("accuracy", "gain") if (seeds["kind"] == k).any()]
    rows = {k: list(dict.fromkeys(seeds.loc[seeds["kind"] == k, "what"])) for k in kinds}
    fig, axes = plt.subplots(len(kinds), 1, figsize=(6.4, 0.42 * sum(map(len, rows.values())) + 1.3 * len(kinds)),
                             gridspec_kw={"height_ratios": [len(rows[k]) + 1 for k in kinds]}, squeeze=False)
    rng = np.random.default_rng(0)
    for ax, kind in zip(axes[:, 0], kinds):
        part = seeds[seeds["kind"] == kind]
        for y, what in enumerate(rows[kind][::-1]):
            v = part[part["what"] == what]
            ax.scatter(v["value"], y + rng.uniform(-0.15, 0.15, len(v)), s=16, color=CB[0], alpha=0.6, lw=0,
                       label="ours, one seed" if y == 0 else None, zorder=2)
            ax.plot([v["value"].mean()] * 2, [y - 0.3, y + 0.3], color="black", lw=2.2,
                    label="ours, mean" if y == 0 else None, zorder=3)
            ax.scatter([v["paper"].iloc[0]], [y], marker="D", s=42, color=RED, label="paper" if y == 0 else None,
                       zorder=4)
        ax.set_yticks(range(len(rows[kind])), rows[kind][::-1], fontsize=9)
        ax.set_ylim(-0.6, len(rows[kind]) - 0.4)
        ax.set_xlabel(_UNITS[kind], fontsize=10)
        ax.tick_params(axis="x", labelsize=9)
        if kind == "gain":
            ax.axvline(0, color="grey", lw=0.8, ls="--")
            ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].legend(fontsize=9, loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=3, frameon=False)
    fig.tight_layout()
    return fig
