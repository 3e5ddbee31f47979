"""The measurements of chapters 1-3 (fedsteer_lib.probes) against hand computations, exact
enumerations over participation sets and full-dimensional recomputations."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from fedsteer_lib.book import aggregation, alignment, clients, geometry, snapshots
from fedsteer_lib.experiments.config import FLSystem, Training, method
from fedsteer_lib.simulator.partition import build_federation, participation_schedule, staleness
from fedsteer_lib.projection import normalized_basis, reconstruct, ridge_coordinates, steered_update, update_variance
from fedsteer_lib.experiments.registry import make_strategy
from fedsteer_lib.simulator.baselines import MemoryState
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


# --- the FL system ----------------------------------------------------------------------------
def test_expected_staleness_equals_enumeration_and_tends_to_one_over_p():
    for p in (0.04, 0.16, 0.5):
        for t in (0, 1, 2, 5):
            # S_t = s with prob p (1-p)^(s-1) for s <= t, = t+1 with prob (1-p)^t
            exact = sum(s * p * (1 - p) ** (s - 1) for s in range(1, t + 1)) + (t + 1) * (1 - p) ** t
            assert clients.expected_staleness(p, t) == pytest.approx(exact, rel=1e-12)
    assert clients.expected_staleness(0.04, 5000) == pytest.approx(25.0, rel=1e-9)
    assert np.allclose(clients.expected_staleness(np.array([0.04, 0.16]), 3), [clients.expected_staleness(0.04, 3),
                                                                             clients.expected_staleness(0.16, 3)])


def test_staleness_table_follows_the_schedule_and_its_expectation(small_fed):
    table = clients.staleness_table(small_fed, rounds=4, seeds=range(400))
    assert len(table) == 400 * 4 * 20
    assert (table["never"] == (table["staleness"] == table["round"] + 1)).all()
    one = table[table["seed"] == 5].pivot(index="round", columns="client", values="staleness").to_numpy()
    assert np.array_equal(one, staleness(participation_schedule(small_fed.probs, 4, 5)).numpy())
    last = table[table["round"] == 3]
    for p, g in last.groupby("p"):
        se = g["staleness"].std() / math.sqrt(len(g))
        assert abs(g["staleness"].mean() - clients.expected_staleness(p, 3)) < 4 * se


def test_staleness_summary_and_group_weights(small_fed):
    table = clients.staleness_table(small_fed, rounds=3, seeds=range(50))
    summary = clients.staleness_summary(table, 2).set_index("group")
    for group, row in summary.iterrows():
        sel = table[(table["round"] == 2) & (table["group"] == group)]
        assert row["mean_staleness"] == pytest.approx(sel["staleness"].mean())
        assert row["never_participated"] == pytest.approx((sel["staleness"] == 3).mean())
        assert row["expected_E[S_t]"] == pytest.approx(clients.expected_staleness(row["p"], 2))
        assert row["1/p"] == pytest.approx(1 / row["p"])
    w = clients.group_weights(small_fed, {"d": small_fed.weights, "ones": np.ones(20)})
    assert w[w["rule"] == "d"]["weight"].sum() == pytest.approx(1.0)
    counts = w[w["rule"] == "ones"].set_index("group")["weight"]
    labels = clients.group_labels(small_fed)
    assert all(counts[g] == (labels == g).sum() for g in clients.GROUPS)


def test_group_table_sizes_weights_and_staleness(small_fed):
    table = clients.group_table(small_fed)
    assert table["clients"].sum() == 20
    assert table["group_weight"].sum() == pytest.approx(1.0)
    common = table[table["group"].str.endswith("common")]
    rare = table[table["group"].str.endswith("rare")]
    assert set(common["points_per_client"]) == {int(50 // 0.7)} and set(rare["points_per_client"]) == {int(50 // 0.3)}
    assert common["clients"].sum() == 14
    assert table.loc[table["group"].str.startswith("weak"), "clients"].sum() == 10
    assert np.allclose(table.loc[table["group"].str.startswith("weak"), "p_i"], 0.04)
    assert np.allclose(table["expected_staleness"], 1 / table["p_i"])
    assert np.allclose(table["group_weight"], table["clients"] * table["d_i"])


def test_label_histograms_use_each_half_of_the_labels():
    labels = _labels()
    table = clients.label_histograms(labels, 10, gammas=(0.7, 0.9), system=FLSystem(num_clients=20), seed=1)
    for (gamma, group), g in table.groupby(["gamma", "group"]):
        used = set(g.loc[g["count"] > 0, "label"])
        assert used <= (set(range(5)) if group == "common" else set(range(5, 10)))
        assert g["count"].sum() == g["clients"].iloc[0] * g["points_per_client"].iloc[0]
    n_common = table[(table["gamma"] == 0.9) & (table["group"] == "common")]["clients"].iloc[0]
    assert n_common == 18


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
    spec = method("fedsteer", core_size=3, lam=0.5)
    strategy, state = aggregation.fedsteer_state(spec, ctx, stale)
    traj = snapshots.Trajectory(strategy=strategy, state=state, ctx=ctx, memory=stale, true=grads,
                             staleness=torch.ones(6, dtype=torch.long), rounds=1)
    st_e, h_e, g_e = traj.embedded()
    ctx_e = traj.context(h_e.shape[1])
    varp, vstate = aggregation.fedvarp_state(ctx, stale)
    _, vstate_e = aggregation.fedvarp_state(ctx_e, h_e)
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
    mc = aggregation.monte_carlo(strategy, {}, ctx, grads.float(), draws=40000, seed=1)
    assert abs(mc.variance - exact_var) < 4 * mc.variance_se
    assert mc.target_norm == pytest.approx(float(target.norm()), rel=1e-5)
    assert mc.mse == pytest.approx(mc.variance * (mc.draws - 1) / mc.draws + mc.bias_norm**2, rel=1e-6)
    if name == "fedavg_unbiased":
        assert exact_bias < 1e-5
        assert mc.bias_norm < 4 * mc.noise_norm
        assert exact_var == pytest.approx(update_variance(grads, torch.zeros_like(grads), weights, probs), rel=1e-5)
    else:  # the normalised mean is biased: the Monte-Carlo bias finds it
        assert exact_bias > 20 * mc.noise_norm
        assert mc.bias_norm == pytest.approx(exact_bias, rel=0.1)


def test_exact_moments_theorem_1_for_eq4(problem):
    """Eq. 4 with fixed estimates: E[Delta] = sum d_i g_i and the variance is Theorem 1's closed form."""
    grads, stale, weights, probs = problem
    grads, stale = grads.double(), stale.double()
    ctx = ServerContext(weights=weights, probs=probs, dim=grads.shape[1], device=torch.device("cpu"), client_lr=0.05)
    varp, vstate = make_strategy(method("fedvarp")), MemoryState(h=stale)
    mean, var = aggregation.exact_moments(varp, vstate, ctx, grads)
    assert torch.allclose(mean, weights @ grads, atol=1e-12)
    assert var == pytest.approx(update_variance(grads, stale, weights, probs), rel=1e-10)
    normalised_mean, _ = aggregation.exact_moments(make_strategy(method("fedavg")), {}, ctx, grads)
    assert float((normalised_mean - weights @ grads).norm()) > 1e-3
    with pytest.raises(ValueError, match="too large"):
        aggregation.exact_moments(varp, vstate, ctx, grads, max_clients=4)


