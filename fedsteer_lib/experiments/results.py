"""The results cache: one JSON file per finished run under `data/results/runs/`, named by the
run's config key, holding the exact config, provenance, history, summary and extras.

Files are written atomically (temporary file + rename), so a crash never leaves a
half-written result; a run is computed only if its file is missing or not usable: a file that
does not parse (truncated, corrupted by hand) or that predates the current summary format (a
collapsed run without `accuracy_before_collapse`) is named in a warning, never counted, and
recomputed by the next sweep, which replaces it.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import os
import platform
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import torch

from ..simulator.engine import RunResult
from .config import METHODS, MethodSpec, Profile, RunConfig, get_profile

__all__ = ["RESULTS_DIR", "results_root", "run_path", "has_run", "result_problem", "save_run", "load_run", "provenance", "runs_table",
           "history_table", "load_runs", "METHOD_PARAMETERS", "method_columns"]

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


def _problem_of(payload: Any) -> str | None:
    if not isinstance(payload, dict) or not all(k in payload for k in ("config", "summary", "history")):
        return "not a run result (no config, summary and history)"
    summary = payload["summary"]
    if summary.get("collapsed") and "accuracy_before_collapse" not in summary:
        return ("a collapsed run stored before collapsed runs were scored on the model they end with "
                "(its final accuracy is the last one before the collapse)")
    return None


def _parse(path: str | Path) -> tuple[dict | None, str | None]:
    """(payload, None) for a usable result file, (None, why) otherwise."""
    try:
        with open(path) as f:
            payload = json.load(f)
    except FileNotFoundError:
        return None, "missing"
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        return None, f"unreadable ({type(err).__name__}: {err})"
    problem = _problem_of(payload)
    return (payload, None) if problem is None else (None, problem)


@functools.lru_cache(maxsize=None)
def _problem_of_file(path: str, mtime_ns: int, size: int) -> str | None:
    return _parse(path)[1]  # cached per version of the file: `status` and the sweep ask often


def _warn(path: Path, problem: str) -> None:
    warnings.warn(f"{path}: {problem}; not counted as a result, the sweep recomputes it", stacklevel=3)


def result_problem(config: RunConfig, root: str | os.PathLike | None = None) -> str | None:
    """Why the stored result of `config` cannot be used ("missing", "unreadable (...)", ...),
    or None when it can."""
    path = run_path(config, root)
    try:
        st = path.stat()
    except FileNotFoundError:
        return "missing"
    problem = _problem_of_file(str(path), st.st_mtime_ns, st.st_size)
    if problem is not None:
        _warn(path, problem)
    return problem


def has_run(config: RunConfig, root: str | os.PathLike | None = None) -> bool:
    """Whether a usable result of `config` is stored (see the module docstring)."""
    return result_problem(config, root) is None


def _code_version() -> str:
    repo = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(device: str) -> dict[str, Any]:
    """Code version, date, library versions and the device a result was computed on."""
    dev = device
    if device.startswith("cuda") and torch.cuda.is_available():
        dev = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return {"code_version": _code_version(), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "python": platform.python_version(), "device": dev,
            "machine": platform.machine(), "threads": torch.get_num_threads()}


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf become None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def save_run(result: RunResult, config: RunConfig, root: str | os.PathLike | None = None) -> Path:
    """Write one run atomically; returns its path."""
    path = run_path(config, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"key": config.key(), "config": config.to_dict(with_device=False),
               "provenance": {**provenance(config.device), "client_batch": config.client_batch},
               "summary": result.summary, "history": result.history, "extras": result.extras}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_clean(payload), f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_run(config: RunConfig, root: str | os.PathLike | None = None) -> dict[str, Any]:
    """The stored payload of a finished run (raises FileNotFoundError if it was never run)."""
    path = run_path(config, root)
    payload, problem = _parse(path)
    if problem == "missing":
        raise FileNotFoundError(f"no result for run {config.key()} ({config.method.label}, seed {config.seed}) at {path}")
    if payload is None:
        raise ValueError(f"the result of run {config.key()} ({config.method.label}, seed {config.seed}) at {path} is "
                         f"{problem}; `python -m fedsteer_lib sweep` recomputes it")
    return payload


def load_runs(configs: Iterable[RunConfig], root: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    return [load_run(c, root) for c in configs]


# Every parameter of any method (`config.METHODS`), in the order they first appear there: the
# tables below carry one column per parameter, so that a run's method is read from columns, never
# parsed back from its label.
METHOD_PARAMETERS: tuple[str, ...] = tuple(dict.fromkeys(k for params in METHODS.values() for k in params))


def method_columns(spec: MethodSpec) -> dict[str, Any]:
    """One entry per `METHOD_PARAMETERS`: the method's value (its default where the spec omits
    it), None for a parameter the method does not have."""
    own = METHODS[spec.name]
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
