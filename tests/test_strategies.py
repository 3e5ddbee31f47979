"""Every aggregation rule against a hand computation; unbiasedness by exact enumeration."""

import pytest
import torch

from fedsteer_lib.experiments.config import ConfigError, method
from fedsteer_lib.projection import normalized_basis, ridge_coordinates
from fedsteer_lib.experiments.registry import METHODS as REGISTRY, make_strategy
from fedsteer_lib.simulator.baselines import MemoryState
from fedsteer_lib.strategy import ServerContext
from helpers import participation_sets

N, D = 6, 9


@pytest.fixture
def ctx():
    gen = torch.Generator().manual_seed(11)
    weights = torch.rand(N, generator=gen) + 0.2
    probs = torch.tensor([0.3, 0.6, 0.2, 0.5, 0.4, 0.7])
    return ServerContext(weights=weights / weights.sum(), probs=probs, dim=D, device=torch.device("cpu"), client_lr=0.1)


@pytest.fixture
def grads():
    return torch.randn(N, D, generator=torch.Generator().manual_seed(5))


def _expectation(strategy, state, ctx, grads):
    mean = torch.zeros(D, dtype=torch.float64)
    for active, p in participation_sets(ctx.probs):
        mean += p * strategy.aggregate(state, ctx, active, grads[active]).double()
    return mean


def _with_memory(strategy, ctx, seed=2):
    state = strategy.init_state(ctx)
    if hasattr(state, "h"):
        state.h = torch.randn(N, D, generator=torch.Generator().manual_seed(seed))
    return state


ACTIVE = torch.tensor([1, 3, 4])


def test_fedavg_normalised_and_unbiased_by_hand(ctx, grads):
    d, p = ctx.weights, ctx.probs
    s = make_strategy(method("fedavg"))
    expected = sum(d[i] * grads[i] for i in ACTIVE) / sum(d[i] for i in ACTIVE)
    assert torch.allclose(s.aggregate(None, ctx, ACTIVE, grads[ACTIVE]), expected, atol=1e-6)
    assert torch.equal(s.aggregate(None, ctx, torch.tensor([], dtype=torch.long), torch.zeros(0, D)), torch.zeros(D))
    u = make_strategy(method("fedavg_unbiased"))
    expected = sum(d[i] / p[i] * grads[i] for i in ACTIVE)
    assert torch.allclose(u.aggregate(None, ctx, ACTIVE, grads[ACTIVE]), expected, atol=1e-6)


def test_fedvarp_fedstale_mifa_by_hand(ctx, grads):
    d, p = ctx.weights, ctx.probs
    for name, kw in [("fedvarp", {}), ("fedstale", {"beta": 0.6})]:
        s = make_strategy(method(name, **kw))
        state = _with_memory(s, ctx)
        h = state.h
        beta = kw.get("beta", 1.0)
        expected = sum(d[i] / p[i] * grads[i] for i in ACTIVE) + beta * (
            sum(d[i] * h[i] for i in range(N)) - sum(d[i] / p[i] * h[i] for i in ACTIVE))
        assert torch.allclose(s.aggregate(state, ctx, ACTIVE, grads[ACTIVE]), expected, atol=1e-5), name
        s.update(state, ctx, ACTIVE, grads[ACTIVE], torch.ones(3, dtype=torch.long), 0)
        assert torch.equal(state.h[ACTIVE], grads[ACTIVE])
    s = make_strategy(method("mifa"))
    state = _with_memory(s, ctx)
    refreshed = state.h.clone()
    refreshed[ACTIVE] = grads[ACTIVE]
    assert torch.allclose(s.aggregate(state, ctx, ACTIVE, grads[ACTIVE]), d @ refreshed, atol=1e-6)


def test_fedstale_interpolates_fedavg_and_fedvarp(ctx, grads):
    state = _with_memory(make_strategy(method("fedvarp")), ctx)
    varp = make_strategy(method("fedvarp")).aggregate(state, ctx, ACTIVE, grads[ACTIVE])
    stale1 = make_strategy(method("fedstale", beta=1.0)).aggregate(state, ctx, ACTIVE, grads[ACTIVE])
    stale0 = make_strategy(method("fedstale", beta=0.0)).aggregate(state, ctx, ACTIVE, grads[ACTIVE])
    unbiased = make_strategy(method("fedavg_unbiased")).aggregate(None, ctx, ACTIVE, grads[ACTIVE])
    assert torch.allclose(varp, stale1) and torch.allclose(stale0, unbiased)


