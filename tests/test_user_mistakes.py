"""A user's mistake is one clear line, never a traceback, found before anything computes (issue 58).

The probes of issue 58's items 13 and 15 as a careless user would make them: on the command line
(data-dependent settings, seeds and sizes that cannot work, a bad $FEDSTEER_KERNELS, a results
path that cannot be written, a full disk, Ctrl-C), in a notebook's `setup()` (the one line is
the first thing the failing cell shows) and in `doctor` run by a user who may not look into the
checkout."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsteer_lib.experiments import cli, results

REPO = Path(__file__).resolve().parents[1]
TINY = ["--method", "fedavg", "--num-clients", "20", "--gamma", "0.9", "--validation-size", "1000", "--local-epochs", "1"]


def _one_line(capsys, *argv: str, code: int = 2) -> str:
    """The CLI's error for `argv`: exit status `code`, one line on stderr, no traceback."""
    with pytest.raises(SystemExit) as info:
        cli.main(list(argv))
    err = capsys.readouterr().err
    assert info.value.code == code, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def _cli(*argv: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedsteer_lib", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


# --- 13. the command line -----------------------------------------------------------------------------
@pytest.mark.parametrize("option, message", [
    (["--validation-size", "70000"], "validation_size must be < 60000 (the training pool), got 70000"),
    (["--points-scale", "100000"], "the common-label group needs 9999990 points but the pool has only 30000"),
    (["--num-clients", "1000000"], "the common-label group needs 49500000 points but the pool has only 30000 "
                                   "(num_clients=1000000; fmnist has 60,000 training images)"),
])
def test_settings_the_data_set_cannot_hold_are_one_line(capsys, no_compute, tmp_path, option, message):
    args = ["run", "--method", "fedavg", "--results", str(tmp_path)]
    err = _one_line(capsys, *(args[:3] + option + args[3:]))
    assert message in err, err


@pytest.mark.parametrize("option, message", [
    (["--seed", str(2**64)], "--seed must be an integer in [0, 2**64), got 18446744073709551616 (torch's "
                             "generators take 64-bit seeds)"),
    (["--rounds", "1000000000"], "--rounds 1,000,000,000 with 100 clients needs about 1,791.9 GiB"),
    (["--rounds", "1e20"], "rounds must be an integer >= 1, got 1e+20"),
    (["--rounds", str(10**20)], "--rounds 100,000,000,000,000,000,000 with 100 clients needs about"),
])
def test_seeds_and_sizes_that_cannot_work_are_one_line(capsys, no_compute, tmp_path, option, message):
    err = _one_line(capsys, "run", "--method", "fedavg", *option, "--results", str(tmp_path))
    assert message in err, err


def test_a_run_too_large_for_the_memory_gives_the_numbers():
    from fedsteer_lib.experiments.cli_checks import run_size_problem

    assert run_size_problem(150, 100, memory=2**30) is None
    problem = run_size_problem(10**6, 100, memory=2**30)
    assert problem == ("--rounds 1,000,000 with 100 clients needs about 1.8 GiB for its participation schedule and "
                       "history alone (1,000,000 rounds x (100 clients x 9 bytes + 1024 bytes)), more than half of "
                       "this machine's 1.0 GiB of memory")


def test_a_bad_fedsteer_kernels_breaks_neither_doctor_nor_help_and_kernels_overrides_it(tmp_path):
    bogus = {"FEDSTEER_KERNELS": "bogus"}
    for argv in (["--help"], ["run", "--help"], ["doctor"]):
        proc = _cli(*argv, env=bogus)
        assert "Traceback" not in proc.stderr and "NumericsError" not in proc.stderr, (argv, proc.stderr)
        assert proc.returncode in (0, 1) and proc.stdout, (argv, proc.stderr)  # doctor: 1 when a prerequisite lacks
    proc = _cli("run", *TINY, "--rounds", "1", "--results", str(tmp_path), env=bogus)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "python -m fedsteer_lib: error: FEDSTEER_KERNELS='bogus' is not a kernel mode: set it to pinned or native, "
        "unset it (pinned), or pass --kernels, which overrides it"), proc.stderr
    assert not (tmp_path / "runs").exists()
    proc = _cli("run", *TINY, "--rounds", "1", "--eval-every", "1", "--results", str(tmp_path), "--kernels", "native",
                env=bogus)
    assert proc.returncode == 0 and "(computed now)" in proc.stdout and "native kernels" in proc.stdout, proc.stderr


