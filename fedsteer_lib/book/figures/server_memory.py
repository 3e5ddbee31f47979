"""Figures of server memory: bars of the memory measured at the end of the runs, next to FedVARP's
(chapter 10, from `server_memory.run_memory_table`)."""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...experiments.registry import colour
from ..methods import display_name, method_order

__all__ = ["plot_memory_bars"]


def plot_memory_bars(memory: pd.DataFrame) -> plt.Figure:
    """Server memory per method (MiB), as measured at the end of the runs (`run_memory_table`); FedSteer
    variants in FedSteer's colour with FedVARP's memory over theirs written at the bar, the methods
    that keep a vector per client in grey (each named on the axis). Methods that keep no
    server state (FedAvg, FedProx, full participation) are named below the bars, not drawn.
    6.4 in wide, texts of 9 pt and more."""
    m = memory.copy()
    m = m.drop_duplicates("label").set_index("label").loc[method_order(m["label"].unique())].reset_index()
    stateless = m[m["bytes"] <= 0]
    m = m[m["bytes"] > 0]
    steer = m["label"].str.startswith("fedsteer")
    fig, ax = plt.subplots(figsize=(6.4, 0.3 * len(m) + 1.9))
    y = np.arange(len(m))[::-1]
    steer_colour, per_client_colour = colour("fedsteer"), "0.55"
    ax.barh(y, m["MiB"], color=np.where(steer, steer_colour, per_client_colour))
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
    fig.legend(handles=[Patch(color=steer_colour, label="FedSteer, O(N|X| + |X|d)"),
                        Patch(color=per_client_colour, label="a vector per client, O(Nd)")],
               fontsize=9, loc="upper center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))
    return fig
