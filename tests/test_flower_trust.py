"""The Flower strategies against a careless or hostile user, in-process (issues 58 and 56):
checkpoints that cannot run code and fail in one line naming the file; a failed save leaves no
temporary file, an unwritable checkpoint path is refused before round 1; for every method, one
node declaring absurd sizes or probabilities or sending huge weights is inactive and changes
nothing; a ruinous server step is skipped; too few rounds for the warm-up are refused; a resume
without the core-set nodes warns; importing and running a strategy change nothing global."""
from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

import fedsteer_lib.flower as fl
from fedsteer_lib.flower.records import Layout
from flower_local import LocalGrid, client_app, tiny_initial, train_tiny

ROOT = Path(__file__).resolve().parent.parent
NODES, ROUNDS, HOSTILE = 4, 4, 1  # partition HOSTILE misbehaves

METHODS = {  # every method, with a warm-up where it has one
    "fedavg": (fl.FedAvg, {}), "fedavg_unbiased": (fl.FedAvgUnbiased, {}), "fedprox": (fl.FedProx, dict(proximal_mu=0.01)),
    "fedsteer": (fl.FedSteer, dict(core_size=2, warmup_rounds=1)), "fedvarp": (fl.FedVARP, dict(warmup_rounds=1)),
    "fedstale": (fl.FedStale, dict(beta=0.5)), "mifa": (fl.MIFA, {}), "scaffold": (fl.Scaffold, {}),
}


def strategy(name: str, **kwargs) -> fl.MethodStrategy:
    cls, params = METHODS[name]
    return cls(**params, fraction_evaluate=0.0, **kwargs)


def flat(record: ArrayRecord) -> torch.Tensor:
    return Layout.of(record).flat(record)


# --- one misbehaving node (issue 58, items 3-6) -------------------------------------------------------
def _huge(arrays: ArrayRecord) -> ArrayRecord:
    return ArrayRecord({k: Array(np.full(arrays[k].shape, 3e38, np.float32)) for k in arrays.keys()})


def _wrong_data(arrays: ArrayRecord) -> ArrayRecord:  # shape fields that lie about the data
    out = {k: arrays[k] for k in arrays.keys()}
    small = Array(np.zeros(3, np.float32))
    out["fc1.weight"] = Array(dtype="float32", shape=tuple(arrays["fc1.weight"].shape), stype=small.stype,
                              data=small.data)
    return ArrayRecord(out)


MISBEHAVIOURS = {  # name -> (how the reply is changed, what the log must say)
    "num-examples=inf": (lambda a, m: (a, {**m, "num-examples": float("inf")}), "num-examples=inf"),  # item 3
    "num-examples=nan": (lambda a, m: (a, {**m, "num-examples": float("nan")}), "num-examples=nan"),
    "num-examples=1e300": (lambda a, m: (a, {**m, "num-examples": 1e300}), "num-examples=1e+300"),  # item 6
    "participation-prob=1e-6": (lambda a, m: (a, {**m, "participation-prob": 1e-6}), "participation-prob=1e-06"),  # 4
    "participation-prob=1e-30": (lambda a, m: (a, {**m, "participation-prob": 1e-30}), "participation-prob=1e-30"),
    "participation-prob=inf": (lambda a, m: (a, {**m, "participation-prob": float("inf")}), "participation-prob=inf"),
    "weights=3e38": (lambda a, m: (_huge(a), m), "update norm"),  # item 5: finite but huge
    "arrays that lie about their shape": (lambda a, m: (_wrong_data(a), m), "unreadable arrays"),
}


def hostile_app(change):
    """The quickstart client, except that partition HOSTILE changes its reply with `change`
    (None: it raises instead, the reference of a node that is simply inactive)."""
    def train(msg: Message, context: Context) -> Message:
        reply = train_tiny(msg, context)
        if int(context.node_config["partition-id"]) != HOSTILE:
            return reply
        if change is None:
            raise RuntimeError("the node fails")
        arrays, metrics = change(reply.content["arrays"], dict(reply.content["metrics"]))
        return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}), reply_to=msg)
    return client_app(train)


_REFERENCE: dict[str, torch.Tensor] = {}


def reference_model(name: str) -> torch.Tensor:
    """The final model of the run in which the hostile node raises instead (once per method)."""
    if name not in _REFERENCE:
        result = strategy(name).start(LocalGrid(hostile_app(None), NODES), tiny_initial(), num_rounds=ROUNDS)
        _REFERENCE[name] = flat(result.arrays)
    return _REFERENCE[name]