def test_a_dangling_symlink_as_results_is_one_line(capsys, no_compute, tmp_path):
    link = tmp_path / "results"
    link.symlink_to(tmp_path / "gone")
    for argv in (["sweep", "--profile", "quick", "--what", "main"], ["run", "--method", "fedavg"],
                 ["status", "--profile", "quick"]):
        for results_dir in (link, link / "below"):
            err = _one_line(capsys, *argv, "--results", str(results_dir))
            assert err.endswith(f"--results {results_dir}: {link} is a symbolic link to {tmp_path / 'gone'}, which "
                                f"does not exist"), err
    assert not (tmp_path / "gone").exists()


def test_a_full_disk_is_found_before_computing(capsys, no_compute, tmp_path, monkeypatch):
    real = os.statvfs

    class Full:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, 1

    monkeypatch.setattr(results.os, "statvfs", lambda path: Full(real(path)))
    assert cli.main(["run", *TINY, "--rounds", "1", "--results", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cache problem: {tmp_path}: its disk is full (0.0 MiB free") and len(err.splitlines()) == 1


def test_a_full_disk_at_save_is_one_line(capsys, tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.os, "fsync", full)
    assert cli.main(["run", *TINY, "--rounds", "1", "--eval-every", "1", "--results", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    lines = [line.strip() for line in err.replace("\r", "\n").splitlines() if line.strip()]
    last = lines[-1]  # the lines before it are the run's progress bar (tqdm rewrites its one line)
    assert "Traceback" not in err and all(line.startswith("fedavg: ") for line in lines[:-1]), err
    assert last.startswith("error: the result of run ") and ": No space left on device; the runs saved before it" in last
    assert list((tmp_path / "runs").glob("*.json")) == [] and list((tmp_path / "runs").glob(".tmp-*")) == []


def test_ctrl_c_during_a_run_is_one_line_saying_what_was_saved(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "fedsteer_lib", "run", *TINY, "--rounds", "200", "--kernels",
                             "native", "--results", str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            # as a shell starts it: Ctrl-C's default action (an ignored SIGINT, which a test
                            # process may have from an earlier test, would be inherited and stay ignored)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = proc.stdout.readline()
        assert first.startswith("computing run "), first + proc.stderr.read()
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (f"interrupted (Ctrl-C): 0 of the 1 runs to compute were finished and are saved in "
                           f"{tmp_path}; the run(s) in progress were not saved, nothing else is lost; the same "
                           f"command computes only what is still missing"), err
    assert list((tmp_path / "runs").glob("*.json")) == []


# --- 15. doctor as a user who may not look into the checkout ---------------------------------------------
DOCTOR_AS_ANOTHER_USER = """
import os, sys
from pathlib import Path
from fedsteer_lib.experiments import doctor
doctor.VENV_PY = Path(sys.argv[1]) / "bin" / "python"
doctor.MATHJAX = Path(sys.argv[1]) / "tex-chtml.js"
if os.geteuid() == 0:  # root may look everywhere: become nobody, for whom the folder is closed
    os.setgid(65534)
    os.setuid(65534)
sys.exit(doctor.report(doctor.checks()[:4]))
"""


def test_doctor_as_a_user_who_cannot_look_into_the_venv_is_one_line(tmp_path):
    closed = tmp_path / "closed"
    (closed / "bin").mkdir(parents=True)
    (closed / "bin" / "python").write_text("")
    closed.chmod(0o000)  # closed to its owner too (root is not stopped by this: the script becomes nobody)
    try:
        proc = subprocess.run([sys.executable, "-c", DOCTOR_AS_ANOTHER_USER, str(closed)], cwd=REPO,
                              capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        closed.chmod(0o755)
    assert "Traceback" not in proc.stderr and "PermissionError" not in proc.stderr, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if " .venv " in f" {line} ")
    assert line.startswith("missing") and f"{closed}/bin/python cannot be looked at by this user (Permission denied)" in line
    assert "run doctor as the user who owns the checkout" in line


# --- 15. a notebook's setup() -------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(profile="bogus"), "profile must be one of ['paper', 'quick'], got 'bogus'"),
    (dict(profile=["quick"]), "profile must be one of ['paper', 'quick'], got ['quick']"),
    (dict(seeds="[0]"), "seeds must be a list of integers >= 0, got the text '[0]'"),
    (dict(seeds=[2**64]), "seeds must be integers in [0, 2**64), got 18446744073709551616"),
    (dict(workers=0), "workers must be an integer >= 1, got 0"),
    (dict(workers="2"), "workers must be an integer >= 1, got '2'"),
    (dict(dataset="mnist"), "dataset must be one of ['cifar10', 'emnist', 'fmnist'], got 'mnist'"),
    (dict(device="bogus"), "device 'bogus' is not a torch device"),
    (dict(device="cuda"), "device 'cuda': this machine has no CUDA GPU that torch can use"),
])
def test_setup_refuses_each_bad_parameter_before_any_compute(monkeypatch, no_compute, kwargs, message):
    import torch

    from fedsteer_lib.book.context import setup
    from fedsteer_lib.experiments.config import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what a machine without a GPU reports
    with pytest.raises(ConfigError) as info:
        setup(**{"profile": "quick", **kwargs})
    assert message in str(info.value)
    assert info.value._render_traceback_() == [f"ConfigError: {info.value}"]


def test_setup_refuses_a_data_set_whose_files_are_not_here(monkeypatch, no_compute, tmp_path):
    from fedsteer_lib.book.context import setup
    from fedsteer_lib.experiments.config import ConfigError
    from fedsteer_lib.simulator import data

    monkeypatch.setattr(data, "REPO_DATA_DIR", tmp_path)
    monkeypatch.setenv("FEDSTEER_DATA", str(tmp_path / "env"))
    monkeypatch.delenv("FEDSTEER_ALLOW_DOWNLOAD", raising=False)
    with pytest.raises(ConfigError, match=r"dataset 'cifar10': its files are not on this machine \(looked in "
                                          rf"{tmp_path / 'env'}, {tmp_path}\); `python -m fedsteer_lib doctor` says how"):
        setup("quick", dataset="cifar10")


def test_setup_refuses_a_bad_fedsteer_kernels_by_name(monkeypatch, no_compute):
    from fedsteer_lib.book.context import setup
    from fedsteer_lib.experiments.config import ConfigError

    monkeypatch.setenv("FEDSTEER_KERNELS", "bogus")
    with pytest.raises(ConfigError, match="FEDSTEER_KERNELS='bogus' is not a kernel mode"):
        setup("quick")


def test_a_notebooks_bad_parameter_is_the_first_line_its_failing_cell_shows(tmp_path):
    """Executed as `make book` executes a chapter (papermill, the project's kernel): the failing
    cell's output is the one line, not some forty lines of traceback ending with it."""
    import nbformat

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                           "display_name": "Python 3"},
                                            "language_info": {"name": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("profile = 'quick'", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("from fedsteer_lib.book.context import setup\nbook = setup(profile)")]
    source, executed = tmp_path / "tiny.ipynb", tmp_path / "tiny-out.ipynb"
    nbformat.write(nb, source)
    proc = subprocess.run([str(Path(sys.executable).parent / "papermill"), "--log-level", "WARNING", "-k", "python3",
                           "-p", "profile", "bogus", str(source), str(executed)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode != 0
    outputs = [o for cell in json.loads(executed.read_text())["cells"] for o in cell.get("outputs", [])
               if o.get("output_type") == "error"]
    assert len(outputs) == 1, outputs
    assert outputs[0]["traceback"] == ["ConfigError: profile must be one of ['paper', 'quick'], got 'bogus'"], outputs
