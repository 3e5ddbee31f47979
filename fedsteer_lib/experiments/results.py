"""The results cache: one JSON file per finished run under `data/results/runs/`, named by the
run's config key, holding the exact config, provenance, history, summary and extras.

Files are written atomically (temporary file + rename), readable by everyone the umask allows
(0644 by default), so a crash never leaves a half-written result and a cache can be shared. A
stored result is trusted by its content, never by its file name: it is usable only if its
payload's `key` and the key recomputed from its `config` are both the run's own. A run is
computed only if its file is missing or not usable: a file that does not parse (truncated,
corrupted by hand), that holds another run ("holds run X, not Y"), or that predates the current
summary format (a collapsed run without `accuracy_before_collapse`) is named in a warning, never
counted, and recomputed by the next sweep, which replaces it.

What cannot be fixed by recomputing (a directory where a result file should be, `runs` not a
directory, a `runs/` this process cannot write into or whose disk is full) is a layout problem:
`layout_problems` names each in one line, and `status` and `sweep` print them before any compute.
A result that cannot be written after all (the disk filled up while the run computed) is
`ResultNotSavedError`, one line naming the file and the reason.

Every result records the code that computed it (`git describe`); where git cannot say (git
missing, a checkout owned by another user: "dubious ownership"), the result says "unknown" and
the first save of the process warns why, in one line on stderr.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import os
import platform
import secrets
import stat
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import torch

from .. import numerics
from ..simulator.engine import RunResult
from .config import METHOD_DEFAULTS, MethodSpec, Profile, RunConfig, get_profile

__all__ = ["RESULTS_DIR", "results_root", "run_path", "has_run", "result_problem", "layout_problems", "CacheLayoutError",
           "ResultNotSavedError", "MIN_FREE_BYTES", "save_run", "load_run", "parse_result", "json_safe", "provenance", "runs_table", "history_table", "load_runs", "METHOD_PARAMETERS",
           "method_columns"]

RESULTS_DIR = Path(os.environ.get("FEDSTEER_RESULTS", Path(__file__).resolve().parents[2] / "data" / "results"))


def results_root(profile: "str | Profile") -> Path:
    """The results cache of a profile (`paper`: data/results, committed; `quick`: .cache/, not committed)."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    env = os.environ.get("FEDSTEER_RESULTS")
    return Path(env) if env and prof.name == "paper" else Path(__file__).resolve().parents[2] / prof.results_dir


def _root(root: str | os.PathLike | None) -> Path:
    return Path(root) if root is not None else RESULTS_DIR


def run_path(config: RunConfig, root: str | os.PathLike | None = None) -> Path:
    return _root(root) / "runs" / f"{config.key()}.json"


def _describe(key: str, config: dict) -> str:
    try:
        c = RunConfig.from_dict(config)
        return f"{key} ({c.method.label}, gamma {c.system.gamma}, seed {c.seed})"
    except Exception:  # noqa: BLE001 - a config that does not even build is described by its key
        return key


def _problem_of(payload: Any, expected_key: str | None = None) -> str | None:
    """Why `payload` is not the usable result of run `expected_key` (None when it is)."""
    if not isinstance(payload, dict) or not all(k in payload for k in ("config", "summary", "history")):
        return "not a run result (no config, summary and history)"
    try:
        own_key = RunConfig.from_dict(payload["config"]).key()
    except Exception as err:  # noqa: BLE001 - any config that does not build is not a run's
        return f"its config does not describe a run ({type(err).__name__}: {err})"
    if expected_key is not None and (own_key != expected_key or payload.get("key") != expected_key):
        held = own_key if own_key != expected_key else payload.get("key")
        return f"holds run {_describe(str(held), payload['config'])}, not {expected_key}"
    summary = payload["summary"]
    if summary.get("collapsed") and "accuracy_before_collapse" not in summary:
        return ("a collapsed run stored before collapsed runs were scored on the model they end with "
                "(its final accuracy is the last one before the collapse)")
    return None