def test_monte_carlo_leaves_the_state_unchanged(problem):
    grads, stale, weights, probs = problem
    ctx = _ctx(weights, probs, grads.shape[1])
    strategy, state = aggregation.fedsteer_state(method("fedsteer", core_size=3, lam=0.5, ordering="as_written"), ctx, stale)
    before = {k: v.clone() for k, v in vars(state).items() if isinstance(v, torch.Tensor)}
    aggregation.monte_carlo(strategy, state, ctx, grads, draws=50, seed=0)
    for k, v in before.items():
        assert torch.equal(getattr(state, k), v), k
    with pytest.raises(ValueError, match="draws"):
        aggregation.monte_carlo(strategy, state, ctx, grads, draws=1)


def test_estimator_table_closed_form_against_monte_carlo(problem):
    grads, stale, weights, probs = problem
    h_e, g_e = snapshots.span_embedding(stale, grads)
    ctx_e = _ctx(weights, probs, h_e.shape[1])
    varp, vstate = aggregation.fedvarp_state(ctx_e, h_e)
    entries = [("fedavg", make_strategy(method("fedavg_unbiased")), {}, torch.zeros_like(grads)),
               ("fedvarp", varp, vstate, stale)]
    table, mcs = aggregation.estimator_table(entries, grads, weights, probs, g_e, ctx_e, draws=20000, seed=0)
    assert list(table["estimator"]) == ["fedavg", "fedvarp"] and set(mcs) == {"fedavg", "fedvarp"}
    assert table.loc[1, "closed_form"] == pytest.approx(update_variance(grads, stale, weights, probs))
    assert (table["gap_in_se"] < 4).all()
    assert table.loc[0, "mc_variance"] == pytest.approx(mcs["fedavg"].variance)
    # a wrong estimate column changes the closed form but not the Monte Carlo: the gap shows it
    bad, _ = aggregation.estimator_table([("x", varp, vstate, torch.zeros_like(grads))], grads, weights, probs, g_e, ctx_e,
                                    draws=20000, seed=0)
    assert bad.loc[0, "gap_in_se"] > 4


