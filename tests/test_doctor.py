"""The prerequisites check and the system-package set-up (`make doctor`, `make system-packages`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fedsteer_lib.experiments import doctor

ROOT = Path(__file__).resolve().parents[1]


def test_chromium_problem_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDSTEER_CHROMIUM", str(tmp_path / "no-chromium"))
    problem = doctor.chromium_problem()
    assert problem and "no-chromium" in problem and "apt-get install -y chromium" in problem
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("FEDSTEER_CHROMIUM", str(fake))
    assert doctor.chromium_problem() is None


def test_a_missing_browser_fails_once_with_the_message():
    """Not one traceback per page: the page tests are deselected and one test says what to do."""
    env = {**os.environ, "FEDSTEER_CHROMIUM": "/nonexistent/chromium"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "tests/test_book_browser.py"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("1 failed") and "deselected" in last, last
    assert "apt-get install -y chromium" in proc.stdout


def test_install_without_root_prints_the_command(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "SYSTEM_PACKAGES", {"chromium": "/nonexistent/chromium"})
    monkeypatch.setattr(doctor, "_is_root", lambda: False)
    calls = []
    monkeypatch.setattr(doctor.subprocess, "run", lambda *a, **k: calls.append(a))
    assert doctor.install_system_packages() == ["chromium"]
    assert calls == []  # never runs apt-get without root
    assert "sudo apt-get install -y chromium" in capsys.readouterr().err


def test_install_as_root_runs_apt_get_and_retries_after_update(monkeypatch):
    monkeypatch.setattr(doctor, "SYSTEM_PACKAGES", {"chromium": "/nonexistent/chromium"})
    monkeypatch.setattr(doctor, "_is_root", lambda: True)
    monkeypatch.setattr(doctor.shutil, "which", lambda prog: "/usr/bin/" + prog)
    calls = []

    class Done:
        returncode = 100

    def fake_run(cmd, **kw):
        calls.append(cmd[:2])
        return Done()

    monkeypatch.setattr(doctor.subprocess, "run", fake_run)
    assert doctor.install_system_packages(verbose=False) == ["chromium"]  # the fake installs nothing
    assert calls == [["apt-get", "install"], ["apt-get", "update"], ["apt-get", "install"]]


def test_report_lines_and_exit_status(capsys):
    items = [doctor.Check("python", "ok", "3.11"), doctor.Check("emnist", "optional", "not found", "put it there"),
             doctor.Check("chromium", "missing", "absent", "apt-get install -y chromium")]
    assert doctor.report(items) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok") and "->" not in out[0]
    assert out[2].startswith("missing") and out[2].endswith("-> apt-get install -y chromium")
    assert out[-1] == "missing: chromium"
    assert doctor.report(items[:2]) == 0


def test_version_pins_match():
    assert doctor._matches("2.4.1", "2.4.*") and doctor._matches("2.14.1+cu130", "2.14.1")
    assert not doctor._matches("2.13.0", "2.14.1") and not doctor._matches("2.5.0", "2.4.*")


def test_doctor_runs_without_the_virtual_environment():
    """`make doctor` must work before `make setup`: the module needs only the standard library."""
    proc = subprocess.run([sys.executable, "-S", "-c", "import sys; sys.path.insert(0, '.'); "
                           "import fedsteer_lib.experiments.doctor, fedsteer_lib.__main__; "
                           "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'pandas')))"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_every_check_runs_after_the_set_up():
    """`make test` sets up first, so here every check must run to its end: the .venv's packages,
    torch and Fashion-MNIST are ok, and no check reports an error of its own (a renamed module
    once made the data-set checks say ImportError)."""
    items = {c.name: c for c in doctor.checks()}
    for name in (".venv packages", "torch", "fmnist", "mathjax"):
        assert items[name].status == "ok", items[name].line()
    assert items["emnist"].status in ("ok", "optional") and items["cifar10"].status in ("ok", "optional")
    assert not [c.line() for c in items.values() if "Error" in c.detail]
