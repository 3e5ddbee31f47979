"""FedSteer and the baselines as Flower strategies (fedsteer_lib.flower), against Flower itself.

- One Flower simulation (Ray) runs, one after the other on the same six nodes: every method with
  a quickstart-style ClientApp (a small MLP that is none of ours) whose node 1 raises in rounds 2
  and 4; Flower's own FedAvg with that client; and the engine-equivalence harness
  (`fedsteer_lib.flower.replay`): five methods on a small Fashion-MNIST federation with the
  engine's participation draws replayed, which must end each round with the engine's model.
- In-process runs on a small in-process Grid (Flower's Grid interface over a ClientApp called in
  this process): sampling, late joins and departures, and a ServerApp killed (SIGKILL) mid-run and
  resumed from its checkpoint, which must end with the uninterrupted run's model.
- A deployment on 127.0.0.1 with Flower's commands, secured with TLS and SuperNode authentication
  (a SuperLink, three registered SuperNodes, `flwr run` on examples/flower_app): a SuperNode with
  an unregistered key is refused, and one SuperNode is killed mid-run: the run completes.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

import fedsteer_lib.flower as fl
from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, method
from fedsteer_lib.flower import launch, replay
from fedsteer_lib.flower.checkpoint import load_checkpoint
from fedsteer_lib.flower.credentials import CA_CERT, node_key, write_credentials
from fedsteer_lib.flower.records import Layout
from fedsteer_lib.simulator import engine
from flower_local import FLAKY_ROUNDS, LocalGrid, quickstart, quickstart_train, tiny_initial

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "flower_app"
NUM_NODES = 6

QS_ROUNDS = 5

QS_STRATEGIES = {  # name -> (class, arguments)
    "fedsteer": (fl.FedSteer, dict(core_size=3, warmup_rounds=2)),
    "fedavg": (fl.FedAvg, {}), "fedavg_unbiased": (fl.FedAvgUnbiased, {}), "fedvarp": (fl.FedVARP, {}),
    "fedstale": (fl.FedStale, dict(beta=0.5)), "mifa": (fl.MIFA, {}), "scaffold": (fl.Scaffold, {}),
    "fedprox": (fl.FedProx, dict(proximal_mu=0.01)),
}

# --- the engine-equivalence harness ---------------------------------------------------------------
SYSTEM = FLSystem(num_clients=NUM_NODES, gamma=0.5, weak_prob=0.5, powerful_prob=0.8, validation_size=1000)
TRAINING = Training(rounds=4, local_epochs=1, batch_size=32, client_lr=0.05, eval_every=4, eval_last=1)
ENGINE_METHODS = [method("fedsteer", core_size=3, warmup_cycles=2), method("fedavg_unbiased"),
                  method("mifa", start="wait_all"), method("scaffold"), method("fedprox")]


def engine_config(spec) -> RunConfig:
    return RunConfig(method=spec, system=SYSTEM, training=TRAINING, seed=1, batch_stream="per_client")


ENGINE_CLIENT = replay.engine_client_app(engine_config(method("fedavg")))  # the data part is the same for all

# One ClientApp for the whole simulation: the engine harness's messages carry config["harness"].
simulated = ClientApp()


@simulated.train()
def _route_train(msg: Message, context: Context) -> Message:
    if msg.content["config"].get("harness") == "engine":
        return ENGINE_CLIENT(msg, context)
    return quickstart_train(msg, context)


@simulated.query()
def _route_query(msg: Message, context: Context) -> Message:
    return ENGINE_CLIENT(msg, context)


class Recorder:
    """An evaluate_fn that keeps the global model after every training round (flat)."""

    def __init__(self) -> None:
        self.models: dict[int, torch.Tensor] = {}

    def __call__(self, server_round: int, arrays: ArrayRecord) -> None:
        self.models[server_round] = Layout.of(arrays).flat(arrays)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread for this module's engine runs and the server in this process, as Ray gives
    each simulated client (float sums, and so a model's last bits, depend on the thread count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def simulation(one_thread):
    """Every Flower run of this module's simulation, by name: (strategy, Result, Recorder)."""
    from flwr.simulation import run_simulation

    runs: dict[str, tuple] = {}
    plan = [(name, cls(fraction_evaluate=0.0, **kw), tiny_initial(), QS_ROUNDS, ConfigRecord())
            for name, (cls, kw) in QS_STRATEGIES.items()]
    plan.append(("fedavg_unbiased_observed", fl.FedAvgUnbiased(fraction_evaluate=0.0, participation="observed"),
                 tiny_initial(), QS_ROUNDS, ConfigRecord()))
    plan.append(("flower_fedavg", FlowerFedAvg(fraction_evaluate=0.0), tiny_initial(), QS_ROUNDS, ConfigRecord()))
    federation = engine.prepare(engine_config(ENGINE_METHODS[0])).federation  # the same for every method
    for spec in ENGINE_METHODS:
        config = engine_config(spec)
        strategy = replay.replay_strategy(config, federation)
        plan.append((f"engine-{spec.name}", strategy, replay.initial_arrays(config),
                     strategy.warmup_rounds + TRAINING.rounds, ConfigRecord({"harness": "engine"})))
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        for name, strategy, initial, rounds, train_config in plan:
            recorder = Recorder()
            result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, train_config=train_config,
                                    evaluate_fn=recorder)
            runs[name] = (strategy, result, recorder)

    run_simulation(server_app=app, client_app=simulated, num_supernodes=NUM_NODES,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False}})
    assert set(runs) == {p[0] for p in plan}, f"runs that did not finish: {sorted({p[0] for p in plan} - set(runs))}"
    return runs


