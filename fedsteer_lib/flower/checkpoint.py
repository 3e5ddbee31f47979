"""The strategies' checkpoint file: plain data only, so that loading one cannot run code.

A checkpoint holds tensors, numbers, strings, None, and lists and dicts of them, nothing else:
`save_checkpoint` writes it with `torch.save` and `load_checkpoint` reads it with
`torch.load(..., weights_only=True)`, whose unpickler builds only those types and refuses
anything else (a crafted file naming a Python function is refused before anything in it runs).
The strategy's objects (its node table, the method's state dataclass, the sampling generator's
state, the model layout) are turned into plain data here (`to_plain`) and rebuilt from it in the
shape of objects the code makes itself (`from_plain`): the file names no class that is then
looked up, and every tensor must have the shape and dtype the method's own state has.

Writing is atomic (a temporary file in the same folder, flushed, renamed over the checkpoint),
and a failed write removes its temporary file. Every problem with a checkpoint file is one
`CheckpointError` line naming the file.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["FORMAT", "CheckpointError", "check_writable", "save_checkpoint", "load_checkpoint", "to_plain",
           "from_plain"]

FORMAT = 2  # 1: the strategy's objects pickled whole (no longer read: loading them could run code)
_SCALARS = (bool, int, float, str, type(None))


class CheckpointError(ValueError):
    """A checkpoint file that cannot be written or read; the message names the file."""


def check_writable(path: str | os.PathLike) -> Path:
    """Refuse a checkpoint path that cannot be written (a folder, a folder that cannot be made
    or written to) with one line, before anything is computed. Returns the path."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint_path {path} is a folder; give the checkpoint's file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CheckpointError(f"checkpoint_path {path}: cannot make its folder ({err.strerror or err})") from None
    probe = path.with_name(f".{path.name}.{os.getpid()}.probe")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as err:
        raise CheckpointError(f"checkpoint_path {path}: cannot write in {path.parent} ({err.strerror or err})") from None
    probe.unlink()
    return path


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write `payload` (plain data, see the module docstring) to `path` atomically: a reader,
    or a restart after a kill, sees the previous checkpoint or this one, never a torn file. A
    failed write (a full disk) removes its temporary file and raises CheckpointError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(err, OSError):
            raise CheckpointError(f"cannot write checkpoint {path}: {err.strerror or err}") from None
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The plain data of a checkpoint written by `save_checkpoint` (tensors, numbers, strings,
    lists and dicts); CheckpointError, naming the file, for anything else."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a folder, not a checkpoint file")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - whatever the bytes are, the answer is one line
        if "Weights only load failed" in str(err):  # torch's weights-only unpickler refused a global
            raise CheckpointError(
                f"checkpoint {path} is not plain data (tensors, numbers, strings, lists, dicts): the weights-only "
                f"loader refused it and nothing in it ran; it is corrupt, crafted, or of format 1, which held "
                f"Python objects and is no longer read") from None
        raise CheckpointError(f"checkpoint {path} is truncated or not a checkpoint file "
                              f"({type(err).__name__})") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        found = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
        raise CheckpointError(f"checkpoint {path} is not a checkpoint of fedsteer_lib.flower of format {FORMAT} "
                              f"(found {found!r})")
    return saved


def to_plain(value: Any) -> Any:
    """`value` as plain data: a dataclass becomes {"dataclass": its class name, "fields": {...}},
    tensors are kept (on the CPU), lists, tuples and dicts are converted item by item."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"dataclass": type(value).__qualname__,
                "fields": {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, _SCALARS):
        return value
    raise TypeError(f"a checkpoint cannot hold a {type(value).__name__}")


def _plain_data(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain_data(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _plain_data(v) for k, v in value.items())
    return isinstance(value, (*_SCALARS, torch.Tensor))


def from_plain(plain: Any, like: Any, where: str = "state") -> Any:
    """`plain` rebuilt in the shape of `like`, a value the code made (e.g. the method's fresh
    `init_state`): a dataclass must name `like`'s class and have its fields, a tensor must have
    `like`'s shape and dtype, a number or string `like`'s type; a list or dict of plain data
    with no template is kept as it is. Raises ValueError saying where the data differ."""
    if dataclasses.is_dataclass(like) and not isinstance(like, type):
        names = [f.name for f in dataclasses.fields(like)]
        if not (isinstance(plain, dict) and plain.get("dataclass") == type(like).__qualname__
                and isinstance(plain.get("fields"), dict) and sorted(plain["fields"]) == sorted(names)):
            raise ValueError(f"{where} is not a {type(like).__qualname__} with fields {names}")
        values = {n: from_plain(plain["fields"][n], getattr(like, n), f"{where}.{n}") for n in names}
        return dataclasses.replace(like, **values)
    if isinstance(like, torch.Tensor):
        if not (isinstance(plain, torch.Tensor) and plain.shape == like.shape and plain.dtype == like.dtype):
            got = f"{plain.dtype}{list(plain.shape)}" if isinstance(plain, torch.Tensor) else type(plain).__name__
            raise ValueError(f"{where} is {got}, expected {like.dtype}{list(like.shape)}")
        return plain
    if isinstance(like, (list, dict)):
        if not (isinstance(plain, type(like)) and _plain_data(plain)):
            raise ValueError(f"{where} is not a {type(like).__name__} of plain data")
        return plain
    if like is None:
        ok = plain is None
    elif isinstance(like, bool):
        ok = isinstance(plain, bool)
    elif isinstance(like, (int, float)):  # an int where a float is expected is fine, a bool never
        ok = isinstance(plain, type(like) if isinstance(like, int) else (int, float)) and not isinstance(plain, bool)
    elif isinstance(like, str):
        ok = isinstance(plain, str)
    else:
        raise TypeError(f"{where}: cannot rebuild a {type(like).__name__} from a checkpoint")
    if not ok:
        raise ValueError(f"{where} is {type(plain).__name__}, expected {type(like).__name__}")
    return plain
