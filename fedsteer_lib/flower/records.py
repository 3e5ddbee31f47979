"""Flower's records and the flat vectors the server strategies compute on; the checkpoint file.

A model travels as an `ArrayRecord` (any PyTorch model: `ArrayRecord(model.state_dict())`).
The server strategies (`fedsteer_lib.strategy`) compute on one flat float32 vector w of length
d: the record's floating-point arrays, flattened and concatenated in the record's key order.
Arrays that are not floating point (BatchNorm's `num_batches_tracked`) are no part of w: the
server keeps the values of the model it started from and sends them unchanged.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

__all__ = ["Layout", "save_checkpoint", "load_checkpoint"]


@dataclass(frozen=True)
class Layout:
    """The arrays of a model record: names, shapes and dtypes, in the record's order."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @classmethod
    def of(cls, record: ArrayRecord) -> Layout:
        arrays = [record[k] for k in record.keys()]
        return cls(tuple(record.keys()), tuple(tuple(a.shape) for a in arrays), tuple(str(a.dtype) for a in arrays))

    def _floating(self) -> list[int]:
        return [j for j, dt in enumerate(self.dtypes) if np.dtype(dt).kind == "f"]

    @property
    def dim(self) -> int:
        """d: the number of floating-point entries."""
        return sum(int(np.prod(self.shapes[j], dtype=np.int64)) for j in self._floating())

    def mismatch(self, record: ArrayRecord) -> str | None:
        """Why `record` does not hold this model (None when it does)."""
        if tuple(record.keys()) != self.keys and set(record.keys()) != set(self.keys):
            return f"arrays {sorted(record.keys())}, expected {sorted(self.keys)}"
        for key, shape in zip(self.keys, self.shapes):
            if tuple(record[key].shape) != shape:
                return f"array {key!r} has shape {tuple(record[key].shape)}, expected {shape}"
        return None

    def flat(self, record: ArrayRecord) -> torch.Tensor:
        """w: the floating-point arrays of `record`, flattened in this layout's order (float32)."""
        parts = [record[self.keys[j]].numpy().astype(np.float32, copy=False).reshape(-1) for j in self._floating()]
        return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, np.float32))

    def record(self, flat: torch.Tensor, fixed: ArrayRecord | None) -> ArrayRecord:
        """The record of vector `flat` (its floating-point arrays, in their own dtypes) with the
        other arrays taken from `fixed` (None: the floating-point arrays only)."""
        values = flat.detach().cpu().numpy()
        floating, start, arrays = set(self._floating()), 0, {}
        for j, (key, shape, dtype) in enumerate(zip(self.keys, self.shapes, self.dtypes)):
            if j in floating:
                size = int(np.prod(shape, dtype=np.int64))
                arrays[key] = Array(values[start:start + size].reshape(shape).astype(dtype))
                start += size
            elif fixed is not None:
                arrays[key] = Array(fixed[key].numpy())
        return ArrayRecord(arrays)


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write `payload` to `path` atomically: a temporary file in the same folder, flushed to
    disk, then renamed over `path`, so a reader (or a restart after a kill) sees the previous
    checkpoint or this one, never a torn file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint written by `save_checkpoint` (our own file: it holds the strategy's state
    objects, so it is unpickled in full)."""
    return torch.load(Path(path), weights_only=False)
