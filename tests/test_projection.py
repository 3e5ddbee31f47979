"""The pure math of FedSteer (Eq. 1-4, Theorem 1) against hand computations and exact expectations."""

import pytest
import torch

from fedsteer_lib.projection import normalized_basis, reconstruct, ridge_coordinates, steered_update, update_variance
from helpers import participation_sets


@pytest.fixture
def problem():
    gen = torch.Generator().manual_seed(3)
    n, d, k = 7, 11, 3
    grads = torch.randn(n, d, generator=gen, dtype=torch.float64)
    core = torch.randn(k, d, generator=gen, dtype=torch.float64)
    weights = torch.rand(n, generator=gen, dtype=torch.float64) + 0.1
    weights /= weights.sum()
    probs = torch.rand(n, generator=gen, dtype=torch.float64) * 0.8 + 0.1
    return grads, core, weights, probs


def test_normalized_basis_rows_have_unit_norm_and_direction(problem):
    _, core, _, _ = problem
    basis = normalized_basis(core)
    assert torch.allclose(basis.norm(dim=1), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(basis * core.norm(dim=1, keepdim=True), core)


def test_normalized_basis_rejects_zero_rows():
    with pytest.raises(ValueError, match="Assumption 1"):
        normalized_basis(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ridge_coordinates_match_closed_form_and_minimise_eq2(problem, dtype):
    grads, core, _, _ = problem
    basis, grads = normalized_basis(core).to(dtype), grads.to(dtype)
    lam = 0.5
    coords = ridge_coordinates(basis, grads, lam)
    assert coords.dtype == dtype and coords.shape == (7, 3)
    q = basis.T.double()  # the paper's Q (d, k)
    expected = torch.linalg.inv(q.T @ q + lam * torch.eye(3, dtype=torch.float64)) @ q.T @ grads.double().T
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(coords.double(), expected.T, atol=tol)

    def eq2(s, g):
        return float(((g.double() - q @ s.double()) ** 2).sum() + lam * (s.double() ** 2).sum())

    for i in range(7):  # the closed form is a minimum: every perturbation costs more
        base = eq2(coords[i], grads[i])
        for direction in torch.eye(3, dtype=dtype):
            assert eq2(coords[i] + 1e-2 * direction, grads[i]) > base
            assert eq2(coords[i] - 1e-2 * direction, grads[i]) > base


def test_ridge_with_zero_lambda_is_least_squares_projection(problem):
    grads, core, _, _ = problem
    basis = normalized_basis(core)
    recon = reconstruct(basis, ridge_coordinates(basis, grads, 0.0))
    residual = grads - recon
    assert torch.allclose(residual @ basis.T, torch.zeros(7, 3, dtype=torch.float64), atol=1e-10)
    with pytest.raises(ValueError, match="lam"):
        ridge_coordinates(basis, grads, -1.0)


def test_steered_update_matches_eq4_by_hand(problem):
    grads, core, weights, probs = problem
    basis = normalized_basis(core)
    coords = ridge_coordinates(basis, grads * 0.7, 0.5)
    active = torch.tensor([1, 4, 5])
    delta = steered_update(basis, coords, weights, probs, active, grads[active])
    expected = torch.zeros(11, dtype=torch.float64)
    for i in range(7):
        expected += weights[i] * (basis.T @ coords[i])
    for i in active.tolist():
        expected += weights[i] / probs[i] * (grads[i] - basis.T @ coords[i])
    assert torch.allclose(delta, expected, atol=1e-12)


def test_eq4_is_unbiased_and_theorem1_variance_is_exact(problem):
    grads, core, weights, probs = problem
    basis = normalized_basis(core)
    coords = ridge_coordinates(basis, grads * 0.5 + 0.1, 0.5)  # any fixed baseline
    mean = torch.zeros(11, dtype=torch.float64)
    second = 0.0
    for active, prob in participation_sets(probs):
        delta = steered_update(basis, coords, weights, probs, active, grads[active])
        mean += prob * delta
        second += prob * float(delta @ delta)
    target = weights @ grads
    assert torch.allclose(mean, target, atol=1e-12)
    exact_var = second - float(mean @ mean)
    formula = update_variance(grads, reconstruct(basis, coords), weights, probs)
    assert formula == pytest.approx(exact_var, rel=1e-10)


def test_update_variance_matches_monte_carlo(problem):
    grads, core, weights, probs = problem
    basis = normalized_basis(core)
    coords = ridge_coordinates(basis, grads, 0.1)
    gen = torch.Generator().manual_seed(0)
    draws = []
    for _ in range(20000):
        active = torch.nonzero(torch.rand(7, generator=gen, dtype=torch.float64) < probs).flatten()
        draws.append(steered_update(basis, coords, weights, probs, active, grads[active]))
    draws = torch.stack(draws)
    mc_var = float(((draws - draws.mean(0)) ** 2).sum(1).mean())
    exact = update_variance(grads, reconstruct(basis, coords), weights, probs)
    assert mc_var == pytest.approx(exact, rel=0.05)
    assert torch.allclose(draws.mean(0), weights @ grads, atol=0.05 * float((weights @ grads).norm()) + 0.02)


def test_projection_minimises_theorem1_variance_over_coordinates(problem):
    """Theorem 1: per-client least-squares coordinates (lambda=0) minimise the variance."""
    grads, core, weights, probs = problem
    basis = normalized_basis(core)
    best = update_variance(grads, reconstruct(basis, ridge_coordinates(basis, grads, 0.0)), weights, probs)
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        other = ridge_coordinates(basis, grads, 0.0) + 0.1 * torch.randn(7, 3, generator=gen, dtype=torch.float64)
        assert update_variance(grads, reconstruct(basis, other), weights, probs) > best
    one_hot = torch.zeros(7, 3, dtype=torch.float64)
    one_hot[torch.arange(7), torch.arange(7) % 3] = 1.0
    assert update_variance(grads, reconstruct(basis, one_hot), weights, probs) > best


def test_remark2_fedvarp_is_fedsteer_with_one_hot_coordinates(problem):
    """X = all clients and s_i = ||h_i|| e_i turn Eq. 4 into FedVARP's rule."""
    grads, _, weights, probs = problem
    stale = grads.flip(0) * 0.3 + 0.05
    basis = normalized_basis(stale)
    coords = torch.diag(stale.norm(dim=1))
    active = torch.tensor([0, 2, 6])
    delta = steered_update(basis, coords, weights, probs, active, grads[active])
    fedvarp = weights @ stale + (weights[active] / probs[active]) @ (grads[active] - stale[active])
    assert torch.allclose(delta, fedvarp, atol=1e-12)
