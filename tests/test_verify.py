"""`verify` cannot be fooled by editing the file it checks, and a bad input is one line (issue 58).

Everything a run computes is compared bit for bit (its history, its extras, its summary but for
the wall times), whatever kernels the stored file claims: a run that does not come back is
reported as differing and the exit status is not 0. The kernels stored runs are computed with
here: native in this process (the test session's mode), pinned in a process of its own."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedsteer_lib.experiments import cli, verify

REPO = Path(__file__).resolve().parents[1]
SMALL_RUN = ["--method", "fedavg", "--num-clients", "20", "--gamma", "0.9", "--validation-size", "1000", "--rounds", "3",
             "--local-epochs", "1", "--eval-every", "1", "--eval-last", "1", "--client-lr", "0.1"]


@pytest.fixture(scope="module")
def computed(tmp_path_factory) -> Path:
    """A cache holding one small run, computed in this process (native kernels)."""
    root = tmp_path_factory.mktemp("verify-cache")
    assert cli.main(["run", *SMALL_RUN, "--results", str(root)]) == 0
    return root


@pytest.fixture
def cache(computed, tmp_path) -> tuple[Path, Path]:
    """A copy of `computed` and the path of its one result file."""
    root = tmp_path / "cache"
    shutil.copytree(computed, root)
    (path,) = (root / "runs").glob("*.json")
    return root, path


def _edit(path: Path, change) -> None:
    payload = json.loads(path.read_text())
    change(payload)
    path.write_text(json.dumps(payload))


def _verify(capsys, root: Path, *more: str) -> tuple[int, str, str]:
    code = cli.main(["verify", "--profile", "quick", "--results", str(root), *more])
    out, err = capsys.readouterr()
    return code, out, err


# --- what is compared ---------------------------------------------------------------------------------
def test_an_edited_final_accuracy_is_a_difference(cache, capsys):
    root, path = cache
    _edit(path, lambda p: p["summary"].update(final_accuracy=p["summary"]["final_accuracy"] + 0.6))
    code, out, err = _verify(capsys, root, "--key", path.stem)
    assert code != 0 and "0 of 1 bit-identical" in out and "differs in summary.final_accuracy" in out, out
    assert ": bit-identical" not in out and "DIFFERS" in out


def test_edited_extras_are_a_difference_and_wall_times_are_not(cache, capsys):
    root, path = cache
    _edit(path, lambda p: p["summary"].update(wall_time=1e9, timing={"client": 1e9}, warmup_reused=True))
    code, out, _ = _verify(capsys, root, "--key", path.stem)
    assert code == 0 and ": bit-identical" in out and "1 of 1 bit-identical" in out, out
    _edit(path, lambda p: p["extras"]["participation"][0].append(99))
    code, out, _ = _verify(capsys, root, "--key", path.stem)
    assert code != 0 and "differs in extras.participation" in out, out


def test_the_comparison_names_the_first_differing_round():
    history = [{"round": 0, "accuracy": 0.1, "loss": 2.3}, {"round": 1, "accuracy": 0.5, "loss": 1.0}]
    stored = verify.deterministic(history, {"final_accuracy": 0.5, "wall_time": 3.0}, {"participation": [[1]]})
    edited = json.loads(json.dumps(stored))
    edited["history"][1]["loss"] = 0.9
    edited["summary"]["final_accuracy"] = 0.9
    assert verify.differences(stored, edited) == ["history round 1: loss", "summary.final_accuracy"]
    assert "wall_time" not in stored["summary"]


PINNED_VERIFY = [sys.executable, "-m", "fedsteer_lib", "verify", "--profile", "quick", "--kernels", "pinned"]


def test_the_verdict_does_not_depend_on_the_kernels_the_file_claims(tmp_path):
    """Computed and verified with pinned kernels, each in a process of its own: an edited
    accuracy is NOT REPRODUCED (exit 1) while the file says pinned, and still a difference
    (DIFFERS, exit 2, never 0) once the file claims native kernels."""
    root = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-m", "fedsteer_lib", "run", *SMALL_RUN, "--kernels", "pinned", "--results",
                           str(root)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (path,) = (root / "runs").glob("*.json")
    _edit(path, lambda p: p["summary"].update(final_accuracy=0.9922))
    proc = subprocess.run([*PINNED_VERIFY, "--results", str(root), "--key", path.stem], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 1 and "NOT REPRODUCED (a pinned run must come back bit for bit)" in proc.stdout, proc.stdout
    _edit(path, lambda p: p["provenance"].update(kernels="native"))
    proc = subprocess.run([*PINNED_VERIFY, "--results", str(root), "--key", path.stem], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "DIFFERS (stored with native kernels: its bits depend on the CPU that computed it)" in proc.stdout
    assert "differs in summary.final_accuracy" in proc.stdout and "0 of 1 bit-identical" in proc.stdout
    assert proc.stderr.strip().endswith("exit status 2") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# --- bad input: one line naming the file, before any run is recomputed ----------------------------------
@pytest.fixture
def no_recompute(monkeypatch):
    monkeypatch.setattr(verify, "verify_runs", lambda *a, **k: pytest.fail("recomputed a run"))


def _one_line_error(capsys, root: Path, *more: str) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main(["verify", "--profile", "quick", "--results", str(root), *more])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_stored_json_without_a_config_is_named(cache, capsys, no_recompute):
    root, path = cache
    _edit(path, lambda p: p.pop("config"))
    err = _one_line_error(capsys, root, "--key", path.stem)
    assert err.endswith(f"--key {path.stem}: {path}: not a run result (no config, summary and history)"), err


def test_malformed_json_is_named(cache, capsys, no_recompute):
    root, path = cache
    path.write_text(path.read_text()[:200])
    err = _one_line_error(capsys, root, "--key", path.stem)
    assert f"--key {path.stem}: {path}: unreadable (JSONDecodeError: " in err, err


def test_a_file_holding_another_run_is_named(cache, capsys, no_recompute):
    root, path = cache
    other = path.with_name("0123456789abcdef.json")
    shutil.copy(path, other)
    err = _one_line_error(capsys, root, "--key", other.stem)
    assert f"--key 0123456789abcdef: {other}: holds run {path.stem}" in err and "not 0123456789abcdef" in err, err


@pytest.mark.parametrize("key", ["../../x", "../runs/abc", "/etc/passwd", "0123456789ABCDEF", "0123"])
def test_a_key_that_is_not_a_run_key_reads_nothing(cache, capsys, no_recompute, key):
    root, _ = cache
    err = _one_line_error(capsys, root, "--key", key)
    assert f"--key {key!r}: not a run key (16 hex digits" in err, err


def test_a_garbage_log_for_skip_logged_is_named(cache, capsys, no_recompute, tmp_path):
    root, path = cache
    log = tmp_path / "log.jsonl"
    log.write_text('{"key": "0123456789abcdef"}\nthis is not json\n')
    err = _one_line_error(capsys, root, "--key", path.stem, "--log", str(log), "--skip-logged")
    assert f"{log}: line 2 is not a verify record (not JSON: " in err, err
    log.write_text('[1, 2]\n')
    assert f"{log}: line 1 is not a verify record (no \"key\")" in _one_line_error(
        capsys, root, "--key", path.stem, "--log", str(log), "--skip-logged")


def test_a_log_in_a_missing_folder_is_refused_before_computing(cache, capsys, no_recompute, tmp_path):
    root, path = cache
    log = tmp_path / "nowhere" / "log.jsonl"
    err = _one_line_error(capsys, root, "--key", path.stem, "--log", str(log))
    assert f"--log {log}: its folder {log.parent} does not exist" in err, err
    assert f"--log {tmp_path}: is a directory" in _one_line_error(capsys, root, "--key", path.stem, "--log",
                                                                  str(tmp_path))
    assert not os.path.exists(log.parent)
