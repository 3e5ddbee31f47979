"""Prerequisites of the two commands, checked (and the system packages installed) in one place.

    python -m fedsteer_lib doctor            # one line per prerequisite: ok / missing / optional, and the fix
    python -m fedsteer_lib system-packages   # install the Debian packages the project uses (as root)

This module uses only the standard library, so `make doctor` can run it before `.venv` exists;
what needs the virtual environment (its packages, torch, the data-set search) is asked of
`.venv/bin/python` in a subprocess.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SYSTEM_PACKAGES", "Check", "checks", "report", "missing_system_packages", "install_system_packages",
           "chromium_path", "chromium_problem"]

ROOT = Path(__file__).resolve().parents[2]
VENV_PY = ROOT / ".venv" / "bin" / "python"
MATHJAX = ROOT / "book" / "_static" / "mathjax" / "tex-chtml.js"

# Debian packages the project uses that a fresh machine of this kind lacks, with the file that
# shows each is there. dataset-fashion-mnist is installed by `python -m fedsteer_lib data`
# (it can also come from elsewhere: FEDSTEER_DATA), so it is checked with the data sets below.
SYSTEM_PACKAGES: dict[str, str] = {"chromium": "/usr/bin/chromium"}


def chromium_path() -> str:
    """The headless browser of the book check: FEDSTEER_CHROMIUM, else Debian's /usr/bin/chromium."""
    return os.environ.get("FEDSTEER_CHROMIUM", SYSTEM_PACKAGES["chromium"])


def chromium_problem() -> str | None:
    """None when the browser is there; else the one message that says what is missing and the fix."""
    path = chromium_path()
    try:
        if Path(path).is_file() and os.access(path, os.X_OK):
            return None
    except OSError:  # a folder on the way this user may not look into: as good as missing
        pass
    return (f"headless Chromium is missing ({path} does not exist): install it with "
            f"`{_apt_command('chromium')}` (`make test` does this itself when run as root), "
            "or point FEDSTEER_CHROMIUM at a Chromium binary")


def _is_root() -> bool:
    return getattr(os, "geteuid", lambda: -1)() == 0


def _apt_command(*packages: str) -> str:
    return ("" if _is_root() else "sudo ") + "apt-get install -y " + " ".join(packages)


def missing_system_packages() -> list[str]:
    return [pkg for pkg, path in SYSTEM_PACKAGES.items() if not Path(path).exists()]


def install_system_packages(verbose: bool = True) -> list[str]:
    """Install the missing `SYSTEM_PACKAGES` with apt-get when root (`apt-get update` and one retry
    on failure); returns what is still missing. Not root: prints the command and installs nothing."""
    todo = missing_system_packages()
    if not todo:
        return []
    if not (_is_root() and shutil.which("apt-get")):
        print(f"missing Debian packages: {' '.join(todo)}; install them with `{_apt_command(*todo)}`", file=sys.stderr)
        return todo
    quiet = {} if verbose else {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *todo]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, check=False, env=env, **quiet).returncode != 0:
        subprocess.run(["apt-get", "update"], check=False, env=env, **quiet)
        subprocess.run(install, check=False, env=env, **quiet)
    still = missing_system_packages()
    if still:
        print(f"`{' '.join(install)}` did not provide: {' '.join(still)}", file=sys.stderr)
    return still


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "missing", "corrupt" (there but unusable) or "optional" (absent, and only some users need it)
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f"  -> {self.fix}" if self.status != "ok" and self.fix else ""
        return f"{self.status:8s} {self.name:24s} {self.detail}{fix}"


def _stat_problem(path: Path) -> str | None:
    """Why `path` is not there for this user (None when it is): missing, or a folder on the way
    that this user may not look into (a checkout of another user's); never an exception."""
    try:
        path.stat()
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as err:
        return f"{path} cannot be looked at by this user ({err.strerror or err})"
    return None


