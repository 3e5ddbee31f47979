"""The simulator on real Fashion-MNIST: determinism, every method learns, collapse is recorded."""
import dataclasses
import math

import pytest
import torch

from fedsteer_lib.experiments.config import METHOD_DEFAULTS, Diagnostics, FLSystem, RunConfig, Training, method
from fedsteer_lib.simulator.engine import prepare, run

SMALL = FLSystem(num_clients=20, gamma=0.7, validation_size=1000)  # evaluated on 1,000 held-out images: fast


def _config(name="fedavg", rounds=6, **kw):
    params = {"fedsteer": dict(core_size=5, warmup_cycles=1)}.get(name, {})
    params.update(kw)
    return RunConfig(method=method(name, **params), system=SMALL, seed=1,
                     training=Training(rounds=rounds, local_epochs=1, batch_size=32, client_lr=0.05, eval_every=3, eval_last=1))


@pytest.fixture(scope="module")
def sim():
    return prepare(_config())


def test_partition_and_weights(sim):
    fed = sim.federation
    sizes = fed.sizes
    assert sizes[fed.is_common].unique().tolist() == [int(50 // 0.7)]
    assert sizes[~fed.is_common].unique().tolist() == [int(50 // 0.3)]
    assert int(fed.is_common.sum()) == 14 and int(fed.is_weak.sum()) == 10
    assert math.isclose(float(fed.weights.sum()), 1.0)
    for i, labels in enumerate(sim.client_labels):
        allowed = fed.common_labels if fed.is_common[i] else fed.rare_labels
        assert set(labels.unique().tolist()) <= set(allowed)
    all_ix = torch.cat(fed.client_indices)
    assert all_ix.unique().numel() == all_ix.numel()  # drawn without replacement
    assert sorted(set(fed.probs.tolist())) == pytest.approx([0.04, 0.16])


def test_same_seed_is_bit_identical(sim):
    a = run(_config("fedsteer"), progress=False, sim=sim)
    b = run(_config("fedsteer"), progress=False)  # fresh data preparation too
    assert repr(a.history) == repr(b.history)  # repr: exact float digits, and nan == nan
    assert a.extras["participation"] == b.extras["participation"]
    c = run(_config("fedsteer").replace(seed=2), progress=False)
    assert repr(c.history) != repr(a.history)


def test_warmup_snapshots_are_reused_by_the_next_run_and_change_nothing(monkeypatch):
    """Runs on one SimData with the same local training and server step share the warm-up
    snapshots (engine.warmup_updates), whatever their rounds and eval schedule, and FedSteer's
    greedy core set on them, whatever its other settings (ServerContext.snapshot_memo): each such
    run equals the same run with its snapshots and selection computed anew."""
    from fedsteer_lib import fedsteer

    selections = []
    real = fedsteer.greedy_swap
    monkeypatch.setattr(fedsteer, "greedy_swap", lambda grads, k, w, lam, **kw: selections.append((k, lam))
                        or real(grads, k, w, lam, **kw))
    two = dict(warmup_cycles=2)
    configs = [_config(name, rounds=rounds, **two, **kw) for name, rounds, kw in
               (("fedsteer", 2, {}), ("mifa", 2, {}), ("fedsteer", 3, dict(lam=0.0, ordering="as_written")),
                ("fedsteer", 2, dict(ordering="as_written", refresh_every=2)))]
    # the third has other rounds and another eval schedule, but the same local training and server step
    configs[2] = configs[2].replace(training=dataclasses.replace(configs[2].training, eval_every=1, eval_last=2))
    slower = _config("fedsteer", **two).replace(training=Training(rounds=2, local_epochs=1, client_lr=0.02, eval_every=2, eval_last=1))
    shared_sim = prepare(configs[0])
    lam = configs[0].method.get("lam")
    # computed on the shared snapshots: the first run's core set (one per cycle), then only the other lam's;
    # the fourth run's other ordering and refresh do not change the selection
    on_shared = [[(5, lam)] * 2, [], [(5, 0.0)] * 2, [], [(5, lam)] * 2]
    for index, cfg in enumerate([*configs, slower]):
        selections.clear()
        shared = run(cfg, progress=False, sim=shared_sim)
        assert selections == on_shared[index], cfg.method.label
        fresh = run(cfg, progress=False, sim=dataclasses.replace(shared_sim, warmup=None))  # computed anew
        assert shared.summary["warmup_reused"] is (0 < index < len(configs)), cfg.method.label
        assert fresh.summary["warmup_reused"] is False
        assert repr(shared.history) == repr(fresh.history), cfg.method.label
        assert repr(shared.extras) == repr(fresh.extras), cfg.method.label
    assert "warmup_reused" not in run(_config("fedavg"), progress=False, sim=shared_sim).summary


def test_the_initial_evaluation_is_computed_once_per_sim_and_arithmetic(monkeypatch):
    """Round 0 scores w_0, which no method or training setting changes: runs on one SimData
    evaluate it once (engine.initial_evaluation) and record what a fresh SimData computes; a run
    with other arithmetic (bf16) evaluates it anew."""
    from fedsteer_lib.simulator import engine

    calls = []
    real = engine.evaluate
    monkeypatch.setattr(engine, "evaluate", lambda *a, **kw: calls.append(a[1]) or real(*a, **kw))
    shared_sim = prepare(_config(rounds=1))
    configs = [_config("fedavg", rounds=1), _config("mifa", rounds=1),
               _config("fedavg", rounds=1).replace(precision="bf16"), _config("fedprox", rounds=1)]
    for cfg in configs:
        calls.clear()
        shared = run(cfg, progress=False, sim=shared_sim)
        evaluated_w0 = any(torch.equal(w, shared_sim.initial_weights) for w in calls)
        assert evaluated_w0 is (cfg is configs[0] or cfg is configs[2]), cfg
        fresh = run(cfg, progress=False, sim=dataclasses.replace(shared_sim, initial_eval={}))  # w_0 scored anew
        assert repr(shared.history) == repr(fresh.history), cfg


def test_shared_sim_uses_each_runs_own_training_settings(sim):
    base = run(_config("fedavg"), progress=False, sim=sim)
    other = _config("fedavg").replace(training=Training(rounds=6, local_epochs=2, client_lr=0.01, eval_every=3, eval_last=1))
    shared = run(other, progress=False, sim=sim)
    fresh = run(other, progress=False)
    assert repr(shared.history) == repr(fresh.history) != repr(base.history)


def test_methods_share_the_participation_sequence(sim):
    a = run(_config("fedavg"), progress=False, sim=sim)
    b = run(_config("fedvarp"), progress=False, sim=sim)
    assert a.extras["participation"] == b.extras["participation"]


@pytest.fixture(scope="module")
def sim100():
    return prepare(_config().replace(system=FLSystem(gamma=0.7, validation_size=2000)))


@pytest.mark.parametrize("name", sorted(METHOD_DEFAULTS))
def test_every_method_beats_chance_on_fashion_mnist(sim100, name):
    """The paper's system (N=100, gamma=0.7), 6 rounds of one local epoch (2 for full
    participation, whose every round trains all 100 clients), scored on 2,000 held-out training
    images (a fifth of the test set's evaluation cost). With pinned kernels the accuracies are
    the same on every machine: 0.38 (MIFA) to 0.60 here, against chance at 0.1."""
    cfg = _config(name, rounds=2 if name == "full" else 6).replace(system=FLSystem(gamma=0.7, validation_size=2000))
    result = run(cfg, progress=False, sim=sim100)
    assert not result.summary["collapsed"]
    assert result.summary["final_accuracy"] > 0.3, result.summary  # chance is 0.1


def test_divergence_is_recorded_as_collapse(sim):
    cfg = _config("fedavg_unbiased", rounds=10).replace(training=Training(rounds=10, local_epochs=1, client_lr=1e6, eval_every=1))
    result = run(cfg, progress=False, sim=sim)
    assert result.summary["collapsed"] is True
    assert result.summary["rounds_done"] < 10
    assert result.summary["collapse_round"] == result.summary["rounds_done"] + 1
    # scored on the model the run ends with (the diverged one), not the last one before it
    last, before = result.history[-1], result.history[-2]
    assert last["round"] == result.summary["collapse_round"] and last["collapsed"] is True
    assert result.summary["final_accuracy"] == last["accuracy"] == result.summary["mean_last_accuracy"]
    assert result.summary["accuracy_before_collapse"] == before["accuracy"]
    assert result.summary["final_accuracy"] < 0.2  # a diverged model predicts about chance (0.1)
    assert math.isfinite(result.summary["final_accuracy"])


def test_probes_measure_variance_and_misalignment(sim):
    cfg = _config("fedsteer", rounds=4).replace(diagnostics=Diagnostics(probe_every=2, probe_mc_samples=400, track_coords=(0, 15)))
    result = run(cfg, progress=False, sim=sim)
    summary_rows = [r for r in result.extras["probes"] if r["client"] == -1]
    assert [r["round"] for r in summary_rows] == [0, 2]
    for r in summary_rows:  # unbiased ordering: Monte Carlo variance matches Theorem 1's closed form
        assert r["mc_variance"] == pytest.approx(r["exact_variance"], rel=0.2)
    client_rows = [r for r in result.extras["probes"] if r["client"] >= 0 and r["round"] == 2]
    assert len(client_rows) == 20
    assert all(-1.0001 <= r["cos_estimate"] <= 1.0001 for r in client_rows)
    assert len(result.extras["coords_history"]["0"]) == 4
    assert len(result.extras["coords_history"]["0"][0]) == 5


def test_warmup_selects_core_and_restarts_from_initial_weights(sim):
    result = run(_config("fedsteer", rounds=1, warmup_cycles=2, max_swaps=3), progress=False, sim=sim)
    traces = result.extras["swap_trace"]
    assert len(traces) == 2 and all(all(b < a for a, b in zip(t, t[1:])) for t in traces)
    base = run(_config("fedavg", rounds=1), progress=False, sim=sim)
    assert result.history[0]["accuracy"] == base.history[0]["accuracy"]  # same initial model


def test_bad_configs_name_the_field():
    from fedsteer_lib.experiments.config import ConfigError

    bad = [
        (lambda: RunConfig(system=FLSystem(gamma=1.0)).validate(), "gamma"),
        (lambda: RunConfig(system=FLSystem(weak_prob=0.0)).validate(), "weak_prob"),
        (lambda: RunConfig(system=FLSystem(powerful_prob=1.5)).validate(), "powerful_prob"),
        (lambda: RunConfig(method=method("fedsteer", core_size=101)).validate(), "core_size"),
        (lambda: RunConfig(method=method("fedsteer", lam=-1.0)).validate(), "lam"),
        (lambda: RunConfig(method=method("fedsteer", ordering="sideways")).validate(), "ordering"),
        (lambda: RunConfig(dataset="mnist").validate(), "dataset"),
        (lambda: RunConfig(training=Training(client_lr=0)).validate(), "client_lr"),
        (lambda: method("fedavg", beta=0.5), "fedavg parameter"),
        (lambda: method("nope"), "method"),
    ]
    for make, field in bad:
        with pytest.raises(ConfigError, match=field):
            make()


def test_config_round_trips_and_keys_ignore_device():
    cfg = _config("fedsteer").replace(diagnostics=Diagnostics(track_coords=(1, 2)))
    again = RunConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.key() == cfg.key()
    assert cfg.replace(device="cuda").key() == cfg.key()
    assert cfg.replace(seed=5).key() != cfg.key()


def test_enforced_refresh_trains_every_client_but_changes_delta_only_afterwards(sim):
    plain = run(_config("fedsteer", rounds=4), progress=False, sim=sim)
    forced = run(_config("fedsteer", rounds=4, enforce_every=2), progress=False, sim=sim)
    norms = lambda r: [h["update_norm"] for h in r.history[1:]]  # noqa: E731
    # the first forced refresh happens after round 2 (t = 1): rounds 1-2 are identical, round 3 not
    assert norms(plain)[:2] == norms(forced)[:2] and norms(plain)[2] != norms(forced)[2]
    assert forced.summary["timing"]["forced"] > 0 and plain.summary["timing"]["forced"] == 0


def test_late_default_parameters_keep_earlier_result_keys():
    import json
    from pathlib import Path

    from fedsteer_lib.experiments.config import RunConfig

    runs_dir = Path(__file__).resolve().parent.parent / "data" / "results" / "runs"
    stored = [json.loads(p.read_text()) for p in sorted(runs_dir.glob("*.json"))]
    steer = [r for r in stored if r["config"]["method"]["name"] == "fedsteer"]
    assert steer, "the committed results hold FedSteer runs"
    for r in steer:
        assert RunConfig.from_dict(r["config"]).key() == r["key"]
    enforced = RunConfig.from_dict(steer[0]["config"]).replace(method=method("fedsteer", enforce_every=5))
    assert enforced.key() != RunConfig.from_dict(steer[0]["config"]).replace(method=method("fedsteer")).key()


def test_mifa_wait_all_takes_no_step_until_every_client_was_seen(sim):
    """fdu.py's start: the model stays at w_0 (accuracy unchanged) while some client was never active;
    the round that completes the set trains the others at the current model (forced time > 0)."""
    cfg = _config("mifa", start="wait_all").replace(
        system=FLSystem(num_clients=20, gamma=0.7, weak_prob=0.2, powerful_prob=0.4, validation_size=1000),
        training=Training(rounds=25, local_epochs=1, batch_size=32, client_lr=0.05, eval_every=5, eval_last=0))
    result = run(cfg, progress=False)
    seen, complete = set(), None
    for t, ids in enumerate(result.extras["participation"]):
        seen |= set(ids)
        if complete is None and len(seen) == cfg.system.num_clients:
            complete = t
    assert complete is not None and 5 <= complete < 24, "the draw must complete the set within the rounds"
    initial = result.history[0]["accuracy"]
    for row in result.history[1: complete + 2]:  # rounds 0..complete leave w_0 unchanged (Delta = 0)
        assert row["update_norm"] == 0.0 and (math.isnan(row["accuracy"]) or row["accuracy"] == initial)
    assert result.history[5]["accuracy"] == initial  # evaluated (eval_every=5): still w_0
    assert result.history[complete + 2]["update_norm"] > 0
    assert result.summary["timing"]["forced"] > 0


def test_the_engine_names_no_method():
    """The round loop and its recorder drive any Strategy through its hooks: no method name and
    no key of a method's state appears in them."""
    import dataclasses
    import re
    from pathlib import Path

    from fedsteer_lib.experiments.registry import METHODS as REGISTRY
    from fedsteer_lib.fedsteer import FedSteerState
    from fedsteer_lib.simulator import baselines

    folder = Path(__file__).resolve().parents[1] / "fedsteer_lib" / "simulator"
    states = [FedSteerState, baselines.MemoryState, baselines.MifaState, baselines.ScaffoldState]
    words = set(REGISTRY) | {f.name for s in states for f in dataclasses.fields(s) if len(f.name) > 1} - {"round"}
    for module in ("engine.py", "recorder.py"):
        code = "\n".join(line.split("#")[0] for line in (folder / module).read_text().splitlines())
        code = re.sub(r'""".*?"""', "", code, flags=re.S)  # docstrings may explain
        found = sorted(w for w in words if re.search(rf"(?<![.\w]){w}\b", code, flags=re.I))
        assert not found, f"{module} names {found}"


def test_default_batch_stream_keeps_every_committed_result_key():
    """`batch_stream` was added later: at its default ("shared") it is left out of the key, so the
    default config's key (computed before the field existed) and every committed result's stand."""
    import json
    from pathlib import Path

    assert RunConfig().key() == "2572fedaa22cbd10"
    runs_dir = Path(__file__).resolve().parent.parent / "data" / "results" / "runs"
    stored = [json.loads(p.read_text()) for p in sorted(runs_dir.glob("*.json"))[:40]]
    assert stored and all("batch_stream" not in r["config"] for r in stored)
    for r in stored:
        assert RunConfig.from_dict(r["config"]).key() == r["key"]
    per_client = RunConfig.from_dict(stored[0]["config"]).replace(batch_stream="per_client")
    assert per_client.key() != stored[0]["key"]
    assert RunConfig.from_dict(per_client.to_dict()) == per_client


def test_bad_batch_stream_is_named():
    from fedsteer_lib.experiments.config import ConfigError

    with pytest.raises(ConfigError, match="batch_stream must be one of"):
        RunConfig(batch_stream="per_round").validate()


def test_per_client_stream_is_deterministic_and_ignores_the_other_clients(sim):
    """A client's update under the per_client stream depends on (seed, round, client) only:
    training it alone, after other clients, or in another order gives the same bits."""
    from fedsteer_lib.simulator.engine import STREAM_BATCHES, client_generator, client_updates

    cfg = _config("fedavg")
    w = sim.initial_weights
    gen = lambda i: client_generator(cfg.seed, STREAM_BATCHES, 3, i)  # noqa: E731
    together, _, _ = client_updates(sim, cfg.training, w, [2, 5, 7], gen)
    reordered, _, _ = client_updates(sim, cfg.training, w, [7, 2, 5], gen)
    alone, _, _ = client_updates(sim, cfg.training, w, [5], gen)
    assert torch.equal(together[1], alone[0])
    assert torch.equal(together[0], reordered[1]) and torch.equal(together[2], reordered[0])
    other_round, _, _ = client_updates(sim, cfg.training, w, [5], lambda i: client_generator(cfg.seed, STREAM_BATCHES, 4, i))
    assert not torch.equal(alone[0], other_round[0])
    sim.client_batch = 2  # the vectorised path draws each client's batches from its own generator too
    try:
        batched, _, _ = client_updates(sim, cfg.training, w, [7, 2, 5], gen)
    finally:
        sim.client_batch = 1
    tolerance = 1e-3 * float(reordered.abs().max())  # rounding (other kernels, see local_train_batch)
    assert float((batched - reordered).abs().max()) <= tolerance
    assert float((alone[0] - other_round[0]).abs().max()) > 10 * tolerance  # other batches: far off
    # the shared stream does depend on who trained first
    shared_first, _, _ = client_updates(sim, cfg.training, w, [5], torch.Generator().manual_seed(0))
    shared_second, _, _ = client_updates(sim, cfg.training, w, [2, 5], torch.Generator().manual_seed(0))
    assert not torch.equal(shared_first[0], shared_second[1])


def test_per_client_stream_runs_are_reproducible_and_differ_from_shared(sim):
    cfg = _config("fedsteer", rounds=3).replace(batch_stream="per_client")
    a = run(cfg, progress=False, sim=sim)
    b = run(cfg, progress=False)
    assert repr(a.history) == repr(b.history)
    shared = run(cfg.replace(batch_stream="shared"), progress=False, sim=sim)
    assert a.extras["participation"] == shared.extras["participation"]
    assert repr(a.history[1:]) != repr(shared.history[1:])


# --- the final accuracy is the last round's model (issue 58) -------------------------------------------
def test_the_last_round_is_always_evaluated(sim):
    """`--rounds 3 --eval-every 5 --eval-last 0`: no round is on the schedule, yet the run's final
    accuracy must score the model it ends with (round 3), not the untrained round 0."""
    config = _config(rounds=3).replace(training=dataclasses.replace(_config().training, rounds=3, eval_every=5,
                                                                      eval_last=0))
    result = run(config, progress=False, sim=sim)
    evaluated = [h["round"] for h in result.history if h["accuracy"] == h["accuracy"]]
    assert evaluated == [0, 3]
    assert result.summary["final_accuracy"] == result.history[-1]["accuracy"] == result.summary["mean_last_accuracy"]
    assert [r for r in range(1, 151) if Training(rounds=150, eval_every=5, eval_last=10).evaluates(r)] == \
        [*range(5, 141, 5), *range(141, 151)]  # the paper profile's schedule is what it was


def test_the_run_command_reports_the_last_rounds_accuracy(tmp_path, capsys):
    from fedsteer_lib.experiments import cli

    argv = ["run", "--method", "fedavg", "--num-clients", "20", "--gamma", "0.7", "--validation-size", "1000",
            "--rounds", "3", "--eval-every", "5", "--eval-last", "0", "--local-epochs", "1", "--seed", "1",
            "--results", str(tmp_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    import json

    (stored,) = (tmp_path / "runs").glob("*.json")
    last = json.loads(stored.read_text())["history"][-1]
    assert last["round"] == 3 and last["accuracy"] is not None
    assert f"final accuracy (validation split of 1000): {last['accuracy']:.4f} (the model of round 3)" in out, out
