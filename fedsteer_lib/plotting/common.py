"""Shared names, colours and the accuracy-curve plot."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

__all__ = ["display_name", "method_order", "palette", "plot_curves"]

_NAMES = {
    "fedavg": "FedAvg", "fedavg_unbiased": "FedAvg (unbiased)", "fedvarp": "FedVARP", "fedstale": "FedStale",
    "scaffold": "SCAFFOLD", "mifa": "MIFA", "fedprox": "FedProx", "full": "Full participation", "fedsteer": "FedSteer",
}
_ORDER = ["full", "fedsteer", "fedavg", "fedavg_unbiased", "fedvarp", "fedstale", "mifa", "scaffold", "fedprox"]


def display_name(label: str) -> str:
    """'fedstale(beta=0.7)' -> 'FedStale (β=0.7)', 'fedsteer(refresh_every=5)' -> 'FedSteer (enforce=5)'."""
    name, _, rest = label.partition("(")
    pretty = _NAMES.get(name, name)
    if not rest:
        return pretty
    args = rest.rstrip(")").replace("beta=", "β=").replace("lam=", "λ=").replace("core_size=", "|X|=")
    args = args.replace("refresh_every=", "enforce=")
    return f"{pretty} ({args})"


def method_order(labels) -> list[str]:
    """Labels sorted in the book's fixed method order (then alphabetically)."""
    def key(label: str):
        name = label.partition("(")[0]
        return (_ORDER.index(name) if name in _ORDER else len(_ORDER), label)
    return sorted(set(labels), key=key)


def palette(labels) -> dict[str, tuple]:
    """A stable colour per label (FedSteer variants in reds, full participation in black)."""
    ordered = method_order(labels)
    steer = [lab for lab in ordered if lab.startswith("fedsteer")]
    others = [lab for lab in ordered if not lab.startswith("fedsteer") and not lab.startswith("full")]
    out = {lab: (0.0, 0.0, 0.0) for lab in ordered if lab.startswith("full")}
    out.update(zip(steer, sns.color_palette("Reds_r", n_colors=len(steer) + 1)))
    blues_greens = [c for c in sns.color_palette("colorblind", n_colors=10) if c[0] < 0.8 or c[1] > 0.5]
    out.update(zip(others, (blues_greens * (len(others) // len(blues_greens) + 1))))
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
