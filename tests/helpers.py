"""Small fixtures shared by several test modules."""
from __future__ import annotations

import itertools
from typing import Iterator

import torch


def clustered(n: int, d: int, clusters: int, seed: int, noise: float = 0.4) -> tuple[torch.Tensor, torch.Tensor]:
    """n float64 gradients around a few random directions (like clients with similar data) and
    positive weights summing to 1."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(clusters, d, generator=gen, dtype=torch.float64)
    assign = torch.randint(0, clusters, (n,), generator=gen)
    grads = centers[assign] + noise * torch.randn(n, d, generator=gen, dtype=torch.float64)
    weights = torch.rand(n, generator=gen, dtype=torch.float64) + 0.2
    return grads, weights / weights.sum()


def participation_sets(probs: torch.Tensor) -> Iterator[tuple[torch.Tensor, float]]:
    """Every participation set (active ids) with its probability under independent Bernoulli(p_i)."""
    n = len(probs)
    for mask in itertools.product([False, True], repeat=n):
        prob = 1.0
        for m, p in zip(mask, probs.tolist()):
            prob *= p if m else 1 - p
        yield torch.tensor([i for i in range(n) if mask[i]], dtype=torch.long), prob
