"""The FL system of paper §2.1/§4.1: who holds which data, and who shows up when.

Randomness is split into independent streams derived from the run's seed, so that methods
run with the same seed see the same partition and the same participation sequence (common
random numbers: paired comparisons between methods are less noisy).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .settings import ConfigError, FLSystem

__all__ = ["Federation", "build_federation", "participation_schedule", "rng", "staleness"]

# Named random streams: rng(seed, STREAM) gives an independent generator per purpose.
PARTITION, GROUPS, PARTICIPATION, CORESET, VALIDATION = 1, 2, 3, 4, 5


def rng(seed: int, stream: int) -> np.random.Generator:
    """An independent numpy generator for (seed, stream)."""
    return np.random.default_rng([seed, stream])


@dataclass
class Federation:
    """The clients: their data (indices into the training pool), weights d_i and probabilities p_i."""

    client_indices: list[torch.Tensor]
    weights: torch.Tensor  # d_i = |D_i| / sum_j |D_j|, float64 (N,)
    probs: torch.Tensor  # p_i, float64 (N,)
    is_common: torch.Tensor  # bool (N,): common-label group
    is_weak: torch.Tensor  # bool (N,): weak group (p = weak_prob)
    eval_indices: torch.Tensor | None  # training-pool indices of the validation set, or None (use the test set)
    common_labels: tuple[int, ...]
    rare_labels: tuple[int, ...]

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def sizes(self) -> torch.Tensor:
        return torch.tensor([len(ix) for ix in self.client_indices])


def build_federation(system: FLSystem, labels: torch.Tensor, num_classes: int, seed: int) -> Federation:
    """Partition a training pool among N clients as in paper §4.1.

    The first floor(L/2) labels are the common half, the rest the rare half. Each common
    client gets floor(points_scale / gamma) points, each rare client
    floor(points_scale / (1 - gamma)), drawn without replacement (clients are disjoint).
    If `system.validation_size > 0`, that many points are first held out of the pool.
    """
    system.validate()
    n_clients = system.num_clients
    pool = np.arange(labels.shape[0])
    eval_indices = None
    if system.validation_size:
        if system.validation_size >= len(pool):
            raise ConfigError(f"validation_size must be < {len(pool)} (the training pool), got {system.validation_size}")
        perm = rng(seed, VALIDATION).permutation(pool)
        eval_indices, pool = np.sort(perm[: system.validation_size]), np.sort(perm[system.validation_size :])

    half = num_classes // 2
    common_labels, rare_labels = tuple(range(half)), tuple(range(half, num_classes))
    n_common = round(system.gamma * n_clients)
    per_common = int(system.points_scale // system.gamma)
    per_rare = int(system.points_scale // (1.0 - system.gamma))
    labels_np = labels.numpy()[pool]
    gen = rng(seed, PARTITION)
    client_indices: list[torch.Tensor] = []
    for group_labels, n_group, per_client, group in (
        (common_labels, n_common, per_common, "common"),
        (rare_labels, n_clients - n_common, per_rare, "rare"),
    ):
        candidates = gen.permutation(pool[np.isin(labels_np, group_labels)])
        needed = n_group * per_client
        if needed > len(candidates):
            raise ConfigError(
                f"gamma={system.gamma}, points_scale={system.points_scale}: the {group}-label group needs "
                f"{needed} points but the pool has only {len(candidates)}"
            )
        for c in range(n_group):
            client_indices.append(torch.from_numpy(np.sort(candidates[c * per_client : (c + 1) * per_client])))

    sizes = torch.tensor([len(ix) for ix in client_indices], dtype=torch.float64)
    is_common = torch.zeros(n_clients, dtype=torch.bool)
    is_common[:n_common] = True
    n_weak = round(system.weak_fraction * n_clients)
    weak_ids = rng(seed, GROUPS).permutation(n_clients)[:n_weak]
    is_weak = torch.zeros(n_clients, dtype=torch.bool)
    is_weak[torch.from_numpy(weak_ids)] = True
    probs = torch.where(is_weak, system.weak_prob, system.powerful_prob).to(torch.float64)
    return Federation(
        client_indices=client_indices,
        weights=sizes / sizes.sum(),
        probs=probs,
        is_common=is_common,
        is_weak=is_weak,
        eval_indices=None if eval_indices is None else torch.from_numpy(eval_indices),
        common_labels=common_labels,
        rare_labels=rare_labels,
    )


def participation_schedule(probs: torch.Tensor, rounds: int, seed: int) -> torch.Tensor:
    """Bool (rounds, N): client i is active in round t with probability p_i, independently."""
    uniforms = rng(seed, PARTICIPATION).random((rounds, probs.shape[0]))
    return torch.from_numpy(uniforms < probs.numpy()[None, :])


def staleness(schedule: torch.Tensor) -> torch.Tensor:
    """Int (rounds, N): rounds since client i last participated, as seen at the start of round t
    (t + 1 if it never has)."""
    rounds, n = schedule.shape
    out = torch.empty(rounds, n, dtype=torch.int64)
    last = torch.full((n,), -1, dtype=torch.int64)
    for t in range(rounds):
        out[t] = t - last
        last = torch.where(schedule[t], torch.tensor(t), last)
    return out
