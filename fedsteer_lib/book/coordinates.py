"""The stability of FedSteer's cached coordinates s_i (paper §8.5, Fig. 8): the recorded s_i of
tracked clients, the rounds at which the refresh rule recomputes them, and how much they change
at each refresh (cosine, relative change), summarised and judged per setting.

Used by chapter 8 (the runs are `sweep.stability_grid`'s).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = ["coords_histories", "refresh_rounds", "coordinate_changes", "coordinate_stability",
           "unexplained_changes", "stability_summary", "stability_verdict", "stability_display",
           "refresh_change_display"]


def coords_histories(payload: Mapping[str, Any]) -> dict[int, np.ndarray]:
    """{client: (rounds, k) array} of a FedSteer run's `extras["coords_history"]`: row t is
    s_i after round t (recorded with `Diagnostics(track_coords=...)`)."""
    hist = payload.get("extras", {}).get("coords_history")
    if not hist:
        raise ValueError("this run recorded no coordinates; use Diagnostics(track_coords=(...)) with FedSteer")
    return {int(c): np.asarray(v, dtype=np.float64) for c, v in hist.items()}


def refresh_rounds(participation: Sequence[Sequence[int]], client: int, refresh_every: int) -> list[int]:
    """The rounds at which FedSteer recomputes s_i of `client` (Eq. 3): the client is active
    and at least `refresh_every` rounds have passed since its last refresh (the rule of
    `fedsteer.FedSteer`; refresh_every=5 is the paper's enforce=5)."""
    if refresh_every < 1:
        raise ValueError(f"refresh_every must be >= 1, got {refresh_every}")
    out, last = [], None
    for t, active in enumerate(participation):
        if client in active and (last is None or t - last >= refresh_every):
            out.append(t)
            last = t
    return out


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else float("nan")


def coordinate_changes(history: np.ndarray, rounds: Sequence[int]) -> pd.DataFrame:
    """For each refresh round t >= 1 in `rounds`: the cosine similarity between s_i before
    (row t-1) and after (row t) the refresh, and the relative change ||s_after - s_before|| /
    ||s_before||. (A refresh at round 0 has no recorded 'before': the warm-up's s_i.)"""
    rows = []
    for t in rounds:
        if t < 1 or t >= history.shape[0]:
            continue
        before, after = history[t - 1], history[t]
        norm = np.linalg.norm(before)
        rows.append({"round": int(t), "cosine": _cos(before, after),
                     "relative_change": float(np.linalg.norm(after - before) / norm) if norm > 0 else float("nan")})
    return pd.DataFrame(rows, columns=["round", "cosine", "relative_change"])


def coordinate_stability(payload: Mapping[str, Any], refresh_every: int) -> pd.DataFrame:
    """One row per (tracked client, refresh with a recorded 'before') of a FedSteer run:
    round, cosine and relative_change (see `coordinate_changes`), and in_core: whether the
    client is itself a member of the core set X (then, with lambda = 0, s_i is ||g_i|| times a
    unit vector and its cosine is 1 whatever happens)."""
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


def unexplained_changes(payload: Mapping[str, Any], refresh_every: int) -> int:
    """How many recorded rounds t >= 1 show a change of a tracked client's s_i that the refresh
    rule does not explain (0 when the record and `refresh_rounds` agree: s_i is constant
    between refreshes, so the refresh events are all there is to measure)."""
    hist = coords_histories(payload)
    participation = payload["extras"]["participation"]
    count = 0
    for client, h in hist.items():
        rounds = set(refresh_rounds(participation[: h.shape[0]], client, refresh_every))
        count += sum(1 for t in range(1, h.shape[0]) if not np.array_equal(h[t], h[t - 1]) and t not in rounds)
    return count


def stability_summary(runs: Mapping[str, Mapping[str, Any]], refresh_every: int) -> pd.DataFrame:
    """One row per setting ({name: run payload}): the number of observed refreshes of the
    tracked clients, the median cosine between s_i before and after a refresh, the median
    relative change ||Delta s|| / ||s||, the cosine between each client's first and last
    recorded s_i (drift over the whole run), and as a reference the median cosine between
    *different* tracked clients' s_i at the same round (how similar unrelated coordinate
    vectors are in this setting), and which tracked clients are core members."""
    rows = []
    for name, payload in runs.items():
        events = coordinate_stability(payload, refresh_every)
        hist = coords_histories(payload)
        drift = [_cos(h[0], h[-1]) for h in hist.values() if h.shape[0] >= 2]
        clients = sorted(hist)
        cross = [_cos(hist[a][t], hist[b][t]) for i, a in enumerate(clients) for b in clients[i + 1:]
                 for t in range(min(hist[a].shape[0], hist[b].shape[0]))]
        core = set(payload["extras"].get("core", []))
        rows.append({"setting": name, "refreshes": int(len(events)),
                     "tracked_in_core": ", ".join(str(c) for c in clients if c in core) or "-",
                     "median_cosine": float(events["cosine"].median()) if len(events) else float("nan"),
                     "median_relative_change": float(events["relative_change"].median()) if len(events) else float("nan"),
                     "first_last_cosine": float(np.nanmedian(drift)) if drift else float("nan"),
                     "cross_client_cosine": float(np.nanmedian(cross)) if cross else float("nan"),
                     "unexplained_changes": unexplained_changes(payload, refresh_every)})
    return pd.DataFrame(rows)


def stability_verdict(summary: pd.DataFrame, min_cosine: float = 0.9, max_change: float = 0.5) -> pd.DataFrame:
    """Judge each setting of `stability_summary` (indexed by setting): 'stable' is True when the
    median refresh cosine is >= `min_cosine` and the median relative change <= `max_change`,
    None when no refresh was observed. Adds a one-line `message` per setting."""
    out = summary.copy()
    judged = out["refreshes"] > 0
    ok = (out["median_cosine"] >= min_cosine) & (out["median_relative_change"] <= max_change)
    out["stable"] = pd.Series([bool(v) if j else None for v, j in zip(ok, judged)], index=out.index, dtype=object)
    messages = []
    for name, row in out.iterrows():
        if row["stable"] is None:
            messages.append(f"{name}: no refresh with a recorded 'before' - nothing to judge.")
        else:
            messages.append(f"{name}: {int(row['refreshes'])} refreshes, median cosine {row['median_cosine']:.3f}, "
                            f"median relative change {row['median_relative_change']:.3f} (cross-client cosine "
                            f"{row['cross_client_cosine']:.3f}) -> {'stable' if row['stable'] else 'NOT stable'} "
                            f"(criterion: cosine >= {min_cosine}, change <= {max_change}).")
    out["message"] = messages
    return out


_SHOWN = {"refreshes": "refreshes", "tracked_in_core": "tracked in core", "median_cosine": "median cosine",
          "median_relative_change": "median relative change", "first_last_cosine": "first→last cosine",
          "cross_client_cosine": "cross-client cosine"}


def stability_display(summary: pd.DataFrame) -> pd.DataFrame:
    """`stability_summary` (indexed by setting) for reading: the setting as a column, the columns
    named as the book's text names them, "—" where no tracked client is in the core set."""
    out = summary.reset_index()[["setting", *_SHOWN]].rename(columns=_SHOWN)
    out["tracked in core"] = out["tracked in core"].replace("-", "—")
    return out


def refresh_change_display(events: pd.DataFrame) -> pd.DataFrame:
    """Per setting and tracked client (rows of `coordinate_stability` with a `setting` column):
    the number of refreshes, whether the client is in the core set ("yes"/"no"), and the median
    cosine and relative change at its refreshes."""
    out = events.groupby(["setting", "client", "in_core"], sort=False).agg(
        refreshes=("round", "size"), median_cosine=("cosine", "median"),
        median_relative_change=("relative_change", "median")).reset_index()
    out["in_core"] = out["in_core"].map({True: "yes", False: "no"})
    return out.rename(columns={"in_core": "in core", "median_cosine": "median cosine",
                               "median_relative_change": "median relative change"})