@pytest.mark.parametrize("name,kw", [("fedavg_unbiased", {}), ("fedvarp", {}), ("fedstale", {"beta": 0.7}),
                                     ("fedsteer", {"core_size": 3, "lam": 0.5})])
def test_unbiased_estimators(ctx, grads, name, kw):
    s = make_strategy(method(name, **kw))
    state = _with_memory(s, ctx)
    if name == "fedsteer":
        _fill_fedsteer(s, state, ctx)
    mean = _expectation(s, state, ctx, grads)
    assert torch.allclose(mean, (ctx.weights @ grads).double(), atol=1e-5)


def _fill_fedsteer(s, state, ctx, seed=9):
    """A FedSteer state as after some rounds: cached core updates and coordinates."""
    gen = torch.Generator().manual_seed(seed)
    core_grads = torch.randn(3, D, generator=gen)
    state.core_norms = core_grads.norm(dim=1)
    state.basis = normalized_basis(core_grads)
    state.gram = (state.basis @ state.basis.T).double()
    state.coords = ridge_coordinates(state.basis, torch.randn(N, D, generator=gen), 0.5)


def test_fedsteer_as_written_ordering_is_biased(ctx, grads):
    s = make_strategy(method("fedsteer", core_size=3, lam=0.5, ordering="as_written"))
    state = s.init_state(ctx)
    _fill_fedsteer(s, state, ctx)
    bias = float((_expectation(s, state, ctx, grads) - (ctx.weights @ grads).double()).norm())
    assert bias > 1e-3 * float((ctx.weights @ grads).norm())


def test_fedsteer_aggregate_is_eq4_and_update_refreshes_cache(ctx, grads):
    s = make_strategy(method("fedsteer", core_size=3, lam=0.5))
    state = s.init_state(ctx)
    _fill_fedsteer(s, state, ctx)
    d, p = ctx.weights, ctx.probs
    q = state.basis.T
    expected = sum(d[i] * q @ state.coords[i] for i in range(N)) + sum(
        d[i] / p[i] * (grads[i] - q @ state.coords[i]) for i in ACTIVE)
    assert torch.allclose(s.aggregate(state, ctx, ACTIVE, grads[ACTIVE]), expected, atol=1e-5)

    state.core = torch.tensor([0, 3, 5])  # client 3 is a core member and active
    s.update(state, ctx, ACTIVE, grads[ACTIVE], torch.ones(3, dtype=torch.long), round_idx=0)
    raw = state.basis * state.core_norms[:, None]  # h_j = ||h_j|| * basis row
    assert torch.allclose(raw[1], grads[3], atol=1e-6)
    fresh_basis = normalized_basis(raw)
    assert torch.allclose(state.basis, fresh_basis, atol=1e-6)
    assert torch.allclose(state.gram, (fresh_basis @ fresh_basis.T).double(), atol=1e-6)
    assert torch.allclose(state.coords[ACTIVE], ridge_coordinates(fresh_basis, grads[ACTIVE], 0.5), atol=1e-5)
    assert state.last_refresh[ACTIVE].tolist() == [0, 0, 0]


def test_fedsteer_refresh_every_limits_coordinate_updates(ctx, grads):
    s = make_strategy(method("fedsteer", core_size=3, lam=0.5, refresh_every=5))
    state = s.init_state(ctx)
    _fill_fedsteer(s, state, ctx)
    steps = torch.ones(3, dtype=torch.long)
    s.update(state, ctx, ACTIVE, grads[ACTIVE], steps, round_idx=0)
    after_first = state.coords.clone()
    s.update(state, ctx, ACTIVE, 2 * grads[ACTIVE], steps, round_idx=1)  # within 5 rounds: kept
    assert torch.equal(state.coords[ACTIVE], after_first[ACTIVE])
    state.round = 5
    s.update(state, ctx, ACTIVE, 2 * grads[ACTIVE], steps, round_idx=5)  # due again
    assert not torch.equal(state.coords[ACTIVE], after_first[ACTIVE])


def test_fedsteer_leaves_zero_core_rows_out_of_q(ctx, grads):
    s = make_strategy(method("fedsteer", core_size=3, lam=0.5))
    state = s.init_state(ctx)  # nothing cached yet: Delta is unbiased FedAvg
    unbiased = make_strategy(method("fedavg_unbiased")).aggregate(None, ctx, ACTIVE, grads[ACTIVE])
    assert torch.allclose(s.aggregate(state, ctx, ACTIVE, grads[ACTIVE]), unbiased, atol=1e-6)
    state.core = torch.tensor([1, 2, 5])
    s.update(state, ctx, ACTIVE, grads[ACTIVE], torch.ones(3, dtype=torch.long), 0)
    assert torch.equal(state.basis[1:], torch.zeros(2, D))  # core 2 and 5 were not active
    assert torch.equal(state.coords[ACTIVE][:, 1:], torch.zeros(3, 2))
    assert torch.allclose(state.coords[ACTIVE][:, 0].double(),
                          ridge_coordinates(normalized_basis(grads[[1]]), grads[ACTIVE], 0.5)[:, 0].double(), atol=1e-5)


