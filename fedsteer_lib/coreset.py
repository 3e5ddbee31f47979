"""Selective caching (paper §2.4, Algorithm 3): choose the core set X that minimises

    J(X) = sum_i d_i ( ||g_i - Q(X) s_i||^2 + lambda ||s_i||^2 ),   s_i by Eq. 3,

by greedy single swaps. The ridge optimum has the closed form
    min_s ||g - Q s||^2 + lambda ||s||^2 = ||g||^2 - b^T (G + lambda I)^{-1} b,
with G = Q^T Q and b = Q^T g, so J only needs the Gram matrix K = [g_i . g_j] of the
snapshot: one swap evaluation costs O(k^3 + N k^2), not O(N k d).
"""
from __future__ import annotations

import numpy as np
import torch

from .numerics import sqrt
from .projection import normalized_basis, reconstruct, ridge_coordinates

__all__ = ["objective", "objective_from_gram", "greedy_swap", "exhaustive_best", "SwapTrace"]


def objective(grads: torch.Tensor, core: list[int], weights: torch.Tensor, lam: float) -> float:
    """J(X) computed directly from the gradients (reference implementation, O(N k d))."""
    basis = normalized_basis(grads[list(core)])
    coords = ridge_coordinates(basis, grads, lam)
    residual = torch.linalg.vector_norm((grads - reconstruct(basis, coords)).double(), dim=1) ** 2
    penalty = lam * torch.linalg.vector_norm(coords.double(), dim=1) ** 2
    return float((weights.double() * (residual + penalty)).sum())


def _batched_objective(gram: torch.Tensor, cores: torch.Tensor, weights: torch.Tensor, lam: float) -> torch.Tensor:
    """J for each row of `cores` (P, k) from the float64 Gram matrix of the snapshot (N, N).
    Computed on the Gram matrix's device (the core ids and weights follow it)."""
    cores, weights = cores.to(gram.device), weights.to(gram.device)
    norms = sqrt(gram.diagonal().clamp_min(1e-300))  # correctly rounded on any CPU
    cos = gram / (norms[:, None] * norms[None, :])
    g = cos[cores[:, :, None], cores[:, None, :]]  # (P, k, k) = Q^T Q
    b = gram[cores] / norms[cores][:, :, None]  # (P, k, N) = Q^T g_i
    k = cores.shape[1]
    eye = torch.eye(k, dtype=gram.dtype, device=gram.device)
    if lam > 0:
        z = torch.linalg.solve(g + lam * eye, b)
    else:
        z = torch.linalg.pinv(g, hermitian=True) @ b
    explained = ((b * z).sum(1) * weights[None, :]).sum(1)
    return (weights * gram.diagonal()).sum() - explained


def objective_from_gram(gram: torch.Tensor, core: list[int], weights: torch.Tensor, lam: float) -> float:
    """J(X) from the snapshot's Gram matrix K (N, N), in O(k^3 + N k^2)."""
    cores = torch.tensor([list(core)], dtype=torch.long)
    return float(_batched_objective(gram.double(), cores, weights.double(), lam)[0])


class SwapTrace(list):
    """The J value after initialisation and after every executed swap (a list of floats)."""


def greedy_swap(
    grads: torch.Tensor,
    k: int,
    weights: torch.Tensor,
    lam: float,
    max_swaps: int = 5,
    init: list[int] | None = None,
    candidates: list[int] | None = None,
    seed: int = 0,
    trace: SwapTrace | None = None,
) -> list[int]:
    """Algorithm 3's greedy single-swap local search for the core set.

    Starts from `init` (or k clients drawn at random with `seed`); each iteration evaluates
    every exchange of one core member with one client of `candidates` (default: all clients
    outside the core; the paper's subsampled variant passes N_sub random clients) and executes
    the swap that lowers J the most; it stops after `max_swaps` swaps or when no swap lowers J.
    Clients with a zero update are never put into the core. If `trace` is given, the J values
    are appended to it.
    """
    n = grads.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"core size k must be in [1, {n}], got {k}")
    gram = (grads.double() @ grads.double().T)
    weights = weights.double()
    usable = set(torch.nonzero(gram.diagonal() > 0).flatten().tolist())
    if init is None:
        pool = np.array(sorted(usable)) if len(usable) >= k else np.arange(n)
        init = np.random.default_rng(seed).choice(pool, size=k, replace=False).tolist()
    core = [int(c) for c in init]
    if len(core) != k or len(set(core)) != k or not all(0 <= c < n for c in core):
        raise ValueError(f"init must be {k} distinct client ids in [0, {n}), got {init}")
    pool_ids = range(n) if candidates is None else candidates
    current = objective_from_gram(gram, core, weights, lam)
    if trace is not None:
        trace.append(current)
    for _ in range(max_swaps):
        outside = [c for c in pool_ids if c not in core and c in usable]
        if not outside:
            break
        swaps = [(pos, c) for pos in range(k) for c in outside]
        cores = torch.tensor(core, dtype=torch.long).repeat(len(swaps), 1)
        cores[torch.arange(len(swaps)), torch.tensor([p for p, _ in swaps])] = torch.tensor([c for _, c in swaps])
        values = torch.cat([_batched_objective(gram, chunk, weights, lam) for chunk in cores.split(2048)])
        best = int(values.argmin())
        if not float(values[best]) < current - 1e-12 * abs(current):
            break
        pos, c = swaps[best]
        core[pos] = c
        current = float(values[best])
        if trace is not None:
            trace.append(current)
    return core


def exhaustive_best(grads: torch.Tensor, k: int, weights: torch.Tensor, lam: float) -> tuple[list[int], float]:
    """The optimal core set by trying every k-subset (small instances only: C(N, k) <= 200,000)."""
    from itertools import combinations
    from math import comb

    n = grads.shape[0]
    if comb(n, k) > 200_000:
        raise ValueError(f"C({n}, {k}) = {comb(n, k)} subsets is too many for an exhaustive search")
    gram = grads.double() @ grads.double().T
    cores = torch.tensor(list(combinations(range(n), k)), dtype=torch.long)
    values = torch.cat([_batched_objective(gram, chunk, weights.double(), lam) for chunk in cores.split(4096)])
    best = int(values.argmin())
    return cores[best].tolist(), float(values[best])
