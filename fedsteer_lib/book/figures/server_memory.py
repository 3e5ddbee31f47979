"""Figures of server memory: bars of the memory measured at the end of the runs, next to FedVARP's
(chapter 10, from `server_memory.run_memory_table`), and the state size against the number of clients N
for a model size (chapter 4, from `server_memory.server_memory_table`)."""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..methods import display_name, method_order

__all__ = ["plot_memory_bars", "plot_memory_scaling"]


def plot_memory_bars(memory: pd.DataFrame) -> plt.Figure:
    """Server memory per method (MiB), as measured at the end of the runs (`run_memory_table`); FedSteer
    variants in red with FedVARP's memory over theirs written at the bar. Methods that keep no
    server state (FedAvg, FedProx, full participation) are named below the bars, not drawn.
    6.4 in wide, texts of 9 pt and more."""
    m = memory.copy()
    m = m.drop_duplicates("label").set_index("label").loc[method_order(m["label"].unique())].reset_index()
    stateless = m[m["bytes"] <= 0]
    m = m[m["bytes"] > 0]
    steer = m["label"].str.startswith("fedsteer")
    fig, ax = plt.subplots(figsize=(6.4, 0.3 * len(m) + 1.9))
    y = np.arange(len(m))[::-1]
    ax.barh(y, m["MiB"], color=np.where(steer, "tab:red", "tab:blue"))
    for yi, (_, r) in zip(y, m.iterrows()):
        if r["label"].startswith("fedsteer") and r["fedvarp_over_this"] == r["fedvarp_over_this"]:
            ax.text(r["MiB"] + 0.01 * float(m["MiB"].max()), yi, f"{r['fedvarp_over_this']:.1f}× less", va="center",
                    fontsize=9)
    ax.set_yticks(y, [display_name(l) for l in m["label"]], fontsize=9)
    ax.tick_params(axis="x", labelsize=9)
    none = "no server state: " + ", ".join(display_name(l) for l in stateless["label"]) if not stateless.empty else ""
    ax.set_xlabel("\n".join(["server memory (MiB), state at the end of a run", *textwrap.wrap(none, 48)]), fontsize=10)
    if not m.empty:
        ax.set_xlim(0, float(m["MiB"].max()) * 1.3)
    from matplotlib.patches import Patch
    fig.legend(handles=[Patch(color="tab:red", label="FedSteer, O(N|X| + |X|d)"),
                        Patch(color="tab:blue", label="a vector per client, O(Nd)")],
               fontsize=9, loc="upper center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))
    return fig


def plot_memory_scaling(table: pd.DataFrame, model: str, ax: plt.Axes | None = None, *,
                        title: str | None = None) -> plt.Axes:
    """Server-state bytes against N (log-log) for one model size of `server_memory.server_memory_table`."""
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
    ax.set_title(title or f"{model} (d = {d:,})")
    ax.legend()
    return ax
