"""What chapters 1-3 share (fedsteer_lib.book.snapshots) against hand computations, exact
enumerations over participation sets and full-dimensional recomputations. The analysis each of
these chapters does alone is checked in its own hidden cells, which nbval runs."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from fedsteer_lib.book import snapshots
from fedsteer_lib.experiments.config import FLSystem, Training, method
from fedsteer_lib.experiments.registry import make_strategy
from fedsteer_lib.projection import normalized_basis, reconstruct, ridge_coordinates, update_variance
from fedsteer_lib.simulator.partition import build_federation
from fedsteer_lib.strategy import ServerContext
from helpers import participation_sets


def _labels(num_classes=10, per_class=400, seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    return labels[torch.randperm(labels.numel(), generator=gen)]


@pytest.fixture(scope="module")
def small_fed():
    return build_federation(FLSystem(num_clients=20, gamma=0.7), _labels(), 10, seed=3)


def _ctx(weights, probs, dim):
    return ServerContext(weights=weights.float(), probs=probs.float(), dim=dim, device=torch.device("cpu"), client_lr=0.05)


@pytest.fixture
def problem():
    gen = torch.Generator().manual_seed(7)
    n, d = 6, 40
    grads = torch.randn(n, d, generator=gen)
    stale = grads + 0.8 * torch.randn(n, d, generator=gen)
    weights = torch.rand(n, generator=gen, dtype=torch.float64) + 0.2
    weights /= weights.sum()
    probs = torch.tensor([0.1, 0.3, 0.5, 0.2, 0.7, 0.4], dtype=torch.float64)
    return grads, stale, weights, probs


def _fedsteer_after_warmup(spec, ctx, stale):
    """FedSteer's server state right after one warm-up selection cycle on the snapshot `stale`."""
    strategy = make_strategy(spec)
    state = strategy.init_state(ctx)
    strategy.warmup_snapshot(state, ctx, stale.to(ctx.weights.dtype), cycle=0, last=True)
    return strategy, state


def _fedvarp_with_memory(ctx, stale):
    strategy = make_strategy(method("fedvarp", warmup_cycles=1))
    state = strategy.init_state(ctx)
    strategy.warmup_snapshot(state, ctx, stale.to(ctx.weights.dtype), cycle=0, last=True)
    return strategy, state


# --- client groups -----------------------------------------------------------------------------
def test_group_labels_and_sums(small_fed):
    labels = snapshots.group_labels(small_fed)
    assert set(labels) == set(snapshots.GROUPS)
    assert (labels == "weak/common").sum() == int((small_fed.is_weak & small_fed.is_common).sum())
    assert all(p == pytest.approx(0.04 if g.startswith("weak") else 0.16) for g, p in zip(labels, small_fed.probs.tolist()))
    sums = snapshots.group_sums(small_fed, small_fed.weights)
    assert list(sums) == list(snapshots.GROUPS) and sum(sums.values()) == pytest.approx(1.0)
    counts = snapshots.group_sums(small_fed, np.ones(20))
    assert all(counts[g] == (labels == g).sum() for g in snapshots.GROUPS)


# --- exact low-dimensional coordinates ---------------------------------------------------------
def test_span_embedding_preserves_every_inner_product():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(7, 300, generator=gen)
    b = torch.randn(5, 300, generator=gen)
    b[4] = 2 * a[0] - b[1]  # rank deficient: 11 independent rows
    ea, eb = snapshots.span_embedding(a, b, chunk=64)
    assert ea.shape[0] == 7 and eb.shape[0] == 5 and ea.shape[1] == eb.shape[1] == 11
    full = torch.cat([a, b]).double()
    emb = torch.cat([ea, eb]).double()
    assert torch.allclose(emb @ emb.T, full @ full.T, rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="same dimension"):
        snapshots.span_embedding(a, torch.randn(2, 10))


def test_strategies_give_the_same_errors_on_the_embedding(problem):
    """FedSteer (both orderings) and FedVARP applied to span coordinates reproduce the
    full-dimensional aggregates exactly (same distance to every update and to the target)."""
    grads, stale, weights, probs = problem
    ctx = _ctx(weights, probs, grads.shape[1])
    strategy, state = _fedsteer_after_warmup(method("fedsteer", core_size=3, lam=0.5), ctx, stale)
    h_e, g_e, q_e = snapshots.span_embedding(stale, grads, state.basis)
    ctx_e = _ctx(weights, probs, h_e.shape[1])
    st_e = dataclasses.replace(state, basis=q_e)
    varp, vstate = _fedvarp_with_memory(ctx, stale)
    _, vstate_e = _fedvarp_with_memory(ctx_e, h_e)
    rules = [(strategy, state, st_e), (make_strategy(method("fedsteer", core_size=3, lam=0.5, ordering="as_written")), state, st_e),
             (varp, vstate, vstate_e)]
    for active in ([0, 2], [1, 3, 4, 5], []):
        active = torch.tensor(active, dtype=torch.long)
        for rule, s_full, s_emb in rules:
            full = rule.aggregate(s_full, ctx, active, grads[active]).double()
            emb = rule.aggregate(s_emb, ctx_e, active, g_e[active]).double()
            d_full = torch.linalg.vector_norm(full[None] - grads.double(), dim=1)
            d_emb = torch.linalg.vector_norm(emb[None] - g_e.double(), dim=1)
            assert torch.allclose(d_full, d_emb, rtol=1e-4, atol=1e-5), (rule.spec.label, active.tolist())


