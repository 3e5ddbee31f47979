"""Vectorised client training (`local_train_batch`, `client_batch` > 1) computes what the
one-by-one loop computes: same minibatches, same steps, equal updates up to rounding."""
import pytest
import torch

from fedsteer_lib.experiments.config import ConfigError, FLSystem, RunConfig, Training, method
from fedsteer_lib.simulator.engine import client_updates, prepare, run
from fedsteer_lib.simulator.models import build_model
from fedsteer_lib.simulator.training import FlatModel, LocalSpec, can_batch, local_train, local_train_batch


def _clients(sizes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 1, 28, 28, generator=gen).contiguous(memory_format=torch.channels_last),
             torch.randint(0, 10, (n,), generator=gen)) for n in sizes]


@pytest.fixture(scope="module")
def flat():
    torch.manual_seed(0)
    return FlatModel(build_model("fmnist", 10, 1))


def test_batched_training_equals_client_by_client():
    """In float64. In float32 the two paths' kernels round differently (about 1e-6), and over a few
    steps such a difference now and then flips a ReLU or a max-pool choice, after which the
    updates part by up to a few per cent (seen on an AMD EPYC: 1.8 % for one client of five);
    in float64 the rounding is 1e-15 and the comparison is of the computation itself."""
    torch.manual_seed(0)
    flat = FlatModel(build_model("fmnist", 10, 1).double())
    data = [(x.double(), y) for x, y in _clients([7, 33, 64, 5, 16])]  # unequal sizes: step counts, short batches
    w = flat.get_flat()
    assert w.dtype == torch.float64
    gen = torch.Generator().manual_seed(3)
    corr = 1e-3 * torch.randn(flat.dim, generator=gen, dtype=torch.float64)
    specs = [None, LocalSpec(prox_mu=0.1), LocalSpec(correction=corr), None, LocalSpec(prox_mu=0.5, correction=-corr)]
    kw = dict(epochs=2, batch_size=8, lr=0.02)  # small enough that rounding differences stay small
    one, many = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    ref = [local_train(flat, w, x, y, generator=one, spec=s, **kw) for (x, y), s in zip(data, specs)]
    got = local_train_batch(flat, w, data, generator=many, specs=specs, **kw)
    assert torch.equal(one.get_state(), many.get_state())  # the same random draws, in the same order
    for r, g in zip(ref, got):
        assert g.num_steps == r.num_steps
        scale = float(r.update.abs().max())
        assert float((g.update - r.update).abs().max()) <= 1e-9 * scale
        assert g.final_loss == pytest.approx(r.final_loss, rel=1e-9)
    assert [g.num_steps for g in got] == [2, 10, 16, 2, 4]


def test_batching_is_not_a_no_op(flat):
    """A guard for the test above: clients' updates differ from each other by far more than the
    tolerance, so a batched trainer that mixed clients up would fail it."""
    data = _clients([16, 16])
    got = local_train_batch(flat, flat.get_flat(), data, epochs=1, batch_size=8, lr=0.05,
                            generator=torch.Generator().manual_seed(0))
    diff = float((got[0].update - got[1].update).abs().max())
    assert diff > 1e-2 * float(got[0].update.abs().max())


def test_batchnorm_models_are_refused():
    resnet = FlatModel(build_model("cifar10", 10, 3))
    assert not can_batch(resnet)
    with pytest.raises(ValueError, match="BatchNorm"):
        local_train_batch(resnet, resnet.get_flat(), _clients([4]), epochs=1, batch_size=4, lr=0.1,
                          generator=torch.Generator())


def _config(name, **kw):
    params = {"fedsteer": dict(core_size=4, warmup_cycles=1)}.get(name, {})
    return RunConfig(method=method(name, **params), system=FLSystem(num_clients=12, gamma=0.7, validation_size=1000), seed=2,
                     training=Training(rounds=4, local_epochs=1, batch_size=32, client_lr=0.05, eval_every=2,
                                       eval_last=1), **kw)


@pytest.fixture(scope="module")
def sim():
    return prepare(_config("fedavg"))


@pytest.mark.parametrize("name", ["fedsteer", "scaffold"])  # FedProx's term: the unit test above
def test_engine_with_client_batch_matches_one_by_one(name, sim):
    cfg = _config(name)
    batched = cfg.replace(client_batch=5)
    assert batched.key() == cfg.key()  # execution detail, not part of the result's identity
    a = run(cfg, progress=False, sim=sim)
    b = run(batched, progress=False, sim=sim)
    assert a.extras["participation"] == b.extras["participation"]
    for ra, rb in zip(a.history, b.history):
        assert rb["update_norm"] == pytest.approx(ra["update_norm"], rel=1e-3)
        if ra["accuracy"] == ra["accuracy"]:
            assert abs(rb["accuracy"] - ra["accuracy"]) <= 0.01


def test_client_updates_batches_in_groups(sim):
    w = sim.initial_weights
    ref, ref_steps, _ = client_updates(sim, _config("fedavg").training, w, list(range(12)), torch.Generator().manual_seed(1))
    sim.client_batch = 5  # groups of 5, 5 and 2
    got, steps, _ = client_updates(sim, _config("fedavg").training, w, list(range(12)), torch.Generator().manual_seed(1))
    assert torch.equal(steps, ref_steps)
    assert float((got - ref).abs().max()) <= 1e-4 * float(ref.abs().max())
    sim.client_batch = 1


def test_client_batch_is_validated():
    with pytest.raises(ConfigError, match="client_batch"):
        _config("fedavg", client_batch=0).validate()
