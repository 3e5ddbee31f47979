"""Sweeps on Ray (`--executor ray`), on a local Ray instance with 2 CPUs started by the sweep:
a Ray worker killed mid-sweep loses no finished run, the sweep completes (Ray retries the task)
and its results equal the local executor's (one sweep checks both: each Ray start costs seconds);
an address where nothing answers is one clear error."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fedsteer_lib.experiments import cli
from fedsteer_lib.experiments.ray_executor import address_problem
from fedsteer_lib.experiments.results import runs_table
from fedsteer_lib.experiments.sweep import run_grid

import ray  # noqa: F401  (pinned in requirements.txt: the set-up installs it)

GRID = textwrap.dedent("""
    from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, method
    CONFIGS = [RunConfig(method=method(m), system=FLSystem(num_clients=20, gamma=0.7, validation_size=1000), seed=s,
                         training=Training(rounds=3, local_epochs=1, eval_every=3, eval_last=1))
               for s in (0, 1) for m in ("fedavg", "fedvarp", "mifa", "fedavg_unbiased")]
""")
COLUMNS = ["key", "label", "seed", "final_accuracy", "final_loss", "collapsed"]


def _configs():
    scope: dict = {}
    exec(GRID, scope)
    return scope["CONFIGS"]


@pytest.fixture(scope="module")
def local_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("local")
    assert run_grid(_configs(), root, workers=2, progress=False) == len(_configs())
    return runs_table(_configs(), root)[COLUMNS]


def _ray_task_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "ray::_compute"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_a_ray_sweep_with_a_worker_killed_loses_no_run_and_equals_the_local_executor(tmp_path, local_results):
    script = tmp_path / "sweep.py"
    script.write_text(GRID + textwrap.dedent("""
        import sys
        from fedsteer_lib.experiments.sweep import run_grid
        run_grid(CONFIGS, sys.argv[1], workers=2, executor="ray", progress=False)
    """))
    root = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, str(script), str(root)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    runs = root / "runs"
    deadline, killed, finished_before = time.time() + 600, None, {}
    while time.time() < deadline and killed is None and proc.poll() is None:
        done = list(runs.glob("[0-9a-f]*.json")) if runs.exists() else []
        pids = _ray_task_pids()
        if 1 <= len(done) < 6 and pids:  # 8 runs: a task is still running for several results after the first
            finished_before = {p: p.stat().st_mtime_ns for p in done}
            os.kill(pids[0], signal.SIGKILL)
            killed = pids[0]
        time.sleep(0.1)
    assert killed is not None, "no Ray task was running between the first and the last result"
    assert proc.wait(timeout=900) == 0
    assert not list(runs.glob(".tmp-*"))  # no partial file
    for p, mtime in finished_before.items():  # finished runs were kept as they were
        assert p.stat().st_mtime_ns == mtime
    assert runs_table(_configs(), root)[COLUMNS].equals(local_results)  # Ray's results are the local executor's
    assert run_grid(_configs(), root, workers=2, executor="ray", progress=False) == 0  # cached runs are never sent


def test_an_address_where_no_ray_cluster_answers_is_one_clear_error(capsys):
    assert address_problem("127.0.0.1:1", timeout=2).startswith("--address 127.0.0.1:1: no Ray cluster answers there")
    assert "expected auto, host:port or ray://host:port" in address_problem("nowhere")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sweep", "--executor", "ray", "--address", "ray://127.0.0.1:1"])
    assert exit_info.value.code == 2
    assert "no Ray cluster answers there" in capsys.readouterr().err


def test_gpu_fractions_and_addresses_need_the_ray_executor(capsys):
    for argv in (["--gpus-per-run", "0.25"], ["--address", "auto"]):
        with pytest.raises(SystemExit):
            cli.main(["sweep", *argv])
        assert "go with --executor ray" in capsys.readouterr().err
    with pytest.raises(ValueError, match="gpus_per_run must be in"):
        run_grid([], executor="ray", gpus_per_run=2)