# --- Monte-Carlo over participation draws ------------------------------------------------------
def test_participation_draws_are_bernoulli(problem):
    _, _, _, probs = problem
    masks = snapshots.participation_draws(probs, 40000, seed=3)
    assert masks.shape == (40000, 6) and masks.dtype == bool
    assert np.allclose(masks.mean(0), probs.numpy(), atol=4 * 0.5 / math.sqrt(40000))
    assert np.array_equal(masks, snapshots.participation_draws(probs, 40000, seed=3))


@pytest.mark.parametrize("name", ["fedavg_unbiased", "fedavg"])
def test_monte_carlo_matches_exact_enumeration(problem, name):
    grads, _, weights, probs = problem
    grads = grads.double()
    ctx = _ctx(weights, probs, grads.shape[1])
    strategy = make_strategy(method(name))
    mean = torch.zeros(grads.shape[1], dtype=torch.float64)
    second = 0.0
    for active, prob in participation_sets(probs):
        delta = strategy.aggregate({}, ctx, active, grads[active].float()).double()
        mean += prob * delta
        second += prob * float(delta @ delta)
    exact_var = second - float(mean @ mean)
    target = weights @ grads
    exact_bias = float((mean - target).norm())
    mc = snapshots.monte_carlo(strategy, {}, ctx, grads.float(), draws=40000, seed=1)
    assert abs(mc.variance - exact_var) < 4 * mc.variance_se
    assert mc.target_norm == pytest.approx(float(target.norm()), rel=1e-5)
    assert mc.mse == pytest.approx(mc.variance * (mc.draws - 1) / mc.draws + mc.bias_norm**2, rel=1e-6)
    assert mc.errors.shape == (40000,) and mc.relative_bias == pytest.approx(mc.bias_norm / mc.target_norm)
    if name == "fedavg_unbiased":
        assert exact_bias < 1e-5
        assert mc.bias_norm < 4 * mc.noise_norm
        assert exact_var == pytest.approx(update_variance(grads, torch.zeros_like(grads), weights, probs), rel=1e-5)
    else:  # the normalised mean is biased: the Monte-Carlo bias finds it
        assert exact_bias > 20 * mc.noise_norm
        assert mc.bias_norm == pytest.approx(exact_bias, rel=0.1)


def test_monte_carlo_leaves_the_state_unchanged(problem):
    grads, stale, weights, probs = problem
    ctx = _ctx(weights, probs, grads.shape[1])
    strategy, state = _fedsteer_after_warmup(method("fedsteer", core_size=3, lam=0.5, ordering="as_written"), ctx, stale)
    before = {k: v.clone() for k, v in vars(state).items() if isinstance(v, torch.Tensor)}
    snapshots.monte_carlo(strategy, state, ctx, grads, draws=50, seed=0)
    for k, v in before.items():
        assert torch.equal(getattr(state, k), v), k
    with pytest.raises(ValueError, match="draws"):
        snapshots.monte_carlo(strategy, state, ctx, grads, draws=1)


def test_variance_contributions_sum_to_theorem_1(problem):
    grads, stale, weights, probs = problem
    terms = snapshots.variance_contributions(grads, stale, weights, probs)
    assert terms.shape == (6,) and (terms >= 0).all()
    assert float(terms.sum()) == pytest.approx(update_variance(grads, stale, weights, probs), rel=1e-10)
    i = 2
    expected = float(weights[i] ** 2 * (1 - probs[i]) / probs[i] * ((grads[i] - stale[i]).double() ** 2).sum())
    assert float(terms[i]) == pytest.approx(expected, rel=1e-10)


def test_fedsteer_warmup_caches_eq3_coordinates_of_the_snapshot(problem):
    """The state chapter 3 measures: after one warm-up cycle, Q is Eq. 1 of the core's updates and
    every s_i is Eq. 3 of the snapshot."""
    _, stale, weights, probs = problem
    ctx = _ctx(weights, probs, stale.shape[1])
    strategy, state = _fedsteer_after_warmup(method("fedsteer", core_size=3, lam=0.5), ctx, stale)
    core = state.core.tolist()
    assert len(set(core)) == 3
    q = normalized_basis(stale[core])
    assert torch.allclose(state.basis, q, atol=1e-6)
    assert torch.allclose(state.coords, ridge_coordinates(q, stale, 0.5), atol=1e-5)
    assert torch.allclose(strategy.estimates(state, ctx), reconstruct(q, ridge_coordinates(q, stale, 0.5)), atol=1e-5)


# --- real client updates (small system) ------------------------------------------------------------
@pytest.fixture(scope="module")
def small_sim():
    from fedsteer_lib.experiments.config import RunConfig
    from fedsteer_lib.simulator.engine import prepare

    return prepare(RunConfig(system=FLSystem(num_clients=10, gamma=0.7), seed=1))


TINY = Training(rounds=3, local_epochs=1, batch_size=32, client_lr=0.05)


def test_snapshot_is_seeded_and_matches_client_updates(small_sim):
    from fedsteer_lib.simulator.engine import client_updates

    a = snapshots.snapshot(small_sim, TINY, small_sim.initial_weights, seed=0)
    b = snapshots.snapshot(small_sim, TINY, small_sim.initial_weights, seed=0)
    assert a.shape == (10, small_sim.flat_model.dim) and torch.equal(a, b)
    c, _, _ = client_updates(small_sim, TINY, small_sim.initial_weights, list(range(10)),
                             snapshots.torch_generator(0, snapshots.SNAPSHOT_STREAM))
    assert torch.equal(a, c)
    assert not torch.equal(a, snapshots.snapshot(small_sim, TINY, small_sim.initial_weights, seed=1))
    ctx = snapshots.server_context(small_sim.federation, a.shape[1], TINY.client_lr, seed=0)
    assert ctx.weights.dtype == torch.float32 and torch.allclose(ctx.weights.double(), small_sim.federation.weights)
