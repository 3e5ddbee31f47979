"""The pinned dependency lists for pip (requirements.txt) and conda (environment.yml) agree."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _requirements() -> list[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def _conda_pip() -> list[str]:
    out, inside = [], False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if line.strip() == "- pip:":
            inside = True
            continue
        if inside and line.strip().startswith("- "):
            out.append(line.strip()[2:])
    return out


def test_requirements_and_environment_list_the_same_pins():
    assert _requirements() == _conda_pip()
    assert "python=3.11" in (ROOT / "environment.yml").read_text()


def test_core_pins_are_the_verified_set():
    pins = dict(p.split("==") for p in _requirements() if "==" in p)
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"
    assert pins["jupyter-book"] == "1.0.4.post1"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make book" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
