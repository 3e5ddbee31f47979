"""Core-set objective J(X) and the greedy single-swap search (Algorithm 3)."""
import pytest
import torch

from fedsteer_lib.coreset import SwapTrace, exhaustive_best, greedy_swap, objective, objective_from_gram
from helpers import clustered


@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_gram_objective_equals_direct_objective(lam):
    grads, weights = clustered(12, 30, 4, seed=0)
    for core in ([0, 1, 2], [3, 7, 11, 5], [9]):
        assert objective_from_gram(grads @ grads.T, core, weights, lam) == pytest.approx(
            objective(grads, core, weights, lam), rel=1e-9)


def test_objective_by_hand():
    grads = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=torch.float64)
    weights = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    # X = {0}: Q = e1; s_i = <g_i, e1> / (1 + lam); residual ||g_i||^2 - <g,e1>^2 + lam s^2 ... closed form:
    lam = 1.0
    expected = 0.0
    for g, w in zip(grads, weights):
        b = float(g[0])
        s = b / (1 + lam)
        expected += float(w) * ((float(g[0]) - s) ** 2 + float(g[1]) ** 2 + lam * s**2)
    assert objective(grads, [0], weights, lam) == pytest.approx(expected)


def test_greedy_swap_never_raises_j():
    grads, weights = clustered(30, 40, 6, seed=1)
    trace = SwapTrace()
    core = greedy_swap(grads, 5, weights, 0.5, max_swaps=10, seed=2, trace=trace)
    assert len(core) == 5 and len(set(core)) == 5
    assert all(b < a for a, b in zip(trace, trace[1:])), trace
    assert trace[-1] == pytest.approx(objective(grads, core, weights, 0.5), rel=1e-9)
    assert len(trace) >= 2  # from a random start at least one swap helps here


def test_greedy_swap_respects_limits_and_candidates():
    grads, weights = clustered(20, 25, 5, seed=4)
    init = [0, 1, 2, 3]
    trace = SwapTrace()
    core = greedy_swap(grads, 4, weights, 0.5, max_swaps=1, init=init, trace=trace)
    assert len(trace) <= 2 and sum(a != b for a, b in zip(core, init)) <= 1
    core = greedy_swap(grads, 4, weights, 0.5, max_swaps=5, init=init, candidates=[10, 11, 12])
    assert set(core) <= set(init) | {10, 11, 12}
    with pytest.raises(ValueError, match="core size"):
        greedy_swap(grads, 21, weights, 0.5)
    with pytest.raises(ValueError, match="distinct"):
        greedy_swap(grads, 3, weights, 0.5, init=[1, 1, 2])


def test_greedy_swap_finds_exhaustive_optimum_most_of_the_time(capsys):
    hits, trials = 0, 40
    for seed in range(trials):
        grads, weights = clustered(10, 15, 4, seed=100 + seed)
        core = greedy_swap(grads, 3, weights, 0.5, max_swaps=20, seed=seed)
        _, best = exhaustive_best(grads, 3, weights, 0.5)
        found = objective(grads, core, weights, 0.5)
        assert found >= best - 1e-9  # nothing beats the exhaustive optimum
        hits += found <= best * (1 + 1e-9)
    rate = hits / trials
    with capsys.disabled():
        print(f"\ngreedy_swap found the exhaustive optimum in {hits}/{trials} instances ({rate:.0%})")
    assert rate >= 0.6


def test_zero_updates_never_enter_the_core():
    grads, weights = clustered(10, 8, 3, seed=7)
    grads[[2, 5]] = 0.0
    core = greedy_swap(grads, 4, weights, 0.5, max_swaps=10, seed=0)
    assert 2 not in core and 5 not in core
