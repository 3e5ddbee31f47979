"""Participation draws and staleness (paper §2.1): independent Bernoulli(p_i), seeded."""
import torch

from fedsteer_lib.experiments.config import FLSystem
from fedsteer_lib.simulator.partition import build_federation, participation_schedule, staleness


def test_participation_rates_match_probabilities_and_seed():
    probs = torch.tensor([0.04] * 50 + [0.16] * 50, dtype=torch.float64)
    sched = participation_schedule(probs, 4000, seed=3)
    rates = sched.double().mean(0)
    assert abs(float(rates[:50].mean()) - 0.04) < 0.003
    assert abs(float(rates[50:].mean()) - 0.16) < 0.005
    assert torch.equal(sched, participation_schedule(probs, 4000, seed=3))
    assert not torch.equal(sched, participation_schedule(probs, 4000, seed=4))
    # independence between clients: the correlation of two clients' indicators is ~0
    a, b = sched[:, 60].double(), sched[:, 61].double()
    assert abs(float(((a - a.mean()) * (b - b.mean())).mean())) < 0.01


def test_staleness_counts_rounds_since_last_participation():
    sched = torch.tensor([[1, 0], [0, 0], [0, 1], [1, 0]], dtype=torch.bool)
    assert staleness(sched).tolist() == [[1, 1], [1, 2], [2, 3], [3, 1]]


def test_partition_sizes_for_both_gammas():
    labels = torch.arange(60000) % 10
    for gamma, common, per_common, per_rare in ((0.7, 70, 71, 166), (0.9, 90, 55, 500)):
        fed = build_federation(FLSystem(gamma=gamma), labels, 10, seed=0)
        assert int(fed.is_common.sum()) == common
        assert fed.sizes[fed.is_common].unique().tolist() == [per_common]
        assert fed.sizes[~fed.is_common].unique().tolist() == [per_rare]
        for ix, is_common in zip(fed.client_indices, fed.is_common.tolist()):
            assert set((labels[ix]).tolist()) <= (set(range(5)) if is_common else set(range(5, 10)))
        # weak/powerful drawn independently of the data groups: both groups mix
        assert 0 < int((fed.is_weak & fed.is_common).sum()) < common


def test_validation_split_is_held_out_of_the_client_pool():
    labels = torch.arange(60000) % 10
    fed = build_federation(FLSystem(gamma=0.7, validation_size=10000), labels, 10, seed=1)
    held_out = set(fed.eval_indices.tolist())
    assert len(held_out) == 10000
    assert not held_out & set(torch.cat(fed.client_indices).tolist())