def flaky_node(strategy: fl.MethodStrategy) -> int:
    """The node id of partition FLAKY: the one whose replies failed."""
    failed = {n for entry in strategy.round_log for n in entry["failed"]}
    assert len(failed) == 1, f"expected one failing node, got {failed}"
    return failed.pop()


@pytest.mark.parametrize("name", list(QS_STRATEGIES))
def test_a_quickstart_app_survives_a_flaky_node_under_every_method(simulation, name):
    strategy, result, _ = simulation[name]
    assert strategy.round == QS_ROUNDS  # the run completed
    node = flaky_node(strategy)
    for entry in strategy.round_log:
        if entry["round"] in FLAKY_ROUNDS:  # inactive in exactly its failing rounds, and the round went on
            assert node in entry["sent"] and node not in entry["replied"], entry
            assert entry["failed"][node].startswith("error:") and "fails in round" in entry["failed"][node]
            assert len(entry["replied"]) == NUM_NODES - 1
        else:
            assert node in entry["replied"], entry
    for r in range(strategy.warmup_rounds + 1, QS_ROUNDS + 1):  # every training round used the replies it got
        expected = NUM_NODES - (r in FLAKY_ROUNDS)
        assert result.train_metrics_clientapp[r]["num-active"] == expected
    initial, final = Layout.of(tiny_initial()).flat(tiny_initial()), Layout.of(result.arrays).flat(result.arrays)
    assert bool(torch.isfinite(final).all()) and float((final - initial).abs().max()) > 1e-3  # the model moved


def test_fedsteer_warmup_says_what_it_saw(simulation):
    strategy, _, _ = simulation["fedsteer"]
    # warm-up round 2 is cycle 1, which the flaky node misses: selection from 5 of 6 nodes
    assert strategy.warmup_report == {"cycles": 2, "last_cycle_complete": False, "nodes_answered_last_cycle": 5,
                                      "nodes_known": 6, "nodes_answered_ever": 6}
    assert strategy.state.core.numel() == 3


def test_our_fedavg_equals_flowers_fedavg_under_full_participation(simulation):
    ours = simulation["fedavg"][1].arrays
    flowers = simulation["flower_fedavg"][1].arrays
    diff = float((Layout.of(ours).flat(ours) - Layout.of(flowers).flat(flowers)).abs().max())
    print(f"max abs difference, our FedAvg vs Flower's FedAvg: {diff:.3g}")
    assert diff <= 1e-6


def test_observed_participation_rates(simulation):
    strategy, _, _ = simulation["fedavg_unbiased_observed"]
    slot = strategy.nodes.slot(flaky_node(strategy))
    assert strategy.nodes.observed_rate(slot) == pytest.approx(3 / 5)  # replied in 3 of 5 training rounds
    assert float(strategy._context().probs[slot]) == pytest.approx(0.6)
    others = [s for s in range(NUM_NODES) if s != slot]
    assert all(strategy.nodes.observed_rate(s) == 1.0 for s in others)
    declared = simulation["fedavg_unbiased"][0]
    assert float(declared._context().probs[slot]) == 1.0  # declared: fraction_train, whatever it did


