"""What the book's figures share: how a method is drawn (`method_style`, from the registry), the
schematics' own neutral colours (`SCHEMATIC`: greys and line styles, no method's colour), the
client groups' colours, and the size of a figure in the book's column (`COLUMN_WIDTH` inches
wide, every text at least `MIN_FONT` points), with colour limits that a few outliers do not set."""
from __future__ import annotations

from typing import Iterable, Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.text import Text

__all__ = ["CB", "RED", "GROUP_COLOURS", "SCHEMATIC", "KIND_COLOURS", "COLUMN_WIDTH", "MIN_FONT", "column_figure",
           "fit_to_column", "symmetric_limit", "method_style", "label_line_ends", "colorbar"]

CB = sns.color_palette("colorblind", 8)
RED = (0.80, 0.10, 0.10)
# weak/rare (the clients the paper worries about) in a strong red, the others muted
GROUP_COLOURS = {"weak/common": CB[0], "weak/rare": RED, "powerful/common": CB[2], "powerful/rare": CB[4]}
# The schematics (Figs. 1, 5, 8) and the figures of estimates draw in these neutral greys, one
# convention for the whole book: a client's true update solid near-black, its steered estimate
# Q_t s_i dash-dotted dark grey, its stale update h_i dashed light grey, the core set's updates
# thin pale grey (black itself is full participation's).
SCHEMATIC = {"true update g_i": {"color": "#262626", "linestyle": "-"},
             "steered Q_t s_i": {"color": "#5E5E5E", "linestyle": "-."},
             "stale h_i": {"color": "#A0A0A0", "linestyle": "--"},
             "core-set update": {"color": "#C8C8C8", "linestyle": "-"}}
KIND_COLOURS = {"stale h_i": SCHEMATIC["stale h_i"]["color"], "steered Q_t s_i": SCHEMATIC["steered Q_t s_i"]["color"],
                "difference": SCHEMATIC["true update g_i"]["color"]}

COLUMN_WIDTH = 6.4  # inches: the book's text column (about 690 px)
# points: the smallest text a figure may show; 9 pt as displayed once a COLUMN_WIDTH figure at the
# book's 110 dpi (704 px) is scaled into a 690 px column
MIN_FONT = 9.5
_SIZES = {"tick": 9.5, "label": 10.0, "title": 10.5}


def column_figure(nrows: int = 1, ncols: int = 1, *, height: float = 3.2, **kwargs) -> tuple[plt.Figure, np.ndarray]:
    """`plt.subplots` at the column's width and `height` inches, constrained layout, axes always
    a 2-d array; pass the result to `fit_to_column` once drawn."""
    kwargs.setdefault("layout", "constrained")
    return plt.subplots(nrows, ncols, figsize=(COLUMN_WIDTH, height), squeeze=False, **kwargs)


def fit_to_column(fig: plt.Figure) -> plt.Figure:
    """Shrink `fig` to the column's width if it is wider (keeping its aspect ratio) and raise every
    text below `MIN_FONT` (ticks, labels, titles, legends, colour bars) to the book's sizes, so
    that nothing reads smaller than 9 pt in the book's column; returns `fig`."""
    w, h = fig.get_size_inches()
    if w > COLUMN_WIDTH:
        fig.set_size_inches(COLUMN_WIDTH, h * COLUMN_WIDTH / w)
    for ax in fig.axes:
        ax.tick_params(labelsize=_SIZES["tick"])
        for label in (ax.xaxis.label, ax.yaxis.label):
            label.set_fontsize(max(label.get_fontsize(), _SIZES["label"]))
        ax.title.set_fontsize(max(ax.title.get_fontsize(), _SIZES["title"]) if ax.get_title() else _SIZES["title"])
    for text in fig.findobj(Text):
        if text.get_fontsize() < MIN_FONT:
            text.set_fontsize(MIN_FONT)
    return fig


def symmetric_limit(values: Iterable[float] | np.ndarray, percentile: float = 98.0) -> float:
    """Half-width of a colour scale symmetric around 0: the `percentile` of |values| (finite only),
    1.0 when that is 0 or nothing is finite."""
    v = np.abs(np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float).ravel())
    v = v[np.isfinite(v)]
    lim = float(np.percentile(v, percentile)) if len(v) else 0.0
    return lim if lim > 0 else 1.0


def method_style(role: str, **overrides) -> dict:
    """How every figure of the book draws a method (a Table 1 role or a method name): its one
    colour, marker and line style from the method registry (`registry.style`), plus `overrides`
    (e.g. `label=...`, `linewidth=...`)."""
    from ...experiments.registry import style

    return {**style(role), **overrides}


def label_line_ends(ax: plt.Axes, ends: Sequence[tuple[float, float, str, object]], *, pad: float = 0.01,
                    min_gap: float | None = None) -> None:
    """Direct labels instead of a legend: `ends` holds (x, y, text, colour) of each line's last
    point; the labels go just right of the axes' data, in the line's colour, nudged apart
    vertically so that none overlaps (`min_gap` in data units; by default a line of text)."""
    if not ends:
        return
    lo, hi = ax.get_ylim()
    height_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    gap = min_gap if min_gap is not None else 1.2 * MIN_FONT / height_pt * (hi - lo)
    placed: list[float] = []
    for x, y, text, colour in sorted(ends, key=lambda e: e[1]):
        y_text = max(y, placed[-1] + gap) if placed else y
        placed.append(y_text)
        ax.annotate(text, xy=(x, y), xytext=(1 + pad, y_text), textcoords=("axes fraction", "data"), color=colour,
                    va="center", ha="left", fontsize=MIN_FONT, annotation_clip=False)


def colorbar(fig: plt.Figure, mappable, ax, label: str) -> None:
    """A colour bar for a heatmap, labelled with what its colours measure (every heatmap of the
    book has one)."""
    bar = fig.colorbar(mappable, ax=ax, shrink=0.9)
    bar.set_label(label)
