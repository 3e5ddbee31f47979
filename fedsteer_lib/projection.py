"""The pure math of FedSteer's corrective projection (paper §2.2-2.3).

Convention: every vector is a row. A core set of k cached gradients is a (k, d) tensor whose
rows are the columns of the paper's Q_t; client coordinates s_i are the rows of an (N, k)
tensor. All functions work in float32 and float64; small k x k systems are solved in float64.
"""
from __future__ import annotations

import torch

__all__ = ["normalized_basis", "ridge_coordinates", "ridge_from_gram", "steered_update", "update_variance", "reconstruct"]


def normalized_basis(core_grads: torch.Tensor) -> torch.Tensor:
    """Eq. 1: Q_t = [h_j / ||h_j||_2]_{j in X}, returned as rows (k, d).

    Assumption 1 of the paper (cached gradients are non-zero) is checked: a zero row raises.
    """
    norms = torch.linalg.vector_norm(core_grads, dim=1, keepdim=True)
    if bool((norms == 0).any()):
        zero_rows = torch.nonzero(norms.squeeze(1) == 0).flatten().tolist()
        raise ValueError(f"normalized_basis: rows {zero_rows} are zero; the paper's Assumption 1 needs non-zero core gradients")
    return core_grads / norms


def ridge_coordinates(basis: torch.Tensor, grads: torch.Tensor, lam: float) -> torch.Tensor:
    """Eq. 3: s_i* = (Q^T Q + lambda I)^{-1} Q^T g_i for every row g_i of `grads`; returns (m, k).

    This minimises Eq. 2, ||g_i - Q s_i||^2 + lambda ||s_i||^2. With lambda = 0 the
    minimum-norm least-squares solution (pseudo-inverse) is returned.
    """
    if lam < 0:
        raise ValueError(f"lam (lambda) must be >= 0, got {lam}")
    if basis.shape[1] != grads.shape[1]:
        raise ValueError(f"basis has dimension {basis.shape[1]} but grads have {grads.shape[1]}")
    gram = basis @ basis.T  # Q^T Q, (k, k)
    rhs = grads @ basis.T  # rows are (Q^T g_i)^T, (m, k)
    return ridge_from_gram(gram, rhs, lam).to(grads.dtype)


def ridge_from_gram(gram: torch.Tensor, rhs: torch.Tensor, lam: float) -> torch.Tensor:
    """Eq. 3 given G = Q^T Q (k, k) and the rows Q^T g_i (m, k); solved in float64."""
    gram, rhs = gram.double(), rhs.double()
    if lam > 0:
        eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
        return torch.linalg.solve(gram + lam * eye, rhs.T).T
    return rhs @ torch.linalg.pinv(gram, hermitian=True)


def reconstruct(basis: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """g_hat_i = Q s_i for every row s_i of `coords`; returns (m, d)."""
    return coords.to(basis.dtype) @ basis


def steered_update(
    basis: torch.Tensor,
    coords: torch.Tensor,
    weights: torch.Tensor,
    probs: torch.Tensor,
    active: torch.Tensor,
    active_grads: torch.Tensor,
) -> torch.Tensor:
    """Eq. 4: Delta_t = sum_{i in N} d_i Q s_i + sum_{i in A_t} (d_i / p_i) (g_i - Q s_i).

    `active[j]` is the client whose update is `active_grads[j]`; its residual is taken
    against `coords[active[j]]`. Q s_i is never formed for inactive clients: the projection
    baseline is computed as Q (sum_i d_i s_i). Cost O(kd + |A| d).
    """
    dtype = basis.dtype
    weights, probs, coords = weights.to(dtype), probs.to(dtype), coords.to(dtype)
    if active.numel() != active_grads.shape[0]:
        raise ValueError(f"{active.numel()} active ids but {active_grads.shape[0]} active updates")
    scale = weights[active] / probs[active]  # d_i / p_i for the active clients
    baseline_coords = weights @ coords - scale @ coords[active]  # sum_i d_i s_i - sum_A (d_i/p_i) s_i
    return torch.addmv(baseline_coords @ basis, active_grads.T, scale)  # one pass, no (d,) temporary


def update_variance(grads: torch.Tensor, estimates: torch.Tensor, weights: torch.Tensor, probs: torch.Tensor) -> float:
    """Theorem 1: E||Delta - E[Delta]||^2 of Eq. 4's estimator under independent Bernoulli(p_i)
    participation, given every client's current update g_i and baseline estimate g_hat_i:

        sum_i d_i^2 (1 - p_i) / p_i ||g_i - g_hat_i||^2.

    It is minimised by minimising each client's projection error (Eq. 2 with lambda = 0).
    """
    weights, probs = weights.double(), probs.double()
    residual_sq = torch.linalg.vector_norm((grads - estimates).double(), dim=1) ** 2
    return float((weights**2 * (1 - probs) / probs * residual_sq).sum())
