"""Real client updates as chapters 1-3 measure them: the four client groups, snapshots of every
client's update at one model, exact low-dimensional coordinates of the updates, and an aggregation
rule's moments over participation draws (the randomness of Theorem 1).

- Client groups: system group (weak p_i = 0.04 / powerful p_i = 0.16) x data group (common /
  rare labels), paper §4.1.
- Snapshots: every client's update g_i = w - w_i^E at one model w, as the warm-up of §2.4 takes it.
- Exact low-dimensional coordinates: every server rule (Eq. 1-4, FedVARP, FedAvg) combines the
  given vectors with coefficients that depend only on their inner products, so it gives the same
  results on any isometric copy of them. `span_embedding` maps a few hundred d-dimensional updates
  (d ~ 600,000) to coordinates in their span with the same Gram matrix; a participation draw then
  costs microseconds, and `monte_carlo` can afford tens of thousands.

Every vector is a row, as in `projection`. What one chapter alone computes lives in its notebook.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..simulator.engine import SimData, client_updates
from ..simulator.partition import Federation, rng
from ..experiments.config import Training
from ..strategy import ServerContext, State, Strategy

__all__ = ["GROUPS", "group_labels", "group_sums", "SNAPSHOT_STREAM", "TRAJECTORY_STREAM", "MC_STREAM",
           "torch_generator", "snapshot", "span_embedding", "server_context", "participation_draws", "MonteCarlo",
           "monte_carlo", "variance_contributions"]

GROUPS = ("weak/common", "weak/rare", "powerful/common", "powerful/rare")

# Named random streams of the book's measurements (the engine's use 1-8; see partition.rng).
SNAPSHOT_STREAM, TRAJECTORY_STREAM, MC_STREAM = 20, 21, 22


def group_labels(federation: Federation) -> np.ndarray:
    """Each client's group, one of GROUPS: system group '/' data group (paper §4.1)."""
    weak, common = federation.is_weak.numpy(), federation.is_common.numpy()
    return np.array([f"{'weak' if w else 'powerful'}/{'common' if c else 'rare'}" for w, c in zip(weak, common)])


def group_sums(federation: Federation, values: np.ndarray | torch.Tensor) -> dict[str, float]:
    """Per client group (GROUPS, in order), the sum of a per-client quantity (d_i, a rule's
    expected coefficient, a client's term of Theorem 1, ...)."""
    v = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values, dtype=float)
    labels = group_labels(federation)
    return {g: float(v[labels == g].sum()) for g in GROUPS}


def torch_generator(seed: int, stream: int) -> torch.Generator:
    """A seeded torch generator for (seed, stream), independent of the engine's streams."""
    return torch.Generator().manual_seed(int(rng(seed, stream).integers(2**62)))


def snapshot(sim: SimData, training: Training, weights: torch.Tensor, seed: int) -> torch.Tensor:
    """Every client's update g_i = w - w_i^E after E local epochs from the same model w (paper
    §2.1), as the warm-up of §2.4 collects it. Returns (N, d)."""
    ids = list(range(sim.federation.num_clients))
    updates, _, _ = client_updates(sim, training, weights, ids, torch_generator(seed, SNAPSHOT_STREAM))
    return updates


