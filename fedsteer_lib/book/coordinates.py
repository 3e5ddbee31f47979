"""The coordinates s_i of tracked clients at each refresh (paper §8.5, Fig. 8): what the claims
ledger's "coordinates-stable" row and chapter 8 both measure.

A FedSteer run with `Diagnostics(track_coords=...)` records s_i of the tracked clients after
every round; the refresh rule (Eq. 3 recomputed when the client is active and at least
`refresh_every` rounds have passed) says when s_i may change. At each refresh with a recorded
'before' we compare s_i just before and just after: the cosine and the relative change.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = ["coords_histories", "refresh_rounds", "cosine", "coordinate_changes", "coordinate_stability"]


def coords_histories(payload: Mapping[str, Any]) -> dict[int, np.ndarray]:
    """{client: (rounds, k) array} of a FedSteer run's `extras["coords_history"]`: row t is
    s_i after round t."""
    hist = payload.get("extras", {}).get("coords_history")
    if not hist:
        raise ValueError("this run recorded no coordinates; use Diagnostics(track_coords=(...)) with FedSteer")
    return {int(c): np.asarray(v, dtype=np.float64) for c, v in hist.items()}


def refresh_rounds(participation: Sequence[Sequence[int]], client: int, refresh_every: int) -> list[int]:
    """The rounds at which FedSteer recomputes s_i of `client` (Eq. 3): the client is active and
    at least `refresh_every` rounds have passed since its last refresh (refresh_every=5 is the
    paper's enforce=5)."""
    if refresh_every < 1:
        raise ValueError(f"refresh_every must be >= 1, got {refresh_every}")
    out, last = [], None
    for t, active in enumerate(participation):
        if client in active and (last is None or t - last >= refresh_every):
            out.append(t)
            last = t
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """cos(a, b); NaN when either is the zero vector."""
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else float("nan")


def coordinate_changes(history: np.ndarray, rounds: Sequence[int]) -> pd.DataFrame:
    """For each refresh round t >= 1 in `rounds`: the cosine between s_i before (row t-1) and
    after (row t), and the relative change ||s_after - s_before|| / ||s_before||. A refresh at
    round 0 has no recorded 'before' (the warm-up's s_i)."""
    rows = []
    for t in rounds:
        if t < 1 or t >= history.shape[0]:
            continue
        before, after = history[t - 1], history[t]
        norm = np.linalg.norm(before)
        rows.append({"round": int(t), "cosine": cosine(before, after),
                     "relative_change": float(np.linalg.norm(after - before) / norm) if norm > 0 else float("nan")})
    return pd.DataFrame(rows, columns=["round", "cosine", "relative_change"])


def coordinate_stability(payload: Mapping[str, Any], refresh_every: int) -> pd.DataFrame:
    """One row per (tracked client, refresh with a recorded 'before') of a FedSteer run: client,
    round, cosine, relative_change (`coordinate_changes`) and in_core: whether the client is
    itself in the core set X (then, with lambda = 0, s_i is ||g_i|| times a unit vector and its
    cosine is 1 whatever happens)."""
    hist = coords_histories(payload)
    participation = payload["extras"]["participation"]
    core = set(payload["extras"].get("core", []))
    frames = []
    for client, h in hist.items():
        df = coordinate_changes(h, refresh_rounds(participation[: h.shape[0]], client, refresh_every))
        df.insert(0, "client", client)
        df["in_core"] = client in core
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["client", "round", "cosine", "relative_change", "in_core"])
    return pd.concat(frames, ignore_index=True)