@pytest.mark.parametrize("index", range(len(ENGINE_METHODS)), ids=[m.name for m in ENGINE_METHODS])
def test_flower_equals_the_engine_round_by_round(simulation, index):
    config = engine_config(ENGINE_METHODS[index])
    strategy, _, recorder = simulation[f"engine-{config.method.name}"]
    expected = engine_models(config)
    got = [recorder.models[strategy.warmup_rounds + t + 1] for t in range(TRAINING.rounds)]
    diffs = [float((g - w).abs().max()) for g, w in zip(got, expected)]
    print(f"{config.method.name}: max abs difference to the engine per round {diffs}")
    assert max(diffs) == 0.0, diffs  # bit for bit: the same Strategy, the same kernels
    w0 = Layout.of(replay.initial_arrays(config)).flat(replay.initial_arrays(config))
    assert any(not torch.equal(w, w0) for w in expected)  # the models moved


def test_the_draws_are_the_engines(simulation):
    config = engine_config(ENGINE_METHODS[1])
    strategy, _, _ = simulation[f"engine-{config.method.name}"]
    result = engine.run(config, progress=False)
    partition = {node: i for i, node in enumerate(strategy._partition_nodes)}
    sent = [sorted(partition[n] for n in e["sent"]) for e in strategy.round_log if e["phase"] == "train"]
    assert sent == result.extras["participation"]


def test_mifa_wait_all_trained_its_forced_clients(simulation):
    strategy, _, _ = simulation["engine-mifa"]
    assert strategy.state.table_ready  # every client's update reached the table via `observe`
    assert any(e["phase"] == "forced" for e in strategy.round_log)


def engine_models(config: RunConfig) -> list[torch.Tensor]:
    """The engine's global model after each round (its `_round`'s return values)."""
    models = []
    real_round = engine._round

    def recording(*args, **kwargs):
        weights = real_round(*args, **kwargs)
        models.append(weights.clone())
        return weights

    engine._round = recording
    try:
        engine.run(config, progress=False)
    finally:
        engine._round = real_round
    return models


def test_the_harness_refuses_the_shared_stream():
    config = engine_config(method("fedavg")).replace(batch_stream="shared")
    with pytest.raises(ValueError, match="per_client"):
        replay.replay_strategy(config, federation=None)  # refused before the federation is read


# --- in-process runs -------------------------------------------------------------------------------
def test_each_node_is_sampled_with_its_own_probability():
    strategy = fl.FedAvgUnbiased(fraction_train=0.3, min_train_nodes=0, seed=3)
    for node, declared in zip(range(10, 14), (None, 0.1, 0.5, 0.9)):
        slot = strategy.nodes.add(node, 1)
        strategy.nodes.declared[slot] = declared
    counts = np.zeros(4)
    for r in range(4000):
        for n in strategy.sample(r, [10, 11, 12, 13]):
            counts[n - 10] += 1
    assert np.allclose(counts / 4000, [0.3, 0.1, 0.5, 0.9], atol=0.03)
    topped = fl.FedAvg(fraction_train=0.01, min_train_nodes=2, seed=3)
    for node in range(4):
        topped.nodes.add(node, 1)
    assert all(len(topped.sample(r, [0, 1, 2, 3])) >= 2 for r in range(50))


def test_nodes_join_late_and_leave():
    grid = LocalGrid(quickstart, 5)
    late, leaving = grid.ids[4], grid.ids[3]
    grid.down.add(late)
    strategy = fl.FedSteer(core_size=2, warmup_rounds=1, fraction_evaluate=0.0)

    def evaluate(server_round: int, arrays: ArrayRecord) -> None:
        if server_round == 2:
            grid.down.discard(late)  # joins for round 3
            grid.down.add(leaving)  # leaves for round 3 on
        if server_round == 3:
            slot = strategy.nodes.slot(late)
            assert strategy.state.coords.shape[0] == 5  # its state grew with it ...
            assert strategy.nodes.joined[slot] == 3 and strategy.nodes.replied[slot] == 1  # ... and it trained

    result = strategy.start(grid, tiny_initial(), num_rounds=4, evaluate_fn=evaluate)
    assert strategy.round == 4 and result.arrays
    assert strategy.warmup_report["nodes_known"] == 4  # the warm-up saw the four nodes connected then
    by_round = {e["round"]: e for e in strategy.round_log}
    assert late not in by_round[2]["sent"] and late in by_round[3]["replied"]
    assert leaving in by_round[2]["replied"] and leaving not in by_round[3]["sent"] + by_round[4]["sent"]
    slot = strategy.nodes.slot(leaving)
    assert bool(strategy.state.coords[slot].abs().sum() > 0)  # a node that left keeps its coordinates