def parse_result(path: str | Path) -> tuple[dict | None, str | None]:
    """(payload, None) for a usable result file, (None, why) otherwise. The run a file must
    hold is the one its name says: `<key>.json`."""
    path = Path(path)
    try:
        with open(path) as f:
            payload = json.load(f)
    except FileNotFoundError:
        return None, "missing"
    except IsADirectoryError:
        return None, "a directory, not a result file"
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        return None, f"unreadable ({type(err).__name__}: {err})"
    except OSError as err:
        return None, f"unreadable ({err.strerror or err})"
    problem = _problem_of(payload, path.stem)
    return (payload, None) if problem is None else (None, problem)


@functools.lru_cache(maxsize=None)
def _problem_of_file(path: str, mtime_ns: int, size: int) -> str | None:
    return parse_result(path)[1]  # cached per version of the file: `status` and the sweep ask often


def _warn(path: Path, problem: str) -> None:
    warnings.warn(f"{path}: {problem}; not counted as a result, the sweep recomputes it", stacklevel=3)


def _not_a_file(path: Path) -> str | None:
    """A layout problem at a result path: something other than a regular file is there."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if stat.S_ISREG(mode):
        return None
    kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
    return f"{kind}, not a result file (remove it; the sweep cannot write the run's result there)"


def result_problem(config: RunConfig, root: str | os.PathLike | None = None) -> str | None:
    """Why the stored result of `config` cannot be used ("missing", "unreadable (...)", "holds
    run X, not Y", a layout problem, ...), or None when it can."""
    path = run_path(config, root)
    layout = _not_a_file(path)
    if layout is not None:
        return layout
    try:
        st = path.stat()
    except FileNotFoundError:
        return "missing"
    problem = _problem_of_file(str(path), st.st_mtime_ns, st.st_size)
    if problem is not None:
        _warn(path, problem)
    return problem


class CacheLayoutError(OSError):
    """The results cache cannot take the runs asked of it; the message names each problem."""


class ResultNotSavedError(OSError):
    """A computed run's result could not be written (a full disk, a file system gone read-only);
    the message, one line, names the file and the reason."""


# A run's result file takes up to about 0.4 MB (the paper profile's probe runs); a cache on a file
# system with less free space than this is refused before anything is computed.
MIN_FREE_BYTES = 4 * 2**20


def _writable_dir_problem(directory: Path) -> str | None:
    """Why this process cannot create files in `directory` (None when it can), tried for real
    (permission bits say nothing for root or a read-only mount), and whether its file system has
    `MIN_FREE_BYTES` free (creating an empty file succeeds on a full disk)."""
    probe = directory / f".tmp-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        probe.unlink()
    except OSError as err:
        return f"{directory}: cannot write results into it ({err.strerror or err})"
    try:
        fs = os.statvfs(directory)
    except (OSError, AttributeError):  # no statvfs (not POSIX): the save itself says so
        return None
    free = fs.f_bavail * fs.f_frsize
    if free < MIN_FREE_BYTES:
        return (f"{directory}: its disk is full ({free / 2**20:.1f} MiB free, a result needs up to "
                f"{MIN_FREE_BYTES // 2**20} MiB): free some space first")
    return None


def layout_problems(configs: Iterable[RunConfig], root: str | os.PathLike | None = None, *,
                    writing: bool = True) -> dict[str | None, str]:
    """Every layout problem of the cache for `configs`, one line each: {run key: problem} for a
    run whose result path holds something other than a file, {None: problem} for the cache as a
    whole (`runs` not a directory, or, when `writing`, a root or `runs/` that cannot be written
    into). Empty when the runs can be read and their results saved."""
    base = _root(root)
    runs = base / "runs"
    out: dict[str | None, str] = {}
    if base.exists() and not base.is_dir():
        return {None: f"{base}: is a file, not a results directory"}
    if runs.exists() and not runs.is_dir():
        return {None: f"{runs}: is a file, not the directory of run results (move it away)"}
    if writing:
        if runs.is_dir():
            problem = _writable_dir_problem(runs)
        else:
            existing = next((p for p in (base.absolute(), *base.absolute().parents) if p.exists()), None)
            problem = None if existing is None or not existing.is_dir() else _writable_dir_problem(existing)
            if existing is not None and not existing.is_dir():
                problem = f"{existing}: is a file, cannot create {runs} under it"
        if problem:
            out[None] = problem
    if runs.is_dir():
        for c in configs:
            path = run_path(c, base)
            problem = _not_a_file(path)
            if problem:
                out[c.key()] = f"{path}: {problem}"
    return out


def has_run(config: RunConfig, root: str | os.PathLike | None = None) -> bool:
    """Whether a usable result of `config` is stored (see the module docstring)."""
    return result_problem(config, root) is None


UNKNOWN_CODE = "unknown"


def _describe_code(repo: Path | None = None) -> tuple[str, str | None, str | None]:
    """(`git describe --always --dirty`, the hash of the diff of a dirty tree, why the version is
    unknown) of the repository; the version is UNKNOWN_CODE, with the reason, where git cannot
    say (not installed, not a repository, a checkout owned by another user)."""
    repo = repo or Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=5)
    except FileNotFoundError:
        return UNKNOWN_CODE, None, "git is not installed (not on PATH)"
    except (OSError, subprocess.SubprocessError) as err:
        return UNKNOWN_CODE, None, f"git describe failed: {err}"
    version = out.stdout.strip()
    if out.returncode != 0 or not version:
        said = next((line.strip() for line in out.stderr.splitlines() if line.strip()), f"exit status {out.returncode}")
        return UNKNOWN_CODE, None, f"git describe in {repo}: {said.removeprefix('fatal: ')}"
    return version, numerics.tree_diff_hash(repo) if version.endswith("-dirty") else None, None


