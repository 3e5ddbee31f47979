"""The data sets' file formats, read without trusting them: IDX files (Fashion-MNIST, EMNIST),
plain or gzip, and CIFAR-10's python batches, unpickled by a restricted unpickler that builds only
what the real files hold (dicts, lists, bytes, str, numbers and numpy arrays), so a crafted file
runs no code: it is "not a CIFAR-10 python batch", in one line naming it."""
from __future__ import annotations

import gzip
import os
import pickle
import zlib
from pathlib import Path

import numpy as np

__all__ = ["read_idx", "read_cifar_batch", "cifar_arrays", "check_arrays"]

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (plain or gzip, any IDX dtype) into a native-endian array.

    ValueError on a bad magic number, a corrupt gzip stream, or a size not matching the header.
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise ValueError(f"{path}: corrupt gzip data ({err})") from err
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in _IDX_DTYPES or raw[3] == 0:
        raise ValueError(f"{path}: not an IDX file (magic bytes {raw[:4].hex() or 'missing'})")
    ndim, header = raw[3], 4 + 4 * raw[3]
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = header + int(np.prod(dims)) * dtype.itemsize
    if len(raw) != expected:
        problem = "truncated" if len(raw) < expected else "trailing bytes"
        raise ValueError(f"{path}: {problem}: {len(raw)} bytes, expected {expected} for shape {dims}")
    return np.frombuffer(raw, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def check_arrays(images: np.ndarray, labels: np.ndarray, shape: tuple, num_classes: int,
           image_file: Path, label_file: Path) -> None:
    """ValueError (naming the files) unless images are uint8 (n, *shape) and labels n ints in [0, num_classes)."""
    if images.dtype != np.uint8 or images.shape[1:] != shape:
        raise ValueError(f"{image_file}: images {images.dtype} {images.shape}, expected uint8 (n, {shape})")
    if labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"{image_file}, {label_file}: {len(images)} images but labels shaped {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"{label_file}: labels in [{labels.min()}, {labels.max()}], expected 0..{num_classes - 1}")


def _numpy_reconstruct():
    try:  # numpy >= 2 (pickles name numpy._core; those of numpy 1 and of the real files numpy.core)
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


# The only globals a CIFAR-10 python batch refers to: its numpy array is pickled as
# _reconstruct(ndarray, shape, dtype) and a state holding a dtype (numpy 1 and the files as
# distributed name the module numpy.core.multiarray, numpy 2 numpy._core.multiarray). Everything
# else in a batch (dict, list, bytes, str, int) needs no global at all.
_CIFAR_GLOBALS = {("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct,
                  ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct,
                  ("numpy", "ndarray"): lambda: np.ndarray,
                  ("numpy", "dtype"): lambda: np.dtype}


class _CifarUnpickler(pickle.Unpickler):
    """Builds dicts, lists, bytes, str, numbers and numpy arrays, nothing else: any other global
    (os.system, builtins.eval, a class whose __reduce__ runs code) is refused before it is called."""

    def find_class(self, module: str, name: str):
        found = _CIFAR_GLOBALS.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR-10 batch never holds")
        return found()

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it refers to a persistent object, which a CIFAR-10 batch never holds")


def read_cifar_batch(path: str | os.PathLike) -> dict:
    """The dict of one CIFAR-10 python batch file, unpickled with only the globals the real files
    use (`_CIFAR_GLOBALS`): a file that needs any other is refused without running anything.
    ValueError (one line, naming the file) for anything that is not such a batch."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            batch = _CifarUnpickler(f, encoding="bytes").load()
    except OSError:
        raise
    except Exception as err:  # unpickling garbage can raise nearly anything
        reason = " ".join(str(err).split()) or type(err).__name__
        raise ValueError(f"{path}: not a CIFAR-10 python batch ({reason})") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        kind = f"a dict with keys {sorted(map(repr, batch))[:4]}" if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"{path}: not a CIFAR-10 python batch (it holds {kind}, not data and labels)")
    return batch


def cifar_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The images (n, 3, 32, 32) and labels of one CIFAR-10 batch file, checked."""
    batch = read_cifar_batch(path)
    try:
        data, labels = np.asarray(batch[b"data"]), np.asarray(batch[b"labels"], dtype=np.int64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: not a CIFAR-10 python batch (its data or labels are not arrays: {err})") from None
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"{path}: data {data.dtype} {data.shape}, expected uint8 (n, 3072)")
    images = data.reshape(-1, 3, 32, 32)
    check_arrays(images, labels, (3, 32, 32), 10, path, path)
    return images, labels