def test_a_node_that_vanishes_in_flight_is_inactive():
    grid = LocalGrid(quickstart, 4)
    real = grid.send_and_receive

    def lossy(messages, *, timeout=None):  # node 2's replies never arrive (timed out)
        return [r for r in real(messages, timeout=timeout) if r.metadata.src_node_id != grid.ids[2]]

    grid.send_and_receive = lossy
    strategy = fl.FedVARP(fraction_evaluate=0.0)
    strategy.start(grid, tiny_initial(), num_rounds=2)
    assert all(e["failed"][grid.ids[2]] == "no reply" for e in strategy.round_log)
    assert float(strategy.state.h[strategy.nodes.slot(grid.ids[2])].abs().sum()) == 0  # never seen: h_i = 0


RESUME_ROUNDS, RESUME_EVERY, RESUME_BLOCK = 6, 2, 5  # checkpoints after rounds 2 and 4; killed in round 5


def resume_strategy() -> fl.FedSteer:
    return fl.FedSteer(core_size=2, warmup_rounds=1, fraction_train=0.6, min_train_nodes=1, fraction_evaluate=0.0,
                       seed=5)


def _final(result) -> torch.Tensor:
    return Layout.of(result.arrays).flat(result.arrays)


def test_a_killed_serverapp_resumes_to_the_uninterrupted_model(tmp_path):
    """The ServerApp's work (`start` on a LocalGrid) runs in a forked child process, which hangs in
    round 5 and is killed with SIGKILL (no chance to save on exit); a new strategy resumes from the
    checkpoint on disk and must end with the uninterrupted run's model, bit for bit."""
    checkpoint, marker = tmp_path / "state.pt", tmp_path / "blocked"
    expected = _final(resume_strategy().start(LocalGrid(quickstart, 4), tiny_initial(), num_rounds=RESUME_ROUNDS))

    child = os.fork()
    if child == 0:  # the doomed ServerApp
        try:
            resume_strategy().start(LocalGrid(quickstart, 4, block_round=RESUME_BLOCK, marker=marker), tiny_initial(),
                                    num_rounds=RESUME_ROUNDS, checkpoint_path=checkpoint, checkpoint_every=RESUME_EVERY)
        finally:
            os._exit(1)
    deadline = time.monotonic() + 60
    while not marker.exists():  # it hangs in round 5, after the checkpoint of round 4
        assert os.waitpid(child, os.WNOHANG) == (0, 0), "the first ServerApp ended before round 5"
        assert time.monotonic() < deadline, "the first ServerApp did not reach round 5 within 60 s"
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    assert load_checkpoint(checkpoint)["round"] == 4  # the every-K checkpoint; round 5's draws died with it

    final = _final(resume_strategy().start(LocalGrid(quickstart, 4), tiny_initial(), num_rounds=RESUME_ROUNDS,
                                           checkpoint_path=checkpoint, checkpoint_every=RESUME_EVERY,
                                           resume_from=checkpoint))
    print(f"resumed vs uninterrupted: max abs difference {float((final - expected).abs().max()):.3g}")
    assert torch.equal(final, expected)
    assert load_checkpoint(checkpoint)["round"] == RESUME_ROUNDS  # and saved when start ended


def test_resume_refuses_another_strategy(tmp_path):
    strategy = fl.FedAvg(fraction_evaluate=0.0)
    strategy.start(LocalGrid(quickstart, 3), tiny_initial(), num_rounds=1, checkpoint_path=tmp_path / "s.pt")
    with pytest.raises(ValueError, match="another strategy or other settings"):
        fl.FedAvg(fraction_evaluate=0.0, server_lr=0.5).start(LocalGrid(quickstart, 3), tiny_initial(), num_rounds=2,
                                                             resume_from=tmp_path / "s.pt")


