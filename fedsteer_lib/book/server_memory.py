"""Server memory (paper §8.2): the bytes of each method's server state, measured on meta tensors
for any number of clients N and model size d, §8.2's accounting of them (FedSteer's O(N k + k d)
against O(N d)), and the memory measured at the end of finished runs next to FedVARP's.

Used by the ledger (the memory claims), chapter 4 (memory against N) and chapter 10 (the runs'
measured memory).
"""
from __future__ import annotations

import torch

from ..experiments.config import MethodSpec
from ..experiments.registry import make_strategy
from ..strategy import ServerContext


__all__ = ["server_state_bytes", "memory_formula"]


def server_state_bytes(spec: MethodSpec, num_clients: int, dim: int, device: str | torch.device = "meta") -> int:
    """Bytes of a method's server state tensors (`Strategy.init_state` + `memory_bytes`).

    With the default `device="meta"` the tensors have shapes and dtypes but no storage, so the
    state of N = 10,000 clients and d = 1.6 M parameters is measured without allocating it.
    """
    device = torch.device(device)
    strategy = make_strategy(spec)
    ctx = ServerContext(weights=torch.empty(num_clients, device=device), probs=torch.empty(num_clients, device=device),
                        dim=int(dim), device=device, client_lr=0.05, seed=0)
    return int(strategy.memory_bytes(strategy.init_state(ctx)))


def memory_formula(name: str, num_clients: int, dim: int, k: int | None = None) -> int:
    """The state size in bytes that §8.2's accounting predicts for our float32 implementation:
    FedVARP/FedStale/MIFA 4 N d (every client's stale update), SCAFFOLD 4 (N + 1) d (c_i and c),
    FedSteer 4 (k d + N k + k) + 8 (k^2 + N + k) (basis Q, coordinates s_i, norms; float64 Gram
    matrix, int64 refresh rounds and core ids): O(N k + k d) against O(N d)."""
    n, d = int(num_clients), int(dim)
    if name in ("fedvarp", "fedstale", "mifa"):
        return 4 * n * d
    if name == "scaffold":
        return 4 * (n + 1) * d
    if name == "fedsteer":
        if k is None:
            raise ValueError("memory_formula('fedsteer', ...) needs the core size k")
        return 4 * (k * d + n * k + k) + 8 * (k * k + n + k)
    if name in ("fedavg", "fedavg_unbiased", "fedprox", "full"):
        return 0
    raise ValueError(f"no memory formula for method {name!r}")


