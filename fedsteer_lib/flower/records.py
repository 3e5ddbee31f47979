"""Flower's records and the flat vectors the server strategies compute on.

A model travels as an `ArrayRecord` (any PyTorch model: `ArrayRecord(model.state_dict())`).
The server strategies (`fedsteer_lib.strategy`) compute on one flat float32 vector w of length
d: the record's floating-point arrays, flattened and concatenated in the record's key order.
Arrays that are not floating point (BatchNorm's `num_batches_tracked`) are no part of w: the
server keeps the values of the model it started from and sends them unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

__all__ = ["Layout"]


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
        """w: the floating-point arrays of `record`, flattened in this layout's order (float32).
        Raises ValueError when an array's data is not of its layout's shape (a record's shape
        field and its data can disagree in a record someone crafted)."""
        parts = []
        for j in self._floating():
            array = np.asarray(record[self.keys[j]].numpy())
            if tuple(array.shape) != self.shapes[j]:
                raise ValueError(f"array {self.keys[j]!r} holds data of shape {tuple(array.shape)}, "
                                 f"expected {self.shapes[j]}")
            parts.append(array.astype(np.float32, copy=False).reshape(-1))
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

    # --- in a checkpoint: plain lists and strings ---------------------------------------------
    def to_plain(self) -> dict[str, Any]:
        return {"keys": list(self.keys), "shapes": [list(s) for s in self.shapes], "dtypes": list(self.dtypes)}

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> Layout:
        return cls(tuple(str(k) for k in plain["keys"]), tuple(tuple(int(n) for n in s) for s in plain["shapes"]),
                   tuple(str(d) for d in plain["dtypes"]))

    def fixed_to_plain(self, fixed: ArrayRecord) -> dict[str, torch.Tensor]:
        """The arrays that are not floating point (the ones `record` takes from `fixed`), as tensors."""
        floating = set(self._floating())
        return {key: torch.from_numpy(np.array(fixed[key].numpy())) for j, key in enumerate(self.keys)
                if j not in floating}

    def fixed_from_plain(self, plain: dict[str, torch.Tensor]) -> ArrayRecord:
        """`fixed_to_plain`'s arrays back as a record; each must have its layout's shape and dtype."""
        floating = set(self._floating())
        wanted = {key: (self.shapes[j], self.dtypes[j]) for j, key in enumerate(self.keys) if j not in floating}
        if set(plain) != set(wanted):
            raise ValueError(f"fixed arrays {sorted(plain)}, expected {sorted(wanted)}")
        arrays = {}
        for key, (shape, dtype) in wanted.items():
            array = plain[key].numpy()
            if tuple(array.shape) != shape or str(array.dtype) != dtype:
                raise ValueError(f"fixed array {key!r} is {array.dtype}{list(array.shape)}, expected {dtype}{list(shape)}")
            arrays[key] = Array(array)
        return ArrayRecord(arrays)
