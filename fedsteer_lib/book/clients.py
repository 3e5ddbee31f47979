"""The simulated FL system (paper §2.1, §4.1) seen client by client: the four client groups
(weak/powerful x common/rare labels), their label histograms, sizes, participation probabilities
and weights, and the staleness (rounds since the last participation) each client suffers.

Used by chapter 1 (label histograms, the group table, staleness, how an aggregation rule weights
each group) and by the probe tables of chapter 2 (`client_groups`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable

import numpy as np
import pandas as pd
import torch

from ..experiments.config import FLSystem
from ..simulator.partition import Federation, build_federation, participation_schedule, staleness

__all__ = ["GROUPS", "group_labels", "group_table", "label_histograms", "staleness_table", "expected_staleness",
           "staleness_summary", "group_weights", "client_groups"]

GROUPS = ("weak/common", "weak/rare", "powerful/common", "powerful/rare")


def group_labels(federation: Federation) -> np.ndarray:
    """Each client's group name, one of GROUPS: system group (weak p=0.04 / powerful p=0.16)
    '/' data group (common-label / rare-label)."""
    weak = federation.is_weak.numpy()
    common = federation.is_common.numpy()
    return np.array([f"{'weak' if w else 'powerful'}/{'common' if c else 'rare'}" for w, c in zip(weak, common)])


def group_table(federation: Federation) -> pd.DataFrame:
    """One row per group (weak/powerful x common/rare): number of clients, data points per
    client |D_i|, participation probability p_i, weight d_i of one client and of the group
    (sum of d_i), and the expected staleness 1/p_i of a client."""
    groups = group_labels(federation)
    sizes = federation.sizes.numpy()
    probs = federation.probs.numpy()
    weights = federation.weights.numpy()
    rows = []
    for g in GROUPS:
        m = groups == g
        if not m.any():
            continue
        rows.append({"group": g, "clients": int(m.sum()), "points_per_client": int(sizes[m][0]),
                     "p_i": float(probs[m][0]), "d_i": float(weights[m][0]), "group_weight": float(weights[m].sum()),
                     "expected_staleness": float(1.0 / probs[m][0])})
    return pd.DataFrame(rows)


def label_histograms(labels: torch.Tensor, num_classes: int, gammas: Iterable[float], seed: int = 0,
                     system: FLSystem | None = None) -> pd.DataFrame:
    """Label counts of the common-label and rare-label groups for each gamma (paper §4.1).

    Returns a tidy table: gamma, group ('common'/'rare'), label, count (points of that label
    in the group), clients (clients in the group), points_per_client.
    """
    base = system or FLSystem()
    rows = []
    for gamma in gammas:
        sys_g = replace(base, gamma=float(gamma))
        fed = build_federation(sys_g, labels, num_classes, seed)
        for group, mask in (("common", fed.is_common), ("rare", ~fed.is_common)):
            ids = torch.nonzero(mask).flatten().tolist()
            pts = torch.cat([fed.client_indices[i] for i in ids])
            counts = torch.bincount(labels[pts], minlength=num_classes)
            for label in range(num_classes):
                rows.append({"gamma": float(gamma), "group": group, "label": label, "count": int(counts[label]),
                             "clients": len(ids), "points_per_client": len(fed.client_indices[ids[0]])})
    return pd.DataFrame(rows)


def staleness_table(federation: Federation, rounds: int, seeds: Iterable[int]) -> pd.DataFrame:
    """Staleness of every client at the start of every round (`partition.staleness`: rounds
    since its last participation, t + 1 if it never participated), for the participation
    schedules of `seeds` (Bernoulli(p_i) draws, paper §2.1).

    Columns: seed, round, client, group, p, staleness, never (no participation yet).
    """
    groups = group_labels(federation)
    probs = federation.probs.numpy()
    frames = []
    for seed in seeds:
        sched = participation_schedule(federation.probs, rounds, seed)
        st = staleness(sched).numpy()
        t_idx, c_idx = np.meshgrid(np.arange(rounds), np.arange(federation.num_clients), indexing="ij")
        frames.append(pd.DataFrame({"seed": seed, "round": t_idx.ravel(), "client": c_idx.ravel(),
                                    "group": groups[c_idx.ravel()], "p": probs[c_idx.ravel()],
                                    "staleness": st.ravel(), "never": st.ravel() == t_idx.ravel() + 1}))
    return pd.concat(frames, ignore_index=True)


def expected_staleness(p: float | np.ndarray, t: int | np.ndarray) -> float | np.ndarray:
    """E[staleness at the start of round t] for Bernoulli(p) participation, with the
    convention of `partition.staleness` (t + 1 if never seen in rounds 0..t-1):

        E[S_t] = sum_{s=1}^{t+1} P(S_t >= s) = sum_{s=1}^{t+1} (1-p)^{s-1} = (1 - (1-p)^{t+1}) / p,

    which tends to 1/p (the mean of a geometric distribution) as t grows.
    """
    p = np.asarray(p, dtype=float)
    t = np.asarray(t, dtype=float)
    out = (1.0 - (1.0 - p) ** (t + 1.0)) / p
    return float(out) if out.ndim == 0 else out


def staleness_summary(table: pd.DataFrame, round_: int) -> pd.DataFrame:
    """Per group, the staleness at the start of round `round_` over the clients and schedules
    of `staleness_table`: p, mean, its standard error, the share that never participated,
    E[S_t] (`expected_staleness`) and the stationary value 1/p."""
    at = table[table["round"] == round_]
    out = at.groupby("group").agg(p=("p", "first"), mean_staleness=("staleness", "mean"),
                                  se=("staleness", lambda v: v.std(ddof=1) / np.sqrt(len(v))),
                                  never_participated=("never", "mean")).reset_index()
    out["expected_E[S_t]"] = expected_staleness(out["p"].to_numpy(), round_)
    out["1/p"] = 1.0 / out["p"]
    return out


def group_weights(federation: Federation, per_client: dict[str, np.ndarray | torch.Tensor]) -> pd.DataFrame:
    """Sum over each client group of per-client values (e.g. d_i, or the mean coefficient
    E[c_i(A)] an aggregation rule gives client i). Columns: group, rule (the dict key), weight."""
    groups = group_labels(federation)
    rows = []
    for rule, values in per_client.items():
        v = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values, dtype=float)
        for g in GROUPS:
            rows.append({"group": g, "rule": rule, "weight": float(v[groups == g].sum())})
    return pd.DataFrame(rows)


def client_groups(system: FLSystem, labels: torch.Tensor, num_classes: int, seed: int) -> pd.DataFrame:
    """The partition of a run (same system and seed): client, group, weak, common, p, d."""
    fed = build_federation(system, labels, num_classes, seed)
    return pd.DataFrame({"client": np.arange(fed.num_clients), "group": group_labels(fed),
                         "weak": fed.is_weak.numpy(), "common": fed.is_common.numpy(),
                         "p": fed.probs.numpy(), "d": fed.weights.numpy()})
