"""The per-client probe rows of diagnostics runs (engine's probes, client >= 0): how well the
stale update h_i and the steered estimate Q_t s_i align with the true update g_i, as a function
of staleness and client group.

Used by chapter 2 (alignment by staleness, by group, and the overall verdict). The per-round
summaries of the same probes (client = -1) are `variance.variance_probe_table`'s.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from .clients import client_groups

__all__ = ["client_probe_table", "load_client_probes", "staleness_bins", "alignment_by_staleness",
           "alignment_verdict"]


def client_probe_table(payload: dict[str, Any], groups: pd.DataFrame | None = None) -> pd.DataFrame:
    """The per-client probe rows of a stored run (`results.load_run`): round, client,
    staleness (-1: not seen since the warm-up), cos_stale = cos(h_i, g_i), cos_estimate =
    cos(method's estimate, g_i), true_norm; plus gamma, seed, and the client's group columns
    when `groups` (from `client_groups`) is given."""
    probes = payload.get("extras", {}).get("probes")
    if not probes:
        raise ValueError("this run has no probe rows; run it with Diagnostics(probe_every > 0)")
    table = pd.DataFrame([r for r in probes if r["client"] >= 0])
    cfg = payload["config"]
    table["gamma"] = cfg["system"]["gamma"]
    table["seed"] = cfg["seed"]
    if groups is not None:
        table = table.merge(groups, on="client", how="left")
    return table


def load_client_probes(configs: Iterable[Any], root: Any, labels: torch.Tensor, num_classes: int) -> pd.DataFrame:
    """`client_probe_table` of every stored run in `configs` (RunConfigs, results cache `root`),
    with each run's client groups (`client_groups`), concatenated."""
    from ..experiments.results import load_run

    frames = []
    for c in configs:
        groups = client_groups(c.system, labels, num_classes, c.seed)
        frames.append(client_probe_table(load_run(c, root), groups))
    return pd.concat(frames, ignore_index=True)


def staleness_bins(staleness_values: Iterable[int] | np.ndarray, edges: Sequence[int] = (1, 2, 3, 5, 9, 17, 33, 65)) -> pd.Categorical:
    """Bin labels for staleness values: '1', '2', '3-4', '5-8', ..., '>=65' (edges are the
    lower ends); values below edges[0] become NaN."""
    labels = []
    for lo, hi in zip(edges, list(edges[1:]) + [None]):
        labels.append(f">={lo}" if hi is None else (str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}"))
    values = np.asarray(list(staleness_values), dtype=float)
    idx = np.searchsorted(np.asarray(edges, dtype=float), values, side="right") - 1
    out = [labels[i] if (i >= 0 and not np.isnan(v)) else None for i, v in zip(idx, values)]
    return pd.Categorical(out, categories=labels, ordered=True)


def alignment_by_staleness(table: pd.DataFrame, by: Sequence[str] = (),
                           edges: Sequence[int] = (1, 2, 3, 5, 9, 17, 33, 65)) -> pd.DataFrame:
    """Mean +- standard error of cos_stale, cos_estimate and their paired difference
    (cos_estimate - cos_stale) per staleness bin (and per the columns `by`), over the probe rows
    where both are defined (the client has participated since the warm-up).

    Columns: *by, bin, measure ('stale h_i', 'steered Q_t s_i', 'difference'), mean, se, n.
    """
    t = table[(table["staleness"] >= 1) & table["cos_stale"].notna() & table["cos_estimate"].notna()].copy()
    t["bin"] = staleness_bins(t["staleness"], edges)
    t["difference"] = t["cos_estimate"] - t["cos_stale"]
    rows = []
    keys = list(by) + ["bin"]
    for key, g in t.groupby(keys, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        for col, name in (("cos_stale", "stale h_i"), ("cos_estimate", "steered Q_t s_i"), ("difference", "difference")):
            v = g[col].to_numpy(dtype=float)
            se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
            rows.append({**dict(zip(keys, key)), "measure": name, "mean": float(v.mean()), "se": se, "n": len(v)})
    out = pd.DataFrame(rows)
    if not out.empty:
        out["bin"] = pd.Categorical(out["bin"], categories=t["bin"].cat.categories, ordered=True)
        out = out.sort_values(keys + ["measure"]).reset_index(drop=True)
    return out


def alignment_verdict(table: pd.DataFrame, z: float = 2.0) -> dict[str, Any]:
    """The paired comparison of cos(Q_t s_i, g_i) and cos(h_i, g_i) over the probe rows where
    both are defined: mean difference, its standard error (rows treated as independent), n,
    and a verdict ('steered better', 'stale better' or 'no significant difference' at
    |mean| > z * se)."""
    paired = table[(table["staleness"] >= 1) & table["cos_stale"].notna() & table["cos_estimate"].notna()]
    diff = (paired["cos_estimate"] - paired["cos_stale"]).to_numpy(dtype=float)
    n = len(diff)
    if n < 2:
        return {"mean": float("nan"), "se": float("nan"), "n": n, "verdict": "too few paired rows"}
    mean, se = float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(n))
    verdict = "steered better" if mean > z * se else ("stale better" if mean < -z * se else "no significant difference")
    return {"mean": mean, "se": se, "n": n, "verdict": verdict}
