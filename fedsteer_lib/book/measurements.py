"""A chapter's own measurements as results, like runs: committed, keyed by what they depend on,
computed only when missing, and verifiable.

Chapters 3 and 4 measure things no run records (the variance of a rule over participation
draws at several seeds, the core-set search replayed and compared with other selections). The
chapter keeps the computation in view; `measure` stores what it returns under
`<results>/measurements/<name>/<key>.json`, the key being a hash of the measurement's `inputs`
and of the source of the functions that compute it (`code`), so that a changed input or a
changed function is a new measurement, never a stale one. It is computed with the kernels a run
gets (`numerics.kernels_for_run`: pinned, one thread, in the paper profile), and the file holds
the value, its inputs and the provenance of the process that computed it (code version, machine,
kernels).

Values are JSON with four tagged forms read back as they were written: pandas DataFrames, numpy
arrays, torch tensors and tuples; nothing read from a file runs code. Set the environment
variable FEDSTEER_RECOMPUTE=1 to recompute every measurement a chapter reads and compare it with
the stored one: `MeasurementChanged` names the first value that differs.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch

from .. import numerics
from ..experiments.results import provenance
from .context import NO_COMPUTE_ENV, ComputeForbidden

__all__ = ["measure", "encode", "decode", "MeasurementChanged", "RECOMPUTE_ENV"]

RECOMPUTE_ENV = "FEDSTEER_RECOMPUTE"


class MeasurementChanged(RuntimeError):
    """A recomputed measurement differs from the stored one."""


def encode(value: Any) -> Any:
    """`value` as JSON-able data: DataFrames, arrays, tensors and tuples tagged, floats exact."""
    if isinstance(value, pd.DataFrame):
        return {"__frame__": encode(value.to_dict(orient="split"))}
    if isinstance(value, torch.Tensor):
        return {"__tensor__": encode(value.detach().cpu().numpy())}
    if isinstance(value, np.ndarray):
        return {"__array__": encode(value.tolist()), "dtype": str(value.dtype), "shape": list(value.shape)}
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if math.isfinite(v) else {"__float__": repr(v)}
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if value is None or isinstance(value, (str, int, bool)):
        return value
    raise TypeError(f"a measurement cannot store a {type(value).__name__}; return frames, arrays, tensors, numbers, "
                    "strings, lists, tuples or dicts")


def decode(data: Any) -> Any:
    """The value `encode` wrote (only the four tags are interpreted)."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "__frame__" in data:
        split = decode(data["__frame__"])
        return pd.DataFrame(split["data"], index=split["index"], columns=split["columns"])
    if "__array__" in data:
        return np.asarray(decode(data["__array__"]), dtype=np.dtype(data["dtype"])).reshape(data["shape"])
    if "__tensor__" in data:
        return torch.from_numpy(np.array(decode(data["__tensor__"])))
    if "__tuple__" in data:
        return tuple(decode(v) for v in data["__tuple__"])
    if "__float__" in data:
        return float(data["__float__"])
    return {k: decode(v) for k, v in data.items()}


def _source(fn: Callable) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return repr(fn)


def _key(name: str, inputs: dict[str, Any], code: Sequence[Callable]) -> str:
    blob = json.dumps({"name": name, "inputs": encode(inputs), "code": [_source(f) for f in code]}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _first_difference(a: Any, b: Any, path: str = "value") -> str | None:
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: present in one only"
            diff = _first_difference(a[k], b[k], f"{path}.{k}")
            if diff:
                return diff
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} entries"
        for i, (x, y) in enumerate(zip(a, b)):
            diff = _first_difference(x, y, f"{path}[{i}]")
            if diff:
                return diff
        return None
    return None if a == b else f"{path}: stored {a!r}, recomputed {b!r}"


def measure(book, name: str, compute: Callable[[], Any], *, inputs: dict[str, Any],
            code: Sequence[Callable] = ()) -> Any:
    """The value of measurement `name`: read from `book`'s results when stored under the key of
    `inputs` and `code`, else `compute()`, stored, and returned (as `decode` reads it back, so a
    fresh and a stored value are the same objects). With FEDSTEER_RECOMPUTE=1, computed anyway
    and compared with the stored value (MeasurementChanged on any difference)."""
    key = _key(name, inputs, code)
    path = Path(book.root) / "measurements" / name / f"{key}.json"
    stored = None
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not a stored measurement ({err})") from None
        if not isinstance(stored, dict) or stored.get("key") != key or "value" not in stored:
            raise ValueError(f"{path}: not the measurement {name!r} with key {key}")
        if os.environ.get(RECOMPUTE_ENV) != "1":
            return decode(stored["value"])
    elif os.environ.get(NO_COMPUTE_ENV) == "1":
        raise ComputeForbidden(f"measurement {name!r} is not in {path.parent} (key {key}), and {NO_COMPUTE_ENV}=1 "
                               "forbids computing it")
    with numerics.kernels_for_run(book.device):  # a run's kernels: pinned measurements keep their bits
        value = encode(compute())
    if stored is not None:
        diff = _first_difference(stored["value"], value)
        if diff:
            raise MeasurementChanged(f"{name} ({path}) recomputed differently: {diff}")
        return decode(value)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    payload = {"name": name, "key": key, "inputs": encode(inputs), "provenance": provenance(book.device),
               "value": value}
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)
    return decode(value)