# The code this process runs: read when the process imports it, not when it saves a result (a long
# sweep must not record the version of a tree that was edited after it started).
_PROCESS_CODE = _describe_code()
_WARNED_UNKNOWN_CODE = False


def _warn_unknown_code() -> None:
    """One line on stderr, once per process, when the results it saves cannot name their code."""
    global _WARNED_UNKNOWN_CODE
    why = _PROCESS_CODE[2]
    if why is None or _WARNED_UNKNOWN_CODE:
        return
    _WARNED_UNKNOWN_CODE = True
    print(f"warning: results saved by this process record code_version {UNKNOWN_CODE!r}: {why}", file=sys.stderr,
          flush=True)


def provenance(device: str, machine: dict[str, Any] | None = None) -> dict[str, Any]:
    """Code version of this process (and, for a dirty tree, the hash of its diff, both read when the
    process imported this module), date, Python, the device, and
    what `numerics.machine` says of the process that computed the run (its CPU and features,
    the kernel mode and choices in force, torch/oneDNN/MKL versions, threads): `machine`, or
    this process's own."""
    dev = device
    if device.startswith("cuda") and torch.cuda.is_available():
        dev = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    version, diff, _ = _PROCESS_CODE
    out = {"code_version": version, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "device": dev}
    if diff:
        out["diff_sha1"] = diff
    return {**out, **(machine or numerics.machine(device))}