def test_remark2_fedsteer_strategy_with_all_clients_and_one_hot_coords_equals_fedvarp(ctx, grads):
    steer = make_strategy(method("fedsteer", core_size=N, lam=0.5))
    state = steer.init_state(ctx)
    h = torch.randn(N, D, generator=torch.Generator().manual_seed(4))
    state.core = torch.arange(N)
    state.basis = normalized_basis(h)
    state.coords = torch.diag(h.norm(dim=1))
    varp = make_strategy(method("fedvarp"))
    assert torch.allclose(steer.aggregate(state, ctx, ACTIVE, grads[ACTIVE]),
                          varp.aggregate(MemoryState(h=h), ctx, ACTIVE, grads[ACTIVE]), atol=1e-5)


def test_scaffold_control_variates_by_hand(ctx, grads):
    s = make_strategy(method("scaffold"))
    state = s.init_state(ctx)
    state.c = torch.randn(D, generator=torch.Generator().manual_seed(1))
    state.c_i = torch.randn(N, D, generator=torch.Generator().manual_seed(2))
    c_old, ci_old = state.c.clone(), state.c_i.clone()
    spec = s.local_spec(state, 4)
    assert torch.allclose(spec.correction, c_old - ci_old[4])
    steps = torch.tensor([3, 5, 2])
    s.update(state, ctx, ACTIVE, grads[ACTIVE], steps, 0)
    c_expected = c_old.clone()
    for j, i in enumerate(ACTIVE.tolist()):
        new = ci_old[i] - c_old + grads[i] / (steps[j] * ctx.client_lr)
        assert torch.allclose(state.c_i[i], new, atol=1e-5)
        c_expected += (new - ci_old[i]) / N
    assert torch.allclose(state.c, c_expected, atol=1e-5)
    assert torch.equal(state.c_i[0], ci_old[0])


def test_fedprox_and_full_participation(ctx):
    assert make_strategy(method("fedprox")).local_spec({}, 0).prox_mu == 0.1
    assert make_strategy(method("fedprox", mu=0.3)).local_spec({}, 0).prox_mu == 0.3
    full = make_strategy(method("full"))
    assert torch.equal(full.participation_probs(ctx.probs), torch.ones(N))


def test_every_method_is_registered_and_reports_memory(ctx):
    from fedsteer_lib.experiments.config import METHOD_DEFAULTS

    assert set(REGISTRY) == set(METHOD_DEFAULTS)
    big = ServerContext(weights=torch.full((100,), 0.01), probs=torch.full((100,), 0.1), dim=1000,
                        device=torch.device("cpu"), client_lr=0.1)
    varp = make_strategy(method("fedvarp"))
    steer = make_strategy(method("fedsteer", core_size=10))
    assert varp.memory_bytes(varp.init_state(big)) == 100 * 1000 * 4
    # FedSteer: k*d cached (normalised) updates + N*k coordinates + k*k Gram + O(N + k)
    steer_bytes = steer.memory_bytes(steer.init_state(big))
    assert steer_bytes == 10 * 1000 * 4 + 100 * 10 * 4 + 10 * 10 * 8 + 100 * 8 + 10 * 8 + 10 * 4
    with pytest.raises(ConfigError, match="method must be one of"):
        method("fedsomething")


