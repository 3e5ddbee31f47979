"""Nothing is trusted by its name (issue 30): a result file by its file name, a cache root by a
default, seeds by their look, a cache layout by hope, data files by their presence, numbers by
their type. Each test below fails on the code before the issue."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from fedsteer_lib.experiments import cli
from fedsteer_lib.experiments.cli_checks import results_dir_problem
from fedsteer_lib.experiments.config import ConfigError, FLSystem, RunConfig, Training, method
from fedsteer_lib.experiments.groups import regime_grid, run_groups
from fedsteer_lib.experiments.results import has_run, layout_problems, load_run, run_path, runs_table, save_run
from fedsteer_lib.experiments.sweep import missing, run_grid, run_lock
from fedsteer_lib.simulator.engine import RunResult

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(system=FLSystem(num_clients=20, gamma=0.7, validation_size=1000), seed=0,
             training=Training(rounds=2, local_epochs=1, eval_every=2, eval_last=1))


def small(name: str, **params) -> RunConfig:
    return RunConfig(method=method(name, **params), **SMALL).validate()


def fake_save(config: RunConfig, root: Path, accuracy: float = 0.5) -> Path:
    summary = {"final_accuracy": accuracy, "mean_last_accuracy": accuracy, "final_loss": 1.0, "collapsed": False,
               "collapse_round": None, "server_memory_bytes": 0, "wall_time": 1.0}
    return save_run(RunResult(config=config.to_dict(), history=[{"round": 0, "accuracy": accuracy}], summary=summary,
                              extras={}), config, root)


def cli_main(*argv: str, capsys) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- 1. a stored result is the run its content says, not its file name ----------------------------
def test_a_result_copied_under_another_runs_name_is_named_not_counted_and_recomputed(tmp_path):
    fedavg, stale = small("fedavg"), small("fedstale", beta=0.6)
    fake_save(fedavg, tmp_path, accuracy=0.123)
    shutil.copy(run_path(fedavg, tmp_path), run_path(stale, tmp_path))
    with pytest.warns(UserWarning, match=f"holds run {fedavg.key()} \\(fedavg, gamma 0.7, seed 0\\), not {stale.key()}"):
        assert not has_run(stale, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert missing([fedavg, stale], tmp_path) == [stale]
        with pytest.raises(ValueError, match="holds run"):
            runs_table([stale], tmp_path)  # never reports FedAvg's accuracy as FedStale's
        assert run_grid([fedavg, stale], tmp_path, progress=False) == 1
    assert load_run(stale, tmp_path)["key"] == stale.key() and has_run(stale, tmp_path)


def test_a_payload_whose_key_field_lies_is_not_counted(tmp_path):
    run = small("fedavg")
    path = fake_save(run, tmp_path)
    payload = json.loads(path.read_text())
    payload["key"] = "0" * 16
    path.write_text(json.dumps(payload))
    with pytest.warns(UserWarning, match=f"not {run.key()}"):
        assert not has_run(run, tmp_path)


def test_every_committed_result_is_its_own_run():
    from fedsteer_lib.experiments.results import parse_result

    files = sorted((REPO / "data" / "results" / "runs").glob("*.json"))
    assert len(files) >= 978
    problems = {f.name: parse_result(f)[1] for f in files}
    assert not {k: v for k, v in problems.items() if v}


# --- 2. one cache root, passed through everything ---------------------------------------------------
def test_results_dir_reaches_the_groups_derived_from_the_cache(tmp_path, capsys):
    """The calibrated point's cell is read from --results DIR, never from the default cache."""
    for c in regime_grid("fmnist", "quick"):
        if c.method.name == "fedavg_unbiased":
            fake_save(c, tmp_path)
    groups = run_groups("fmnist", "quick", root=tmp_path)
    assert groups["calibrated_point"], "the calibration cell is known from the runs in tmp_path"
    assert run_groups("fmnist", "quick", root=tmp_path / "empty")["calibrated_point"] == []
    code, out, _ = cli_main("status", "--profile", "quick", "--results", str(tmp_path), capsys=capsys)
    line = next(l for l in out.splitlines() if l.startswith("calibrated_point"))
    assert code == 0 and f"/ {len(groups['calibrated_point']):4d} runs cached" in line, out  # not "0 / 0"


def test_no_reader_of_the_derived_groups_has_a_default_cache():
    import inspect

    from fedsteer_lib.experiments import groups

    for f in (groups.calibration_cell, groups.calibrated_grid, groups.server_step_choices, groups.own_step_grid,
              groups.run_groups):
        assert inspect.signature(f).parameters["root"].default is inspect.Parameter.empty, f.__name__