def test_aggregation_coefficients(problem):
    _, _, weights, probs = problem
    ctx = _ctx(weights, probs, 1)
    unbiased = aggregation.aggregation_coefficients(make_strategy(method("fedavg_unbiased")), ctx, draws=30000, seed=2)
    se = unbiased.std(0) / math.sqrt(unbiased.shape[0])
    assert ((unbiased.mean(0) - weights).abs() < 4 * se + 1e-9).all()
    normalised = aggregation.aggregation_coefficients(make_strategy(method("fedavg")), ctx, draws=500, seed=2)
    sums = normalised.sum(1)
    nonempty = (normalised != 0).any(1)
    assert torch.allclose(sums[nonempty], torch.ones(int(nonempty.sum()), dtype=torch.float64), atol=1e-6)
    # the normalised mean over-weights the frequent clients: E[c_i] / d_i grows with p_i
    ratio = normalised.mean(0) / weights
    assert float(ratio[4]) > float(ratio[0])


def test_variance_contributions_sum_to_theorem_1(problem):
    grads, stale, weights, probs = problem
    terms = aggregation.variance_contributions(grads, stale, weights, probs)
    assert terms.shape == (6,) and (terms >= 0).all()
    assert float(terms.sum()) == pytest.approx(update_variance(grads, stale, weights, probs), rel=1e-10)
    i = 2
    expected = float(weights[i] ** 2 * (1 - probs[i]) / probs[i] * ((grads[i] - stale[i]).double() ** 2).sum())
    assert float(terms[i]) == pytest.approx(expected, rel=1e-10)


def test_one_hot_fedsteer_is_fedvarp_for_every_participation_set(problem):
    """Remark 2: X = all clients, s_i = ||h_i|| e_i makes Eq. 4 FedVARP's rule."""
    grads, stale, weights, probs = problem
    stale = stale.clone()
    stale[3] = 0.0  # a client never seen: FedVARP's h_i = 0
    basis, coords = aggregation.one_hot_fedsteer(stale)
    assert torch.allclose(reconstruct(basis, coords), stale, atol=1e-6)
    ctx = _ctx(weights, probs, grads.shape[1])
    varp, vstate = aggregation.fedvarp_state(ctx, stale)
    for active, _ in participation_sets(probs):
        a = steered_update(basis, coords, ctx.weights, ctx.probs, active, grads[active])
        b = varp.aggregate(vstate, ctx, active, grads[active])
        assert torch.allclose(a, b, atol=1e-5), active.tolist()


def test_fedsteer_state_caches_eq3_coordinates_of_the_snapshot(problem):
    _, stale, weights, probs = problem
    ctx = _ctx(weights, probs, stale.shape[1])
    strategy, state = aggregation.fedsteer_state(method("fedsteer", core_size=3, lam=0.5), ctx, stale)
    core = state.core.tolist()
    assert len(set(core)) == 3
    q = normalized_basis(stale[core])
    assert torch.allclose(state.basis, q, atol=1e-6)
    assert torch.allclose(state.coords, ridge_coordinates(q, stale, 0.5), atol=1e-5)
    assert torch.allclose(strategy.estimates(state, ctx), reconstruct(q, ridge_coordinates(q, stale, 0.5)), atol=1e-5)
    with pytest.raises(ValueError, match="fedsteer"):
        aggregation.fedsteer_state(method("fedavg"), ctx, stale)


# --- reconstruction --------------------------------------------------------------------------
def test_relative_error_and_cosine_by_hand():
    g = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    est = torch.tensor([[3.0, 0.0], [0.0, 2.0]])
    assert geometry.relative_error(g, est).tolist() == pytest.approx([16 / 25, 5.0])
    assert geometry.cosine(est, g).tolist() == pytest.approx([0.6, 0.0])