@pytest.mark.parametrize("ordering", ["unbiased", "as_written"])
def test_fedsteer_incremental_state_matches_recomputation_over_many_rounds(ctx, ordering):
    """The Gram matrix and coordinates kept incrementally (no d-sized copies) equal a from-scratch
    recomputation after every round, including rounds with several core members active,
    none active, and a zero update."""
    s = make_strategy(method("fedsteer", core_size=3, lam=0.5, ordering=ordering))
    state = s.init_state(ctx)
    state.core = torch.tensor([0, 2, 4])
    gen = torch.Generator().manual_seed(3)
    for t in range(12):
        active = torch.nonzero(torch.rand(N, generator=gen) < 0.5).flatten()
        updates = torch.randn(len(active), D, generator=gen)
        if t == 4 and len(active):
            updates[0] = 0.0
        if ordering == "as_written":  # the round's own Q and coordinates, built from scratch
            raw = state.basis * state.core_norms[:, None]
            coords = state.coords.clone()
            for row, client in enumerate(active.tolist()):
                if client in state.core.tolist():
                    raw[state.core.tolist().index(client)] = updates[row]
            norms = raw.norm(dim=1, keepdim=True)
            basis = torch.where(norms > 0, raw / norms.clamp_min(1e-30), torch.zeros_like(raw))
            keep = norms.squeeze(1) > 0
            if len(active) and keep.any():
                coords[active] = 0.0
                coords[active[:, None], torch.nonzero(keep).flatten()[None, :]] = ridge_coordinates(
                    basis[keep], updates, 0.5)
            expected = steered_update_ref(basis, coords, ctx, active, updates)
            assert torch.allclose(s.aggregate(state, ctx, active, updates), expected, atol=1e-5)
        s.update(state, ctx, active, updates, torch.ones(len(active), dtype=torch.long), t)
        assert torch.allclose(state.gram, (state.basis @ state.basis.T).double(), atol=1e-6)
        raw = state.basis * state.core_norms[:, None]
        assert torch.allclose(raw.norm(dim=1), state.core_norms, atol=1e-5)


def steered_update_ref(basis, coords, ctx, active, updates):
    """Eq. 4 written out client by client."""
    out = sum(ctx.weights[i] * (basis.T @ coords[i]) for i in range(N))
    for row, i in enumerate(active.tolist()):
        out = out + ctx.weights[i] / ctx.probs[i] * (updates[row] - basis.T @ coords[i])
    return out


def test_blocked_inner_products_equal_plain_matmuls():
    from fedsteer_lib.fedsteer import _inner_products

    gen = torch.Generator().manual_seed(0)
    updates, basis = torch.randn(5, 103, generator=gen), torch.randn(3, 103, generator=gen)
    for chunk in (4, 10, 103, 200):  # several blocks with a tail, one block, tail only
        proj, inner = _inner_products(updates, basis, chunk=chunk)
        assert torch.allclose(proj, updates @ basis.T, atol=1e-4)
        assert torch.allclose(inner, updates @ updates.T, atol=1e-4)


def test_fedsteer_enforced_refresh_recomputes_every_clients_coordinates(ctx, grads):
    s = make_strategy(method("fedsteer", core_size=3, lam=0.5, enforce_every=5))
    state = s.init_state(ctx)
    _fill_fedsteer(s, state, ctx)
    assert [t for t in range(12) if s.forced_clients(state, ctx, t)] == [4, 9]
    assert s.forced_clients(state, ctx, 4) == list(range(N))
    assert make_strategy(method("fedsteer", core_size=3)).forced_clients(state, ctx, 4) == []
    before = state.coords.clone()
    clients = torch.tensor([0, 2, 5])
    s.observe(state, ctx, clients, grads[clients], round_idx=4)
    assert torch.allclose(state.coords[clients], ridge_coordinates(state.basis, grads[clients], 0.5), atol=1e-5)
    others = torch.tensor([1, 3, 4])
    assert torch.equal(state.coords[others], before[others])
    assert state.last_refresh[clients].tolist() == [4, 4, 4]


# --- the FedStale code base's conventions (issue: baselines in the paper's framework) -------------
@pytest.mark.parametrize("name", ["fedprox", "scaffold"])
def test_weighting_parameter_by_hand(ctx, grads, name):
    d, p = ctx.weights, ctx.probs
    normalized, unbiased = make_strategy(method(name)), make_strategy(method(name, weighting="unbiased"))
    assert normalized.spec.get("weighting") == "normalized"  # the default keeps today's rule
    states = normalized.init_state(ctx), unbiased.init_state(ctx)
    expected_mean = sum(d[i] * grads[i] for i in ACTIVE) / sum(d[i] for i in ACTIVE)
    expected_sum = sum(d[i] / p[i] * grads[i] for i in ACTIVE)  # d_i / p_i, never renormalised
    assert torch.allclose(normalized.aggregate(states[0], ctx, ACTIVE, grads[ACTIVE]), expected_mean, atol=1e-6)
    assert torch.allclose(unbiased.aggregate(states[1], ctx, ACTIVE, grads[ACTIVE]), expected_sum, atol=1e-6)
    assert not torch.allclose(expected_mean, expected_sum)
    with pytest.raises(ConfigError, match="weighting"):
        method(name, weighting="renormalised").validate(N)


def test_weighting_unbiased_is_unbiased_for_fedprox(ctx, grads):
    s = make_strategy(method("fedprox", weighting="unbiased"))
    assert torch.allclose(_expectation(s, None, ctx, grads), (ctx.weights @ grads).double(), atol=1e-5)