# --- a deployment on 127.0.0.1 ------------------------------------------------------------------------
DEPLOYMENT_RUN = {"method": "fedsteer", "num-server-rounds": 3, "warmup-rounds": 1, "core-size": 2,
                  "fraction-train": 1.0, "central-eval": False, "samples-per-node": 200, "round-timeout": 30.0}


def test_flwr_run_against_a_local_deployment_with_a_node_killed_mid_run(tmp_path):
    """The secure deployment of the book page: TLS and SuperNode authentication."""
    try:
        launch.free_port()
    except launch.PortsUnavailable as err:
        pytest.skip(f"a local deployment needs TCP ports on 127.0.0.1: {err}")
    run_config = {**DEPLOYMENT_RUN, "out-dir": str(tmp_path / "out"), "partitions-dir": str(tmp_path / "parts"),
                  "checkpoint-path": str(tmp_path / "state.pt")}
    with launch.LocalFederation(tmp_path / "federation", num_nodes=3) as fed:
        assert "https://127.0.0.1" in fed.log("superlink.log")  # TLS
        rogue = write_credentials(tmp_path / "rogue", 1)  # a key the SuperLink was never told of
        with open(tmp_path / "rogue.log", "w") as out:  # a file, not a pipe: its SuperExec child outlives it
            rogue_node = subprocess.Popen(["flower-supernode", "--root-certificates", str(fed.folder / CA_CERT),
                                           "--auth-supernode-private-key", str(rogue / node_key(0)), "--superlink",
                                           f"127.0.0.1:{fed.port}", "--port", str(launch.free_port()),
                                           "--max-retries", "1"], env=fed.env, cwd=tmp_path, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        try:
            refused = rogue_node.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rogue_node.pid, signal.SIGKILL)
        said = (tmp_path / "rogue.log").read_text()
        assert refused != 0 and "Failed to activate SuperNode" in said, said  # not registered: not admitted
        run = fed.start_run(APP, run_config)
        deadline = time.monotonic() + 300
        while not (tmp_path / "state.pt").exists() or load_checkpoint(tmp_path / "state.pt")["round"] < 2:
            assert run.poll() is None, f"the run ended before round 2:\n{fed.log()[-3000:]}"
            assert time.monotonic() < deadline, f"no round 2 within 300 s:\n{fed.log()[-3000:]}"
            time.sleep(0.2)
        fed.kill_node(2)  # SIGKILL: SuperNode 2 and its ClientApp die without a word
        assert run.wait(timeout=300) == 0, fed.log()[-3000:]
        killed = int(re.search(r"SuperNode ID: (\d+)", fed.log("supernode-2.log")).group(1))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rounds"] == 3, fed.log()[-3000:]  # the run completed
    rounds = summary["round_log"]
    why = [(e["round"], e["failed"]) for e in rounds]
    assert all(killed in e["replied"] for e in rounds[:2]), why  # it trained before it was killed ...
    assert str(killed) in rounds[2]["failed"] and rounds[2]["replied"], rounds  # ... then was inactive
    final = torch.load(tmp_path / "out" / "final_model.pt")
    assert final["fc2.bias"].abs().sum() > 0 and all(bool(torch.isfinite(v).all()) for v in final.values())


def test_the_book_page_shows_the_deployment_commands_the_test_runs():
    page = (ROOT / "book" / "flower.md").read_text()
    lines, connection = launch.shell_commands(app="examples/flower_app", num_nodes=3, run_config=DEPLOYMENT_RUN)
    sim_lines, sim_connection = launch.shell_commands(app="examples/flower_app", num_nodes=10, simulation=True)
    sim_section = sim_connection.split("\n\n", 1)[1]  # [superlink.local-simulation] and its keys
    for line in [*lines, *connection.splitlines(), *sim_lines, *sim_section.splitlines()]:
        assert line in page, f"book/flower.md lacks the line: {line}"
    assert not any("insecure" in line for line in [*lines, *connection.splitlines()])  # the deployment is secure
    for section in re.split(r"\n(?=#)", page):  # --insecure only under a heading that says local only
        if "insecure" in section:
            assert "local only" in section.splitlines()[0], section.splitlines()[0]
    included = re.findall(r"```\{literalinclude\} (\S+)", page)
    assert (ROOT / "book" / "../examples/flower_app/fedsteer_app/server_app.py").resolve() in \
        [(ROOT / "book" / p).resolve() for p in included]