def _venv(code: str) -> dict | None:
    """Run `code` (which prints one JSON object) with the virtual environment's Python."""
    if _stat_problem(VENV_PY):
        return None
    try:
        proc = subprocess.run([str(VENV_PY), "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    except OSError as err:
        return {"error": f"{VENV_PY} cannot be run by this user ({err.strerror or err})"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["exit " + str(proc.returncode)])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.split("[")[0].strip()] = version.strip()  # flwr[simulation] is the distribution flwr
    return pins


_PACKAGES = """
import importlib.metadata as m, json, sys
out = {}
for name in sys.argv[1:] if len(sys.argv) > 1 else NAMES:
    try: out[name] = m.version(name)
    except m.PackageNotFoundError: out[name] = None
print(json.dumps(out))
"""

_TORCH = """
import json, torch
print(json.dumps({"version": torch.__version__, "cuda": torch.cuda.is_available(),
                  "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                  "threads": torch.get_num_threads()}))
"""

_DATA = """
import json
from fedsteer_lib.simulator import data
out = {}
for name in data.DATASETS:
    st = data.dataset_status(name)
    out[name] = {"status": st.status, "folder": str(st.folder) if st.folder else None, "detail": st.detail,
                 "searched": [str(d) for d in st.searched], "notes": list(st.notes)}
print(json.dumps(out))
"""


def checks() -> list[Check]:
    """Every prerequisite of `make book` and `make test`, in the order the set-up meets them."""
    out = []
    ok_py = sys.version_info[:2] >= (3, 11)
    out.append(Check("python", "ok" if ok_py else "missing", f"{sys.version.split()[0]} ({sys.executable})",
                     "install Python 3.11 (Debian: apt-get install -y python3 python3-venv)"))
    for tool, why, pkg in [("npm", "copies MathJax for the offline book", "npm"),
                           ("make", "runs the two commands", "make")]:
        where = shutil.which(tool)
        out.append(Check(tool, "ok" if where else "missing", where or f"not on PATH ({why})", _apt_command(pkg)))
    venv_problem = _stat_problem(VENV_PY)
    if venv_problem:
        fix = ("make setup" if "does not exist" in venv_problem else
               "run doctor as the user who owns the checkout, or let others read it (chmod -R a+rX .venv)")
        out.append(Check(".venv", "missing", venv_problem, fix))
    else:
        pins = _pins()
        found = _venv(_PACKAGES.replace("NAMES", repr(list(pins)))) or {}
        bad = [f"{n} {found.get(n) or 'absent'} (wants {v})" for n, v in pins.items()
               if "error" in found or not found.get(n) or not _matches(found[n], v)]
        out.append(Check(".venv packages", "missing" if bad else "ok",
                         "; ".join(bad) if bad else f"{len(pins)} pinned packages of requirements.txt", "make setup"))
        torch_info = _venv(_TORCH) or {"error": "no .venv"}
        if "error" in torch_info:
            out.append(Check("torch", "missing", torch_info["error"], "make setup"))
        else:
            device = f"cuda ({', '.join(torch_info['gpus'])})" if torch_info["cuda"] else f"cpu ({torch_info['threads']} threads)"
            out.append(Check("torch", "ok", f"{torch_info['version']}, device {device}"))
        datasets = _venv(_DATA) or {}
        for name in ("fmnist", "emnist", "cifar10"):
            info = datasets.get(name)
            if info is None:
                out.append(Check(name, "missing", datasets.get("error", "could not check"), "make setup"))
                continue
            required = name == "fmnist"
            notes = "".join(f" (note: {n})" for n in info["notes"])
            if info["status"] == "corrupt":
                fix = (f"replace or remove the files in {info['folder']} (or point FEDSTEER_DATA elsewhere)"
                       + ("; Debian's copy: " + _apt_command("--reinstall", "dataset-fashion-mnist") if required else ""))
                out.append(Check(name, "corrupt", info["detail"] + notes, fix))
                continue
            where = (info["folder"] if info["status"] == "ok" else info["detail"]) + notes
            status = "ok" if info["status"] == "ok" else ("missing" if required else "optional")
            fix = ("make data (as root; else " + _apt_command("dataset-fashion-mnist") + ")" if required else
                   "only for its chapters' paper-scale runs: put its files in one of those folders "
                   "(FEDSTEER_DATA), or set FEDSTEER_ALLOW_DOWNLOAD=1 where the internet is reachable")
            out.append(Check(name, status, where, fix))
    mathjax_problem = _stat_problem(MATHJAX)
    out.append(Check("mathjax", "missing" if mathjax_problem else "ok",
                     mathjax_problem or str(MATHJAX.relative_to(ROOT)), "make setup"))
    problem = chromium_problem()
    out.append(Check("chromium", "missing" if problem else "ok", chromium_path() if not problem else
                     f"{chromium_path()} does not exist (the headless-browser check of `make test`)",
                     "make system-packages (as root), or " + _apt_command("chromium")))
    return out


def _matches(version: str, pin: str) -> bool:
    """'2.4.1' matches '2.4.*'; '2.14.1+cpu' matches '2.14.1'."""
    if pin.endswith(".*"):
        return version.startswith(pin[:-1])
    return version.split("+")[0] == pin


def report(items: list[Check] | None = None) -> int:
    """Print one line per prerequisite; exit status 1 when a required one is missing."""
    items = checks() if items is None else items
    for item in items:
        print(item.line())
    missing = [i.name for i in items if i.status in ("missing", "corrupt")]
    print("all prerequisites ok" if not missing else f"missing: {', '.join(missing)}")
    return 1 if missing else 0