def test_reconstruction_study_kinds():
    gen = torch.Generator().manual_seed(4)
    n, d = 8, 30
    stale = torch.randn(n, d, generator=gen, dtype=torch.float64)
    weights = torch.full((n,), 1.0 / n, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    turned = stale @ q.T  # every update turned by the same rotation: the landscape moves rigidly
    table = geometry.reconstruction_study(stale, turned, weights, core_sizes=(3, 8), lams=(0.0, 0.5), seed=0)
    piv = table.pivot_table(index=["k", "lam", "client"], columns="kind", values="rel_error")
    # the core moves with the clients: reused coordinates are as good as on the day they were computed
    assert np.allclose(piv["steered"], piv["in-sample"], atol=1e-8)
    assert np.allclose(piv.loc[(8, 0.0)]["in-sample"], 0.0, atol=1e-10)  # k = N, lambda = 0: exact
    assert (piv["stale"] > 0.1).all()  # while the stale vectors point elsewhere
    ratio = table[(table["kind"] == "stale")]["norm_ratio"]
    assert np.allclose(ratio, 1.0)  # a rotation keeps the norms
    fresh0 = piv.xs(0.0, level="lam")
    assert (fresh0["fresh"] <= fresh0["steered"] + 1e-9).all()  # lambda = 0: least squares is optimal
    assert set(table["kind"]) == {"in-sample", "steered", "fresh", "stale"}
    assert len(table) == 2 * 2 * 4 * n


# --- the toy picture ---------------------------------------------------------------------------
def test_rotation_is_a_rotation_about_its_axis():
    r = geometry.rotation((1.0, 2.0, 2.0), 0.7)
    assert torch.allclose(r @ r.T, torch.eye(3, dtype=torch.float64), atol=1e-12)
    assert float(torch.linalg.det(r)) == pytest.approx(1.0)
    axis = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64) / 3
    assert torch.allclose(r @ axis, axis)
    v = torch.tensor([2.0, -1.0, 0.0], dtype=torch.float64)  # perpendicular to the axis
    assert float(v @ (r @ v)) / float(v @ v) == pytest.approx(math.cos(0.7))


def test_toy_ridge_table():
    core = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    table = geometry.toy_ridge_table(core, torch.tensor([3.0, 4.0, 0.0]), lams=(0.0, 1.0, 4.0))
    assert table.loc[0, "residual_sq"] == pytest.approx(0.0, abs=1e-12)
    assert (table.loc[0, "s1"], table.loc[0, "s2"]) == pytest.approx((3.0, 4.0))
    assert (table.loc[1, "s1"], table.loc[1, "s2"]) == pytest.approx((1.5, 2.0))  # orthonormal Q: s = Q^T g / (1 + lambda)
    assert table["s_norm_sq"].is_monotonic_decreasing and table["residual_sq"].is_monotonic_increasing


def test_toy_rotation_study_scenarios():
    core = torch.tensor([[1.0, 0.2, 0.1], [0.2, 1.0, 0.3]])
    grad = torch.tensor([0.7, 0.8, 0.6])
    angles = np.radians([0, 30, 60, 90])
    table = geometry.toy_rotation_study(core, grad, axis=(0.3, -0.2, 1.0), angles=angles, lam=0.1)
    moving = table[table["scenario"] == "moves with the core"]
    still = table[table["scenario"] == "stays put"]
    assert np.allclose(moving["cos_steered"], moving["cos_steered"].iloc[0])  # steering is exact here
    assert moving["cos_stale"].iloc[0] == pytest.approx(1.0) and moving["cos_stale"].is_monotonic_decreasing
    assert np.allclose(still["cos_stale"], 1.0)
    assert still["cos_steered"].iloc[-1] < still["cos_steered"].iloc[0]


# --- probe rows --------------------------------------------------------------------------------
def test_staleness_bins():
    cats = alignment.staleness_bins([1, 2, 3, 4, 5, 8, 9, 70, 0], edges=(1, 2, 3, 5, 9, 65))
    assert list(cats.categories) == ["1", "2", "3-4", "5-8", "9-64", ">=65"]
    assert [None if pd.isna(c) else c for c in cats] == ["1", "2", "3-4", "3-4", "5-8", "5-8", "9-64", ">=65", None]