# --- 3. seeds are checked where they are received -----------------------------------------------------
@pytest.mark.parametrize("seeds, message", [
    ([0, 0], "must not repeat.*0 is given 2 times"),
    ("[99]", 'got the text .*-y "seeds: \\[0, 1\\]"'),
    ([True], r"integers in \[0, 2\*\*64\), got True"),
    ([-1], r"integers in \[0, 2\*\*64\), got -1"),
    ([2**64], r"integers in \[0, 2\*\*64\), got 18446744073709551616"),
    ([], "at least one seed"),
])
def test_a_chapter_refuses_bad_seeds(seeds, message):
    from fedsteer_lib.book import setup

    with pytest.raises(ConfigError, match=message):
        setup("quick", seeds=seeds)


def test_make_book_checks_seeds_before_deleting_the_chapters():
    chapters = REPO / "book" / "chapters"
    created = not chapters.exists()
    chapters.mkdir(parents=True, exist_ok=True)
    keep = chapters / ".keep-test-trust"
    keep.write_text("")
    try:
        proc = subprocess.run(["make", "--no-print-directory", "-o", "setup", "-o", ".venv/.installed-x",
                               "book", "SEEDS=abc"], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode != 0 and "SEEDS='abc': seeds must be integers >= 0" in proc.stderr, proc.stderr
        assert keep.exists(), "make book SEEDS=abc deleted the built chapters before checking the value"
    finally:
        keep.unlink(missing_ok=True)
        if created:
            shutil.rmtree(chapters, ignore_errors=True)


# --- 4. cache layouts: named in one line, before any compute -----------------------------------------
def test_a_directory_at_a_result_path_is_named_by_status_and_skipped_by_sweep(tmp_path, capsys):
    grid = run_groups("fmnist", "quick", what="main", root=tmp_path)["main"]
    blocked = run_path(grid[0], tmp_path)
    blocked.mkdir(parents=True)
    code, out, err = cli_main("status", "--profile", "quick", "--what", "main", "--results", str(tmp_path), capsys=capsys)
    assert code == 0 and f"cache problem: {blocked}: a directory, not a result file" in err and "Traceback" not in err
    assert not has_run(grid[0], tmp_path)
    problems = layout_problems(grid, tmp_path)
    assert list(problems) == [grid[0].key()]


def test_a_file_named_runs_is_one_line_before_any_compute(tmp_path, capsys):
    (tmp_path / "runs").write_text("not a directory")
    for command in ("status", "sweep"):
        code, out, err = cli_main(command, "--profile", "quick", "--what", "main", "--results", str(tmp_path),
                                  capsys=capsys)
        assert code == 1 and err.strip() == f"cache problem: {tmp_path / 'runs'}: is a file, not the directory of run results (move it away)"
    with pytest.raises(OSError, match="is a file, not the directory"):
        run_grid([small("fedavg")], tmp_path, progress=False)


def _read_only(directory: Path, on: bool) -> None:
    """Make `directory` refuse new files: permission bits for a user, the immutable attribute for
    root (whom permission bits do not stop; ext4 and most Linux file systems have it)."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i" if on else "-i", str(directory)], check=True)
    else:
        os.chmod(directory, 0o555 if on else 0o755)


def test_a_read_only_runs_directory_is_found_before_a_run_is_computed(tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    _read_only(runs, True)
    try:
        start = time.time()
        with pytest.raises(OSError, match=f"{runs}: cannot write results into it"):
            run_grid([small("fedavg")], tmp_path, progress=False)
        assert time.time() - start < 2, "refused only after computing"
        code, _, err = cli_main("sweep", "--profile", "quick", "--what", "main", "--results", str(tmp_path), capsys=capsys)
        assert code == 1 and err.strip().startswith(f"cache problem: {runs}: cannot write results into it"), err
    finally:
        _read_only(runs, False)


def test_result_files_are_readable_by_the_group_and_others(tmp_path):
    old = os.umask(0o022)
    try:
        path = fake_save(small("fedavg"), tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


# --- 5. data files are verified; numbers are numbers ---------------------------------------------------
def _fmnist_copy(tmp_path: Path, damage) -> Path:
    from fedsteer_lib.simulator import data

    folder = tmp_path / "fmnist"
    shutil.copytree(data.DEBIAN_FMNIST_DIR, folder)
    damage(folder)
    return folder


def _truncate(folder: Path) -> None:
    f = folder / "t10k-labels-idx1-ubyte.gz"
    f.write_bytes(f.read_bytes()[:200])


def _wrong_magic(folder: Path) -> None:
    import gzip

    f = folder / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(f.read_bytes()))
    raw[2] = 0x42
    f.write_bytes(gzip.compress(bytes(raw)))


@pytest.mark.parametrize("damage, fault", [(_truncate, "corrupt gzip data|truncated"), (_wrong_magic, "not an IDX file")])
def test_data_and_doctor_report_corrupt_fashion_mnist(tmp_path, damage, fault):
    folder = _fmnist_copy(tmp_path, damage)
    env = {**os.environ, "FEDSTEER_DATA": str(folder)}
    proc = subprocess.run([sys.executable, "-m", "fedsteer_lib", "data"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and "fmnist is corrupt" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "t10k-labels-idx1-ubyte.gz" in proc.stderr
    from fedsteer_lib.simulator import data

    os.environ["FEDSTEER_DATA"] = str(folder)
    try:
        st = data.dataset_status("fmnist")
    finally:
        del os.environ["FEDSTEER_DATA"]
    import re

    assert st.status == "corrupt" and re.search(fault, st.detail), st


def test_doctor_says_corrupt(tmp_path):
    folder = _fmnist_copy(tmp_path, _truncate)
    env = {**os.environ, "FEDSTEER_DATA": str(folder)}
    proc = subprocess.run([sys.executable, "-m", "fedsteer_lib", "doctor"], cwd=REPO, env=env, capture_output=True,
                          text=True)
    line = next(l for l in proc.stdout.splitlines() if " fmnist " in f" {l} ")
    assert proc.returncode == 1 and line.startswith("corrupt") and "replace or remove the files" in line, proc.stdout


@pytest.mark.parametrize("value, said", [("", "set but empty"), ("/nonexistent/fashion", "no such directory")])
def test_a_fedsteer_data_that_gives_nothing_is_said(value, said):
    env = {**os.environ, "FEDSTEER_DATA": value}
    proc = subprocess.run([sys.executable, "-m", "fedsteer_lib", "data"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and said in proc.stderr, proc.stderr


@pytest.mark.parametrize("build, field", [
    (lambda: RunConfig(training=Training(client_lr=float("inf"))), "client_lr"),
    (lambda: RunConfig(training=Training(server_lr=float("nan"))), "server_lr"),
    (lambda: RunConfig(method=method("fedsteer", lam=float("inf"))), "fedsteer lam"),
    (lambda: RunConfig(method=method("fedprox", mu=float("nan"))), "fedprox mu"),
    (lambda: RunConfig(seed=True), "seed"),
    (lambda: RunConfig(training=Training(rounds=True)), "rounds"),
    (lambda: RunConfig(method=method("fedsteer", core_size=True)), "fedsteer core_size"),
])
def test_non_finite_numbers_and_booleans_are_refused_by_name(build, field):
    with pytest.raises(ConfigError, match=f"^{field} must be"):
        build().validate()


def test_misleading_results_dir_message_names_the_real_cause():
    problem = results_dir_problem("/proc/foo")
    assert "does not exist and cannot be created" in problem and "/proc does not let this process create" in problem


# --- 6. concurrent sweeps on one cache compute each run once -------------------------------------------
SWEEP = """
import sys
from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, method
from fedsteer_lib.experiments.sweep import run_grid
configs = [RunConfig(method=method(m), system=FLSystem(num_clients=20, gamma=0.7, validation_size=1000), seed=s,
                     training=Training(rounds=2, local_epochs=1, eval_every=2, eval_last=1))
           for s in (0, 1) for m in ("fedavg", "mifa", "fedvarp")]
print("COMPUTED", run_grid(configs, sys.argv[1], progress=False))
"""


def test_two_sweeps_on_one_cache_compute_each_run_once(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", SWEEP, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    counts = [int(out.split("COMPUTED")[1]) for out, _ in outs]
    assert sum(counts) == 6, outs
    assert len(list((tmp_path / "runs").glob("*.json"))) == 6


HOLD = """
import sys, time
from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, method
from fedsteer_lib.experiments.sweep import run_lock
c = RunConfig(method=method("fedavg"), system=FLSystem(num_clients=20, gamma=0.7, validation_size=1000), seed=0,
              training=Training(rounds=2, local_epochs=1, eval_every=2, eval_last=1))
with run_lock(c, sys.argv[1], wait=False) as held:
    print("HELD" if held else "NOT", flush=True)
    time.sleep(120)
"""


def test_a_run_locked_by_a_sweep_that_dies_is_picked_up(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "HELD"
    locked, free = small("fedavg"), small("mifa")
    with run_lock(locked, tmp_path, wait=False) as held:
        assert not held  # the other process has it
    killer = threading.Timer(3.0, holder.kill)
    killer.start()
    start = time.time()
    try:
        assert run_grid([locked, free], tmp_path, progress=False) == 2
    finally:
        killer.cancel()
        holder.kill()
        holder.wait()
    assert time.time() - start >= 3.0  # it waited for the dead sweep's lock, then computed the run itself
    assert has_run(locked, tmp_path) and has_run(free, tmp_path)