@pytest.mark.parametrize("misbehaviour", list(MISBEHAVIOURS))
@pytest.mark.parametrize("name", list(METHODS))
def test_one_misbehaving_node_is_inactive_and_changes_nothing(name, misbehaviour, caplog):
    change, said = MISBEHAVIOURS[misbehaviour]
    grid = LocalGrid(hostile_app(change), NODES)
    s = strategy(name)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = s.start(grid, tiny_initial(), num_rounds=ROUNDS)
    assert s.round == ROUNDS  # the run completed
    node = grid.ids[HOSTILE]
    for entry in s.round_log:  # inactive in every exchange it was sent, with the reason
        if node in entry["sent"]:
            assert node not in entry["replied"] and said in entry["failed"][node], entry
    assert any(f"node {node} is inactive" in r.getMessage() and said in r.getMessage() for r in caplog.records)
    final, initial = flat(result.arrays), flat(tiny_initial())
    assert bool(torch.isfinite(final).all()) and float(final.abs().max()) < 10 * float(initial.abs().max()) + 10
    assert torch.equal(final, reference_model(name))  # exactly as if the node had not replied
    assert s.nodes.examples[s.nodes.slot(node)] == 0 and s.nodes.declared[s.nodes.slot(node)] is None


@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize("server_lr", [float("inf"), float("nan"), 0.0, -1.0, "1"])
def test_server_lr_must_be_a_finite_positive_number(name, server_lr):  # item 6
    with pytest.raises(ValueError, match="server_lr must be a finite number > 0"):
        strategy(name, server_lr=server_lr)


@pytest.mark.parametrize("kwargs", [dict(min_participation=0.0), dict(min_participation=1.5),
                                    dict(max_examples=float("inf")), dict(max_update_ratio=float("nan")),
                                    dict(fraction_train=0.001)])
def test_the_reply_limits_are_checked(kwargs):
    with pytest.raises(ValueError, match="min_participation|max_examples|max_update_ratio"):
        fl.FedAvg(**kwargs)


