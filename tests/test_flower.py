"""FedSteer and the baselines as a Flower strategy (fedsteer_lib.flower): a Flower simulation of
a small Fashion-MNIST federation gives, round by round, the global models of our engine run
with the same config (batch_stream="per_client": the same seed, participation draws and
minibatches). The simulation runs the book's example app (examples/flower_app.py)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, method
from fedsteer_lib.flower import FlowerStrategy, initial_weights
from fedsteer_lib.simulator import engine

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = FLSystem(num_clients=6, gamma=0.5, weak_prob=0.5, powerful_prob=0.8)
TRAINING = Training(rounds=4, local_epochs=1, batch_size=32, client_lr=0.05, eval_every=4, eval_last=1)
METHODS = [method("fedsteer", core_size=3, warmup_cycles=2), method("fedavg_unbiased"),
           method("mifa", start="wait_all"), method("scaffold"), method("fedprox")]


def _config(spec) -> RunConfig:
    return RunConfig(method=spec, system=SYSTEM, training=TRAINING, seed=1, batch_stream="per_client")


def engine_models(config: RunConfig, sim) -> list[torch.Tensor]:
    """The engine's global model after each round (its `_round`'s return values)."""
    models = []
    real_round = engine._round

    def recording(*args, **kwargs):
        weights = real_round(*args, **kwargs)
        models.append(weights.clone())
        return weights

    engine._round = recording
    try:
        engine.run(config, progress=False, sim=sim)
    finally:
        engine._round = real_round
    return models


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread for this module's engine runs and Flower's server (in this process), as
    Flower's clients have (Ray runs each with OMP_NUM_THREADS = its one CPU): float sums, and so
    the last bits of a model, depend on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def flower_runs(one_thread):
    spec = importlib.util.spec_from_file_location("flower_app", ROOT / "examples" / "flower_app.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    configs = [_config(m) for m in METHODS]
    return configs, example.simulate(configs)


@pytest.mark.parametrize("index", range(len(METHODS)), ids=[m.name for m in METHODS])
def test_flower_equals_the_engine_round_by_round(flower_runs, index):
    configs, strategies = flower_runs
    config, strategy = configs[index], strategies[index]
    expected = engine_models(config, engine.prepare(config))
    assert len(strategy.history) == len(expected) == TRAINING.rounds
    w0 = initial_weights(config)
    for t, (got, want) in enumerate(zip(strategy.history, expected)):
        assert torch.allclose(got, want, rtol=0, atol=1e-6), f"{config.method.name} round {t + 1}"
    assert any(not torch.equal(w, w0) for w in expected)  # the models moved


def test_mifa_wait_all_trained_its_forced_clients(flower_runs):
    configs, strategies = flower_runs
    (mifa,) = [s for c, s in zip(configs, strategies) if c.method.name == "mifa"]
    assert mifa.state.table_ready  # every client's update reached the table via `observe`


def test_the_draws_are_the_engines(flower_runs):
    configs, strategies = flower_runs
    result = engine.run(configs[1], progress=False)
    drawn = [torch.nonzero(row).flatten().tolist() for row in strategies[1].schedule]
    assert drawn == result.extras["participation"]


def test_the_strategy_refuses_the_shared_stream():
    with pytest.raises(ValueError, match="batch_stream='per_client'"):
        FlowerStrategy(_config(method("fedavg")).replace(batch_stream="shared"))


def test_the_book_page_shows_the_example_it_runs():
    page = (ROOT / "book" / "flower.md").read_text()
    included = re.findall(r"```\{literalinclude\} (\S+)", page)
    assert included and (ROOT / "book" / included[0]).resolve() == ROOT / "examples" / "flower_app.py"