def test_mifa_wait_all_by_hand(ctx, grads):
    """MIFA's fdu.py: no step until every client has been active once; then the table holds every
    client's update at the current model, and MIFA proceeds as usual."""
    s = make_strategy(method("mifa", start="wait_all"))
    state = s.init_state(ctx)
    one = torch.ones(N, dtype=torch.long)
    zero = torch.zeros(D)
    for t, ids in enumerate([[1, 3, 4], [0, 3]]):  # client 2 and 5 not seen yet: no step
        act = torch.tensor(ids)
        assert torch.equal(s.aggregate(state, ctx, act, grads[act]), zero)
        s.update(state, ctx, act, grads[act], one[: len(ids)], t)
        assert s.forced_clients(state, ctx, t) == []
    act = torch.tensor([2, 5])  # completes the set: still no step, but every client fills the table
    assert torch.equal(s.aggregate(state, ctx, act, grads[act]), zero)
    s.update(state, ctx, act, grads[act], one[:2], 2)
    assert s.forced_clients(state, ctx, 2) == list(range(N))
    at_current = grads + 1.0  # every client's update at the (unchanged) current model
    others = torch.tensor([0, 1, 3, 4])
    s.observe(state, ctx, others, at_current[others], 2)
    assert s.forced_clients(state, ctx, 3) == []
    table = at_current.clone()
    table[act] = grads[act]
    assert torch.equal(state.h, table)
    fresh = torch.randn(2, D, generator=torch.Generator().manual_seed(3))  # round 3: plain MIFA
    act = torch.tensor([0, 4])
    refreshed = table.clone()
    refreshed[act] = fresh
    assert torch.allclose(s.aggregate(state, ctx, act, fresh), ctx.weights @ refreshed, atol=1e-6)
    # the default start is the zero table, stepping from the first round
    z = make_strategy(method("mifa"))
    zstate = z.init_state(ctx)
    assert torch.allclose(z.aggregate(zstate, ctx, act, fresh), ctx.weights[act] @ fresh, atol=1e-6)
    with pytest.raises(ConfigError, match="mifa start"):
        method("mifa", start="later").validate(N)


def test_new_parameters_at_their_defaults_keep_result_keys():
    """Results cached before these parameters existed keep their names."""
    import hashlib
    import json

    from fedsteer_lib.experiments.config import RunConfig

    for name, new in [("fedprox", "weighting"), ("scaffold", "weighting"), ("mifa", "start")]:
        cfg = RunConfig(method=method(name))
        d = cfg.to_dict(with_device=False)
        d["method"].pop(new)
        assert cfg.key() == hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
        assert RunConfig(method=method(name, **{new: {"weighting": "unbiased", "start": "wait_all"}[new]})).key() != cfg.key()


def test_no_server_step_takes_torch_sqrt(ctx, monkeypatch):
    """torch.sqrt on a CPU is MKL's vector math, within 1 ulp but not correctly rounded, with
    bits that depend on the CPU (`numerics.sqrt`): no server step may call it. Every registered
    method runs its warm-up and a few rounds (a core member active in each), its ATen operations
    recorded; FedSteer's square roots (Eq. 1's norms, the core-set search) go through
    `numerics.sqrt`, which is shown to be called."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import fedsteer_lib.coreset
    import fedsteer_lib.fedsteer
    from fedsteer_lib import numerics

    ops: set[str] = set()
    calls = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    def counted_sqrt(x):
        calls.append(x.shape)
        return numerics.sqrt(x)

    monkeypatch.setattr(fedsteer_lib.fedsteer, "sqrt", counted_sqrt)
    monkeypatch.setattr(fedsteer_lib.coreset, "sqrt", counted_sqrt)
    gen = torch.Generator().manual_seed(4)
    for name in REGISTRY:
        spec = method(name, core_size=3, warmup_cycles=2) if name == "fedsteer" else method(name)
        s = make_strategy(spec)
        with Record():
            state = s.init_state(ctx)
            for cycle in range(s.warmup_cycles):
                s.warmup_snapshot(state, ctx, torch.randn(N, D, generator=gen), cycle, last=cycle == s.warmup_cycles - 1)
            for t in range(3):
                active = torch.tensor([0, 2, 3, 5])
                updates = torch.randn(len(active), D, generator=gen)
                s.aggregate(state, ctx, active, updates)
                s.update(state, ctx, active, updates, torch.ones(len(active), dtype=torch.long), t)
        assert "sqrt" not in ops, f"{name}'s server step calls torch.sqrt"
    assert calls, "FedSteer's square roots were not exercised"