def test_probe_table_and_alignment_by_staleness():
    rows = [{"round": 5, "client": -1, "mc_variance": 1.0}]
    values = [(0, 1, 0.5, 0.7), (1, 1, 0.3, 0.6), (2, 3, 0.2, 0.1), (3, -1, float("nan"), 0.4), (4, 4, 0.0, 0.5)]
    for c, s, cs, ce in values:
        rows.append({"round": 5, "client": c, "staleness": s, "cos_stale": cs, "cos_estimate": ce, "true_norm": 1.0})
    payload = {"config": {"system": {"gamma": 0.9}, "seed": 2}, "extras": {"probes": rows}}
    groups = pd.DataFrame({"client": range(5), "group": ["weak/rare", "weak/rare", "powerful/common", "weak/rare", "powerful/common"]})
    table = alignment.client_probe_table(payload, groups)
    assert len(table) == 5 and set(table["gamma"]) == {0.9} and set(table["seed"]) == {2}
    summary = alignment.alignment_by_staleness(table, edges=(1, 2, 3, 5))
    one = summary[summary["bin"] == "1"].set_index("measure")
    assert one.loc["stale h_i", "mean"] == pytest.approx(0.4)
    assert one.loc["steered Q_t s_i", "mean"] == pytest.approx(0.65)
    assert one.loc["difference", "mean"] == pytest.approx(0.25)
    assert one.loc["stale h_i", "se"] == pytest.approx(np.std([0.5, 0.3], ddof=1) / math.sqrt(2))
    assert one.loc["stale h_i", "n"] == 2
    three = summary[summary["bin"] == "3-4"].set_index("measure")
    assert three.loc["stale h_i", "n"] == 2  # staleness 3 and 4; the never-seen client is left out
    by_group = alignment.alignment_by_staleness(table, by=["group"], edges=(1, 2, 3, 5))
    assert set(by_group["group"]) == {"weak/rare", "powerful/common"}
    with pytest.raises(ValueError, match="probe rows"):
        alignment.client_probe_table({"config": payload["config"], "extras": {}})
    verdict = alignment.alignment_verdict(table)
    diffs = np.array([0.2, 0.3, -0.1, 0.5])  # clients 0, 1, 2, 4 (client 3 was never seen)
    assert verdict["n"] == 4 and verdict["mean"] == pytest.approx(diffs.mean())
    assert verdict["se"] == pytest.approx(diffs.std(ddof=1) / 2)
    assert verdict["verdict"] == "no significant difference"  # 0.225 < 2 * 0.125
    assert alignment.alignment_verdict(table, z=1.5)["verdict"] == "steered better"  # 0.225 > 1.5 * 0.125
    flipped = table.assign(cos_stale=table["cos_estimate"], cos_estimate=table["cos_stale"])
    assert alignment.alignment_verdict(flipped, z=1.5)["verdict"] == "stale better"


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
    w0, sched = snapshots.fedavg_rounds(small_sim, TINY, 0, seed=0)
    assert torch.equal(w0, small_sim.initial_weights) and sched.shape == (0, 10)


def test_trajectory_state_memory_and_staleness(small_sim):
    spec = method("fedsteer", core_size=3, lam=0.5, warmup_cycles=1)
    traj = snapshots.trajectory(small_sim, TINY, spec, rounds=4, seed=0)
    sched = participation_schedule(traj.ctx.probs.double(), 4, 0)
    last = torch.full((10,), -1, dtype=torch.long)
    for t in range(4):
        last[sched[t]] = t
    assert torch.equal(traj.staleness, 4 - last)
    assert traj.state.round == 4
    never = last < 0
    warm = snapshots.snapshot(small_sim, TINY, small_sim.initial_weights, seed=0)
    assert torch.equal(traj.memory[never], warm[never])  # not seen since the warm-up: h_i = warm-up snapshot
    assert traj.true.shape == warm.shape and not torch.equal(traj.true, warm)
    st_e, h_e, g_e = traj.embedded()
    assert h_e.shape[0] == g_e.shape[0] == 10 and st_e.basis.shape == (3, h_e.shape[1])
    full = float(update_variance(traj.true, traj.strategy.estimates(traj.state, traj.ctx), traj.ctx.weights, traj.ctx.probs))
    ctx_e = traj.context(h_e.shape[1])
    emb = float(update_variance(g_e, traj.strategy.estimates(st_e, ctx_e), ctx_e.weights, ctx_e.probs))
    assert emb == pytest.approx(full, rel=1e-4)
