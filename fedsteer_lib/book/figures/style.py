"""Colours shared by the figures of chapters 1-3: one per client group (the weak rare-label
clients, those the paper worries about, in a strong red) and one per kind of estimate."""
from __future__ import annotations

import seaborn as sns

__all__ = ["CB", "RED", "GROUP_COLOURS", "KIND_COLOURS"]

CB = sns.color_palette("colorblind", 8)
RED = (0.80, 0.10, 0.10)
# weak/rare (the clients the paper worries about) in a strong red, the others muted
GROUP_COLOURS = {"weak/common": CB[0], "weak/rare": RED, "powerful/common": CB[2], "powerful/rare": CB[4]}
KIND_COLOURS = {"stale h_i": CB[7], "steered Q_t s_i": RED, "difference": CB[0]}
