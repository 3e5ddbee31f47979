"""How well a subspace represents client updates (Eq. 1-3): relative reconstruction errors and
cosines of the in-sample, steered, fresh and stale estimates of real updates, and a toy 3-D
picture of steering (ridge coordinates of one gradient, and a core that turns).

Used by chapter 2 (the toy picture, the reconstruction study of real updates) and chapter 3.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from ..coreset import greedy_swap
from ..projection import normalized_basis, reconstruct, ridge_coordinates

__all__ = ["relative_error", "cosine", "reconstruction_study", "rotation", "toy_ridge_table", "toy_rotation_study"]


def relative_error(grads: torch.Tensor, estimates: torch.Tensor) -> torch.Tensor:
    """||g_i - g_hat_i||^2 / ||g_i||^2 per row (float64): 0 is perfect, 1 is what the zero
    estimate (unbiased FedAvg) gets. It is client i's factor in Theorem 1's variance."""
    num = torch.linalg.vector_norm((grads - estimates).double(), dim=1) ** 2
    den = torch.linalg.vector_norm(grads.double(), dim=1) ** 2
    return num / den.clamp_min(1e-300)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity in float64 (0 where a row is zero)."""
    a, b = a.double(), b.double()
    den = torch.linalg.vector_norm(a, dim=1) * torch.linalg.vector_norm(b, dim=1)
    return (a * b).sum(1) / den.clamp_min(1e-300)


def reconstruction_study(stale: torch.Tensor, true: torch.Tensor, weights: torch.Tensor,
                         core_sizes: Iterable[int], lams: Iterable[float], max_swaps: int = 5,
                         seed: int = 0, groups: Sequence[str] | None = None) -> pd.DataFrame:
    """How well the subspace represents real client updates, for each core size k and lambda.

    For each (k, lambda): the core set X is chosen by Algorithm 3 on the `stale` snapshot
    (greedy swaps minimising J(X)), Q_0 = Eq. 1 on the core's stale updates, s_i = Eq. 3 of the
    stale h_i against Q_0. Then, per client i, the relative error ||g - g_hat||^2 / ||g||^2 and
    the cosine cos(g_hat, g) of:

    - 'in-sample': g = h_i, g_hat = Q_0 s_i (the fit when the coordinates are computed);
    - 'steered': g = the true update g_i at w_t, g_hat = Q_t s_i, with Q_t from the core's *true*
      updates (every core member refreshed) and the old coordinates s_i (FedSteer's reuse);
    - 'fresh': g = g_i, g_hat = Q_t s_i* with s_i* = Eq. 3 of g_i against Q_t (the best the
      subspace can do at w_t, the Theorem-1 optimum for lambda = 0);
    - 'stale': g = g_i, g_hat = h_i (FedVARP/MIFA's reuse; independent of k and lambda).

    Returns a tidy table: k, lam, client, group, kind, rel_error, cos, norm_ratio
    (||g_hat|| / ||g||) and J (the objective of the chosen core after the swaps).
    """
    n = stale.shape[0]
    groups = np.asarray(groups) if groups is not None else np.array([""] * n)
    rows = []

    def add(k, lam, kind, g, est, j_value):
        re, co = relative_error(g, est).numpy(), cosine(est, g).numpy()
        ratio = (torch.linalg.vector_norm(est.double(), dim=1) / torch.linalg.vector_norm(g.double(), dim=1).clamp_min(1e-300)).numpy()
        for i in range(n):
            rows.append({"k": k, "lam": lam, "client": i, "group": groups[i], "kind": kind,
                         "rel_error": float(re[i]), "cos": float(co[i]), "norm_ratio": float(ratio[i]), "J": j_value})

    for k, lam in itertools.product(core_sizes, lams):
        trace: list[float] = []
        core = greedy_swap(stale, int(k), weights, float(lam), max_swaps=max_swaps, seed=seed, trace=trace)
        q0 = normalized_basis(stale[core])
        s = ridge_coordinates(q0, stale, float(lam))
        qt = normalized_basis(true[core])
        fresh = ridge_coordinates(qt, true, float(lam))
        add(k, lam, "in-sample", stale, reconstruct(q0, s), trace[-1])
        add(k, lam, "steered", true, reconstruct(qt, s), trace[-1])
        add(k, lam, "fresh", true, reconstruct(qt, fresh), trace[-1])
        add(k, lam, "stale", true, stale, trace[-1])
    return pd.DataFrame(rows)


def rotation(axis: Sequence[float], angle: float) -> torch.Tensor:
    """The 3x3 rotation by `angle` (radians) about `axis` (Rodrigues' formula), float64."""
    a = torch.tensor(axis, dtype=torch.float64)
    a = a / a.norm()
    k = torch.tensor([[0.0, -a[2], a[1]], [a[2], 0.0, -a[0]], [-a[1], a[0], 0.0]], dtype=torch.float64)
    return torch.eye(3, dtype=torch.float64) + np.sin(angle) * k + (1 - np.cos(angle)) * (k @ k)


def toy_ridge_table(core: torch.Tensor, grad: torch.Tensor, lams: Iterable[float]) -> pd.DataFrame:
    """Eq. 1-3 on one client gradient `grad` (d,) and core vectors `core` (k, d): per lambda the
    coordinates s, the reconstruction Q s, ||g - Q s||^2, ||s||^2 and cos(Q s, g)."""
    q = normalized_basis(core.double())
    rows = []
    for lam in lams:
        s = ridge_coordinates(q, grad.double()[None, :], float(lam))[0]
        rec = reconstruct(q, s[None, :])[0]
        rows.append({"lam": float(lam), **{f"s{j + 1}": float(v) for j, v in enumerate(s)},
                     "Qs": tuple(round(float(v), 6) for v in rec),
                     "residual_sq": float(((grad.double() - rec) ** 2).sum()), "s_norm_sq": float((s**2).sum()),
                     "cos": float(cosine(rec[None], grad.double()[None])[0])})
    return pd.DataFrame(rows)


def toy_rotation_study(core: torch.Tensor, grad: torch.Tensor, axis: Sequence[float], angles: Iterable[float],
                       lam: float) -> pd.DataFrame:
    """The subspace turns between round t and t+k: the core vectors become R h_j (R = rotation
    by `angle` about `axis`). The client's coordinates s_i are computed at round t (Eq. 3) and
    reused: g_hat = Q_{t+k} s_i; its stale update is h_i = g (its gradient at round t).

    Two scenarios for the client's true gradient at t+k: 'moves with the core' (g' = R g: the
    premise of FedSteer) and 'stays put' (g' = g: the core turns for reasons unrelated to this
    client). Returns: scenario, angle_deg, cos_stale = cos(h_i, g'), cos_steered = cos(Q_{t+k} s_i, g').
    """
    q0 = normalized_basis(core.double())
    g = grad.double()
    s = ridge_coordinates(q0, g[None, :], float(lam))
    rows = []
    for angle in angles:
        r = rotation(axis, float(angle))
        qk = normalized_basis(core.double() @ r.T)
        steered = reconstruct(qk, s)[0]
        for scenario, g_new in (("moves with the core", r @ g), ("stays put", g)):
            rows.append({"scenario": scenario, "angle_deg": float(np.degrees(angle)),
                         "cos_stale": float(cosine(g[None], g_new[None])[0]),
                         "cos_steered": float(cosine(steered[None], g_new[None])[0])})
    return pd.DataFrame(rows)