@pytest.mark.parametrize("name", list(METHODS))
def test_a_step_that_would_ruin_the_model_is_skipped_not_adopted(name, caplog):
    """server_lr = 1e38 multiplies honest updates into a step far beyond the bound (or beyond
    float32): every training round is skipped with a warning and the run completes with w_0."""
    s = strategy(name, server_lr=1e38)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = s.start(LocalGrid(hostile_app(lambda a, m: (a, m)), NODES), tiny_initial(), num_rounds=ROUNDS)
    assert s.round == ROUNDS
    training = [e for e in s.round_log if e["phase"] == "train"]
    assert training and all("skipped" in e for e in training)
    assert torch.equal(flat(result.arrays), flat(tiny_initial()))
    assert any("skipped" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_an_inconsistent_evaluation_reply_does_not_end_the_run():
    """Flower's FedAvg raises on evaluation replies whose metrics differ; here the odd one is
    logged and left out."""
    def evaluate(msg: Message, context: Context) -> Message:
        partition = int(context.node_config["partition-id"])
        metrics = {"num-examples": 10, "acc": 0.5} if partition != HOSTILE else {"num-examples": float("inf")}
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    app = client_app(train_tiny)
    app.evaluate()(evaluate)
    s = fl.FedAvg(fraction_evaluate=1.0, min_evaluate_nodes=NODES)
    result = s.start(LocalGrid(app, NODES), tiny_initial(), num_rounds=2)
    assert s.round == 2 and result.evaluate_metrics_clientapp[2]["acc"] == pytest.approx(0.5)


# --- warm-up rounds (item 8) ------------------------------------------------------------------------------
@pytest.mark.parametrize("rounds", [1, 3, 5])
def test_fewer_rounds_than_the_warmup_are_refused_before_round_1(rounds):
    grid = LocalGrid(client_app(train_tiny), NODES)
    grid.send_and_receive = None  # nothing may be sent
    with pytest.raises(ValueError, match=rf"num_rounds={rounds} must be larger than warmup_rounds=5"):
        fl.FedSteer(core_size=2).start(grid, tiny_initial(), num_rounds=rounds)


def test_the_example_apps_defaults_train():
    config = tomllib.loads((ROOT / "examples" / "flower_app" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert config["config"]["num-server-rounds"] > config["config"]["warmup-rounds"]


# --- checkpoints -----------------------------------------------------------------------------------------
class Payload:
    """A pickle that runs a command when it is loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _checkpoint_run(path: Path, rounds: int = 2) -> fl.MethodStrategy:
    s = fl.FedSteer(core_size=2, warmup_rounds=1, fraction_evaluate=0.0)
    s.start(LocalGrid(client_app(train_tiny), NODES), tiny_initial(), num_rounds=rounds, checkpoint_path=path)
    return s


@pytest.mark.parametrize("how", ["torch.save", "pickle.dump"])
def test_a_malicious_checkpoint_runs_nothing(tmp_path, how):
    marker, path = tmp_path / "pwned", tmp_path / "evil.pt"
    with open(path, "wb") as f:
        if how == "torch.save":
            torch.save({"format": 2, "round": 1, "x": Payload(marker)}, f)
        else:
            pickle.dump({"format": 2, "round": 1, "x": Payload(marker)}, f)
    error = _resume_error(path)
    assert not marker.exists(), "loading the checkpoint ran its payload"
    assert type(error).__name__ == "CheckpointError", repr(error)
    assert str(path) in str(error) and "nothing in it ran" in str(error) and "\n" not in str(error)


def _resume_error(path: Path) -> Exception | None:
    """The exception `start(..., resume_from=path)` raises (None if it raises none)."""
    try:
        fl.FedSteer(core_size=2, warmup_rounds=1, fraction_evaluate=0.0).start(
            LocalGrid(client_app(train_tiny), NODES), tiny_initial(), num_rounds=3, resume_from=path)
    except Exception as err:  # noqa: BLE001 - the test looks at whatever it is
        return err
    return None


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "a folder", "missing", "format 1 pickle",
                                    "another structure"])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path, damage):
    path = tmp_path / "state.pt"
    _checkpoint_run(path)
    data = path.read_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(os.urandom(4096))
    elif damage == "a folder":
        path.unlink()
        path.mkdir()
    elif damage == "missing":
        path.unlink()
    elif damage == "format 1 pickle":  # what the old format held: the strategy's objects
        torch.save({"format": 1, "nodes": fl.NodeTable()}, path)
    else:  # plain data, but not what a checkpoint holds
        from fedsteer_lib.flower import checkpoint as ckpt

        saved = ckpt.load_checkpoint(path)
        saved["nodes"]["ids"] = ["one", "two"]
        ckpt.save_checkpoint(path, saved)
    error = _resume_error(path)
    assert type(error).__name__ == "CheckpointError", repr(error)
    message = str(error)
    assert str(path) in message and "\n" not in message, message
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


def test_a_checkpoint_holds_plain_data_and_resumes(tmp_path):
    from fedsteer_lib.flower import checkpoint as ckpt

    path = tmp_path / "state.pt"
    first = _checkpoint_run(path, rounds=2)
    saved = torch.load(path, weights_only=True)  # the strictest loader torch has
    assert saved["format"] == ckpt.FORMAT and saved["round"] == 2
    assert saved["state"]["dataclass"] == "FedSteerState" and torch.equal(saved["weights"], first.weights)
    sent: list[int] = []

    def recording_grid() -> LocalGrid:
        grid = LocalGrid(client_app(train_tiny), NODES)
        real = grid.send_and_receive

        def send_and_receive(messages, *, timeout=None):
            messages = list(messages)
            sent.extend(int(m.content["config"]["server-round"]) for m in messages)
            return real(messages, timeout=timeout)

        grid.send_and_receive = send_and_receive
        return grid

    again = fl.FedSteer(core_size=2, warmup_rounds=1, fraction_evaluate=0.0)
    again.start(recording_grid(), tiny_initial(), num_rounds=2, resume_from=path)  # nothing left to do
    assert sent == [] and again.round == 2 and again.nodes == first.nodes and again.round_log == first.round_log
    for name in ("core", "basis", "core_norms", "gram", "coords", "last_refresh"):
        assert torch.equal(getattr(again.state, name), getattr(first.state, name)), name
    assert torch.equal(again.weights, first.weights) and again.rng.bit_generator.state == first.rng.bit_generator.state
    resumed = fl.FedSteer(core_size=2, warmup_rounds=1, fraction_evaluate=0.0)
    resumed.start(recording_grid(), tiny_initial(), num_rounds=3, resume_from=path)
    assert set(sent) == {3} and resumed.round == 3  # rounds 1 and 2 are not redone


def test_resuming_without_the_core_set_nodes_is_a_warning(tmp_path, caplog):
    path = tmp_path / "state.pt"
    _checkpoint_run(path, rounds=2)
    with caplog.at_level(logging.INFO, logger="flwr"):
        fl.FedSteer(core_size=2, warmup_rounds=1, fraction_evaluate=0.0).start(
            LocalGrid(client_app(train_tiny), NODES, first_id=5000), tiny_initial(), num_rounds=3, resume_from=path)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("2 of 2 core-set nodes are not connected" in w for w in warnings), warnings


def test_a_failed_save_leaves_no_temporary_file(tmp_path, monkeypatch, caplog):
    from fedsteer_lib.flower import checkpoint as ckpt

    path = tmp_path / "state.pt"
    ckpt.save_checkpoint(path, {"format": ckpt.FORMAT, "round": 1})
    before = path.read_bytes()

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(fl.CheckpointError, match="No space left on device") as err:
        ckpt.save_checkpoint(path, {"format": ckpt.FORMAT, "round": 2})
    assert str(path) in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"] and path.read_bytes() == before
    with caplog.at_level(logging.ERROR, logger="flwr"):  # in a run: logged, the run goes on
        s = _checkpoint_run(path, rounds=3)
    assert s.round == 3 and sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]
    assert any("No space left on device" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("where", ["a folder", "below a file", "an unwritable folder"])
def test_a_checkpoint_path_that_cannot_be_written_is_refused_before_round_1(tmp_path, monkeypatch, where):
    if where == "a folder":
        path = tmp_path / "dir"
        path.mkdir()
    elif where == "below a file":
        (tmp_path / "file").write_text("x")
        path = tmp_path / "file" / "state.pt"
    else:  # root may write anywhere, so the refusal of the folder is simulated
        path = tmp_path / "locked" / "state.pt"
        real_open = os.open

        def refuse(name, *args, **kwargs):
            if Path(name).parent == path.parent:
                raise PermissionError(errno.EACCES, "Permission denied", str(name))
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr(os, "open", refuse)
    grid = LocalGrid(client_app(train_tiny), NODES)
    grid.send_and_receive = None  # nothing may be sent
    with pytest.raises(fl.CheckpointError) as err:
        fl.FedAvg().start(grid, tiny_initial(), num_rounds=2, checkpoint_path=path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert not any(p.name.endswith((".tmp", ".probe")) for p in tmp_path.rglob("*"))


# --- Flower's own loop (issue 56) -------------------------------------------------------------------------
def test_flowers_loop_calls_the_hooks_in_the_order_the_checkpoints_rely_on():
    """`MethodStrategy.start` runs Flower's `Strategy.start` and writes its checkpoint in the
    `evaluate_fn` call, which must stay the last call of each of Flower's rounds: if a new flwr
    orders its loop otherwise, this fails (re-check driver.MethodStrategy.start)."""
    calls: list[tuple[str, int]] = []

    hooks = ("configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate", "evaluate_fn")

    def recorded(hook: str):
        def call(self, server_round, *args):
            calls.append((hook, server_round))
            return getattr(fl.FedAvg, hook)(self, server_round, *args)
        return call

    Recording = type("Recording", (fl.FedAvg,), {hook: recorded(hook) for hook in hooks[:4]})
    Recording(fraction_evaluate=0.0).start(LocalGrid(client_app(train_tiny), NODES), tiny_initial(), num_rounds=2,
                                           evaluate_fn=lambda r, arrays: calls.append(("evaluate_fn", r)))
    assert calls == [("evaluate_fn", 0), *[(hook, r) for r in (1, 2) for hook in hooks]]


# --- nothing global changes (issue 56) --------------------------------------------------------------------
def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "FEDSTEER_KERNELS")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_importing_and_running_a_strategy_changes_nothing_global():
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "flower_local.py")], env=_clean_env(),
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rounds"] == 3
    for when in ("imported", "ran"):
        changed = {k for k in set(got["before"]["env"]) | set(got[when]["env"])
                   if got["before"]["env"].get(k) != got[when]["env"].get(k)}
        assert not changed, f"environment variables changed ({when}): {sorted(changed)}"
        assert {k: got[when][k] for k in ("threads", "mkldnn", "nnpack")} == \
            {k: got["before"][k] for k in ("threads", "mkldnn", "nnpack")}, when
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                           env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert got["capability"] == fresh.stdout.strip()  # torch's own choice for this CPU
    assert got["in_step"] and all(step == [got["before"]["threads"], got["before"]["mkldnn"]] for step in got["in_step"])


def test_the_documented_setting_pins_the_server_step():
    """`numerics.select_kernels("pinned")` first in the process: the server steps run on one
    thread with oneDNN off and AVX2 kernels, as the simulator's; nothing else changes after."""
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "flower_local.py"), "pinned"], env=_clean_env(),
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["capability"] == "AVX2" and got["in_step"] and all(step == [1, False] for step in got["in_step"])
    assert "computing with torch's own kernels" not in out.stderr
    assert [got["ran"][k] for k in ("threads", "mkldnn")] == [got["before"][k] for k in ("threads", "mkldnn")]


def test_importing_fedsteer_lib_flower_sets_no_mkl_branch():
    out = subprocess.run([sys.executable, "-c", "import os, fedsteer_lib.flower; print(os.environ.get('MKL_CBWR'))"],
                         env=_clean_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stdout + out.stderr[-2000:]