def json_safe(obj: Any) -> Any:
    """JSON-safe: NaN/inf become None (how every result is stored)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def save_run(result: RunResult, config: RunConfig, root: str | os.PathLike | None = None) -> Path:
    """Write one run atomically (readable as the umask allows, 0644 by default); returns its path.
    ResultNotSavedError (one line: the file and the reason) when it cannot be written; no
    temporary file is left behind."""
    path = run_path(config, root)
    payload = {"key": config.key(), "config": config.to_dict(with_device=False),
               "provenance": {**provenance(config.device, result.machine), "client_batch": config.client_batch},
               "summary": result.summary, "history": result.history, "extras": result.extras}
    tmp = path.parent / f".tmp-{os.getpid()}-{secrets.token_hex(6)}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)  # the umask applies, as for any file
    except OSError as err:
        raise ResultNotSavedError(f"the result of run {config.key()} could not be saved to {path}: "
                                  f"{err.strerror or err}") from None
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(json_safe(payload), f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise ResultNotSavedError(f"the result of run {config.key()} could not be saved to {path}: "
                                  f"{err.strerror or err}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _warn_unknown_code()
    return path


def load_run(config: RunConfig, root: str | os.PathLike | None = None) -> dict[str, Any]:
    """The stored payload of a finished run (raises FileNotFoundError if it was never run)."""
    path = run_path(config, root)
    payload, problem = parse_result(path)
    if problem == "missing":
        raise FileNotFoundError(f"no result for run {config.key()} ({config.method.label}, seed {config.seed}) at {path}")
    if payload is None:
        raise ValueError(f"the result of run {config.key()} ({config.method.label}, seed {config.seed}) at {path} is "
                         f"{problem}; `python -m fedsteer_lib sweep` recomputes it")
    return payload


def load_runs(configs: Iterable[RunConfig], root: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    return [load_run(c, root) for c in configs]


# Every parameter of any method (`config.METHOD_DEFAULTS`), in the order they first appear there: the
# tables below carry one column per parameter, so that a run's method is read from columns, never
# parsed back from its label.
METHOD_PARAMETERS: tuple[str, ...] = tuple(dict.fromkeys(k for params in METHOD_DEFAULTS.values() for k in params))


def method_columns(spec: MethodSpec) -> dict[str, Any]:
    """One entry per `METHOD_PARAMETERS`: the method's value (its default where the spec omits
    it), None for a parameter the method does not have."""
    own = METHOD_DEFAULTS[spec.name]
    return {k: spec.get(k) if k in own else None for k in METHOD_PARAMETERS}


def _row(config: RunConfig) -> dict[str, Any]:
    return {"dataset": config.dataset, "method": config.method.name, "label": config.method.label,
            "gamma": config.system.gamma, "seed": config.seed, "rounds": config.training.rounds, "key": config.key()}


def _with_method_columns(table: pd.DataFrame, specs: list[MethodSpec]) -> pd.DataFrame:
    """`table` plus one object column per `METHOD_PARAMETERS` (row i from specs[i]); object
    dtype keeps each value as the config holds it (10 stays 10, not 10.0 next to a None)."""
    clash = set(METHOD_PARAMETERS) & set(table.columns)
    if clash:
        raise ValueError(f"method parameter names clash with the table's columns: {sorted(clash)}")
    values = [method_columns(s) for s in specs]
    for k in METHOD_PARAMETERS:
        table[k] = pd.Series([v[k] for v in values], index=table.index, dtype=object)
    return table


def runs_table(configs: Iterable[RunConfig], root: str | os.PathLike | None = None) -> pd.DataFrame:
    """One tidy row per finished run: identifying columns, the summary numbers, and one column per
    method parameter (`METHOD_PARAMETERS`; None where the run's method does not have it)."""
    rows, specs = [], []
    for c in configs:
        payload = load_run(c, root)
        s = payload["summary"]
        rows.append({**_row(c), "final_accuracy": s["final_accuracy"], "mean_last_accuracy": s["mean_last_accuracy"],
                     "final_loss": s["final_loss"], "collapsed": s["collapsed"], "collapse_round": s["collapse_round"],
                     "accuracy_before_collapse": s.get("accuracy_before_collapse"),
                     "server_memory_bytes": s["server_memory_bytes"], "wall_time": s["wall_time"],
                     "device": payload["provenance"]["device"]})
        specs.append(c.method)
    return _with_method_columns(pd.DataFrame(rows), specs)


def history_table(configs: Iterable[RunConfig], root: str | os.PathLike | None = None) -> pd.DataFrame:
    """One tidy row per (run, round): the accuracy curves, with the identifying and method
    parameter columns of `runs_table`."""
    frames, specs = [], []
    for c in configs:
        h = pd.DataFrame(load_run(c, root)["history"])
        for k, v in _row(c).items():
            h[k] = v
        frames.append(h)
        specs += [c.method] * len(h)
    if not frames:
        return pd.DataFrame()
    return _with_method_columns(pd.concat(frames, ignore_index=True), specs)