def span_embedding(*blocks: torch.Tensor, chunk: int = 32768, rtol: float = 1e-12,
                   dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Isometric coordinates of the rows of `blocks` in their joint span.

    With V the stacked rows (M, d), the Gram matrix K = V V^T is formed in float64 (in column
    chunks of d) and factored as K = E diag(lam) E^T; the rows of C = E diag(sqrt(lam)) (M, r),
    keeping eigenvalues above rtol * max, satisfy C C^T = K. So every inner product, norm,
    projection (Eq. 1-3) and linear combination (Eq. 4) among the rows is the same in the r
    coordinates as in R^d. Returns the coordinates of each block, in the order given.
    """
    if not blocks:
        raise ValueError("span_embedding needs at least one block of vectors")
    dims = {b.shape[1] for b in blocks}
    if len(dims) != 1:
        raise ValueError(f"all blocks must have the same dimension, got {sorted(dims)}")
    d = dims.pop()
    sizes = [b.shape[0] for b in blocks]
    gram = torch.zeros(sum(sizes), sum(sizes), dtype=torch.float64)
    for start in range(0, d, chunk):
        x = torch.cat([b[:, start:start + chunk].detach().cpu().double() for b in blocks])
        gram += x @ x.T
    evals, evecs = torch.linalg.eigh(gram)
    keep = evals > rtol * max(float(evals.max()), 1e-300)
    coords = (evecs[:, keep] * evals[keep].sqrt()).to(dtype)
    return list(torch.split(coords, sizes))


def server_context(federation: Federation, dim: int, client_lr: float = 0.05, seed: int = 0,
                   device: torch.device | str = "cpu", probs: torch.Tensor | None = None) -> ServerContext:
    """The ServerContext the engine builds for this federation (float32 d_i and p_i)."""
    p = federation.probs if probs is None else probs
    return ServerContext(weights=federation.weights.float().to(device), probs=p.float().to(device), dim=dim,
                         device=torch.device(device), client_lr=client_lr, seed=seed)


def participation_draws(probs: torch.Tensor, draws: int, seed: int) -> np.ndarray:
    """Bool (draws, N): independent Bernoulli(p_i) participation sets (§2.1), stream MC_STREAM."""
    return rng(seed, MC_STREAM).random((draws, probs.shape[0])) < probs.double().cpu().numpy()[None, :]


@dataclass
class MonteCarlo:
    """Moments of an aggregate Delta over independent participation draws, the updates fixed
    (the randomness of Theorem 1); target = sum_i d_i g_i.

    variance: E||Delta - E Delta||^2 (sample estimate), variance_se its standard error.
    bias_norm: ||mean(Delta) - target||; noise_norm = sqrt(variance / draws), the size it has
    from Monte-Carlo noise alone when the rule is unbiased. mse: E||Delta - target||^2.
    errors: ||Delta - target|| per draw.
    """

    draws: int
    variance: float
    variance_se: float
    bias_norm: float
    noise_norm: float
    target_norm: float
    mse: float
    errors: np.ndarray

    @property
    def relative_bias(self) -> float:
        """bias_norm / ||sum_i d_i g_i||."""
        return self.bias_norm / self.target_norm


def monte_carlo(strategy: Strategy, state: State, ctx: ServerContext, updates: torch.Tensor, draws: int,
                seed: int = 0) -> MonteCarlo:
    """`strategy.aggregate` (pure) on `draws` participation sets (`participation_draws` of
    ctx.probs), the true updates `updates` (N, r) fixed. Exact and cheap on `span_embedding`
    coordinates."""
    if draws < 2:
        raise ValueError(f"draws must be >= 2, got {draws}")
    masks = participation_draws(ctx.probs, draws, seed)
    target = (ctx.weights.double() @ updates.double()).cpu()
    out = torch.empty(draws, updates.shape[1], dtype=torch.float64)
    for j in range(draws):
        active = torch.from_numpy(np.nonzero(masks[j])[0]).to(updates.device)
        out[j] = strategy.aggregate(state, ctx, active, updates[active]).double().cpu()
    mean = out.mean(0)
    centred = ((out - mean) ** 2).sum(1)
    variance = float(centred.sum()) / (draws - 1)
    errors = torch.linalg.vector_norm(out - target, dim=1)
    return MonteCarlo(draws=draws, variance=variance, variance_se=float(centred.std()) / np.sqrt(draws),
                      bias_norm=float((mean - target).norm()), noise_norm=float(np.sqrt(variance / draws)),
                      target_norm=float(target.norm()), mse=float((errors**2).mean()), errors=errors.numpy())


def variance_contributions(grads: torch.Tensor, estimates: torch.Tensor, weights: torch.Tensor,
                           probs: torch.Tensor) -> torch.Tensor:
    """Theorem 1's closed form client by client, d_i^2 (1 - p_i) / p_i ||g_i - g_hat_i||^2 (N,),
    in float64; their sum is `projection.update_variance`."""
    residual_sq = torch.linalg.vector_norm((grads - estimates).double(), dim=1) ** 2
    w, p = weights.double().cpu(), probs.double().cpu()
    return w**2 * (1 - p) / p * residual_sq.cpu()
