"""Bad command-line input is one clear error before any compute (exit status 2, the message
names the option and what to do), never a traceback or a silent default."""
from __future__ import annotations

import pytest
import torch

from fedsteer_lib.experiments import cli
from fedsteer_lib.experiments.cli_checks import device_problem, results_dir_problem


def _error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("workers", ["0", "-3"])
def test_workers_below_one_is_refused(capsys, workers):
    assert f"--workers must be an integer >= 1 (processes running runs side by side), got {workers}" in _error(
        capsys, "sweep", "--workers", workers)


@pytest.mark.parametrize("device", ["cuda", "cuda:7"])
def test_cuda_without_a_gpu_is_refused_before_any_compute(capsys, monkeypatch, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what this machine reports
    err = _error(capsys, "sweep", "--device", device, "--what", "main")
    assert f"--device '{device}': this machine has no CUDA GPU" in err and "use --device cpu" in err


def test_a_gpu_index_beyond_the_machine_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_problem("cuda:7") == "--device 'cuda:7': this machine has 2 CUDA GPU(s), cuda:0 to cuda:1"
    assert device_problem("cuda:1") is None and device_problem("cuda") is None


def test_a_device_that_is_not_one_is_refused(capsys):
    assert "is not a torch device" in _error(capsys, "status", "--device", "gpu0")
    assert device_problem("cpu") is None


def test_results_pointing_at_a_file_is_refused(capsys, tmp_path):
    target = tmp_path / "results.json"
    target.write_text("{}")
    for command in ("status", "sweep", "tune"):
        assert f"--results {target}: is a file, not a directory" in _error(capsys, command, "--results", str(target))


def test_results_under_a_file_or_unwritable_is_refused(capsys, tmp_path):
    (tmp_path / "a_file").write_text("")
    assert "cannot write results there" in _error(capsys, "sweep", "--results", str(tmp_path / "a_file" / "results"))
    # /sys refuses new directories even to root (chmod would not stop root)
    assert "--results /sys/fedsteer-results: it does not exist and cannot be created: /sys does not let" in _error(
        capsys, "sweep", "--results", "/sys/fedsteer-results")


def test_status_of_a_results_directory_that_does_not_exist_is_refused(capsys, tmp_path):
    assert f"--results {tmp_path / 'nowhere'}: no such directory" in _error(
        capsys, "status", "--results", str(tmp_path / "nowhere"))
    assert not (tmp_path / "nowhere").exists()


def test_a_writable_results_directory_is_accepted(tmp_path):
    assert results_dir_problem(str(tmp_path / "new" / "results")) is None
    assert list(tmp_path.iterdir()) == []  # checking creates nothing
    assert results_dir_problem(str(tmp_path)) is None


@pytest.mark.parametrize("workers", [0, -1, 1.5])
def test_run_grid_refuses_a_worker_count_below_one(workers):
    from fedsteer_lib.experiments.sweep import run_grid

    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        run_grid([], workers=workers)
