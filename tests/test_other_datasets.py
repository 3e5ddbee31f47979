"""EMNIST and CIFAR-10 (paper §4.1) are not on this machine: their paper-profile configurations
are run end to end, at a tiny scale, on synthetic files written in the real on-disk formats."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fedsteer_lib.simulator import data
from fedsteer_lib.experiments.config import FLSystem
from fedsteer_lib.simulator.models import num_parameters, build_model
from fedsteer_lib.experiments.results import load_run
from fedsteer_lib.experiments.groups import paper_grid
from fedsteer_lib.experiments.sweep import run_grid
from test_data import emnist_names, make_cifar, make_mnist_like

ROOT = Path(__file__).resolve().parent.parent
TINY = FLSystem(num_clients=6, gamma=0.5, points_scale=3)  # 3 common + 3 rare clients, 6 points each


def _with(spec, **changes):
    return replace(spec, params=tuple(sorted({**dict(spec.params), **changes}.items())))


def _write(name: str, folder: Path) -> None:
    if name == "emnist":
        make_mnist_like(folder, emnist_names("balanced"), gz=True, num_classes=47, n_train=600, n_test=40)
    else:
        make_cifar(folder / "cifar-10-batches-py", n=60)  # 300 training, 60 test images


@pytest.mark.parametrize("name, classes, params", [("emnist", 47, 1_822_255), ("cifar10", 10, 11_171_146)])
def test_paper_profile_runs_end_to_end_on_synthetic_files(tmp_path, monkeypatch, name, classes, params):
    _write(name, tmp_path / "data")
    monkeypatch.setenv("FEDSTEER_DATA", str(tmp_path / "data"))
    data._read_folder.cache_clear()
    configs = paper_grid(name)
    assert len(configs) == 14 * 2 * 8  # every method, both gammas, 8 seeds
    steer = [c for c in configs if c.method.name == "fedsteer" and c.seed == 0 and c.system.gamma == 0.9]
    assert [(c.method.get("core_size"), c.method.get("lam")) for c in steer] == [(10, 0.5), (10, 0.5)]
    assert steer[0].training.rounds == 150 and steer[0].method.get("warmup_cycles") == 5
    assert num_parameters(build_model(name, classes, 3 if name == "cifar10" else 1)) == params
    # The same configurations at a tiny scale: 6 clients, a core set of 2, 2 rounds, 1 warm-up cycle.
    tiny = [replace(c, system=TINY, training=replace(c.training, rounds=2, eval_every=1, eval_last=1),
                    method=_with(c.method, core_size=2, warmup_cycles=1) if c.method.name == "fedsteer" else c.method)
            for c in configs if c.seed == 0 and c.system.gamma == 0.9 and c.method.name in ("fedsteer", "fedvarp")]
    assert run_grid(tiny, tmp_path / "results", progress=False) == 3
    for c in tiny:
        result = load_run(c, tmp_path / "results")
        assert result["summary"]["num_params"] == params and result["summary"]["rounds_done"] == 2
        assert torch.isfinite(torch.tensor([h["loss"] for h in result["history"]])).all()
    data._read_folder.cache_clear()


def _sweep_without_data(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m fedsteer_lib sweep ARGS` with an empty data folder and downloads off."""
    env = {**os.environ, "FEDSTEER_DATA": str(tmp_path)}
    env.pop("FEDSTEER_ALLOW_DOWNLOAD", None)
    return subprocess.run([sys.executable, "-m", "fedsteer_lib", "sweep", *args, "--results", str(tmp_path / "results")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name, missing_file", [("emnist", "emnist-balanced-train-images-idx3-ubyte"),
                                                ("cifar10", "data_batch_1")])
def test_sweep_without_the_data_says_how_to_get_it(tmp_path, name, missing_file):
    proc = _sweep_without_data(tmp_path, "--dataset", name, "--profile", "paper")
    assert proc.returncode == 1, proc.stderr
    assert missing_file in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists()
    assert "client-batch" not in proc.stderr  # the CPU note below only when it applies


def test_client_batch_on_a_cpu_says_it_is_slower(tmp_path):
    """The note comes before any work (here the run stops at the missing EMNIST data)."""
    proc = _sweep_without_data(tmp_path, "--dataset", "emnist", "--device", "cpu", "--client-batch", "8")
    assert proc.returncode == 1
    assert "--client-batch > 1" in proc.stderr and "slower" in proc.stderr
    assert (ROOT / "data/results/bench/cpu_batching.json").is_file()  # the measurement the note names
