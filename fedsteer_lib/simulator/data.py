"""Loading Fashion-MNIST, EMNIST and CIFAR-10 from local files (one reading path).

Each data set comes back as a :class:`DatasetSplits`: uint8 images (n, C, H, W) (1x28x28 for
the MNIST family, 3x32x32 for CIFAR-10) and int64 labels in 0..num_classes-1.

Search order (:func:`search_dirs`): explicit ``root``; ``$FEDSTEER_DATA``; the repository's
``data/``; for Fashion-MNIST ``/usr/share/datasets/fashion-mnist/`` (Debian package). Only if
allowed (``download=True``, or ``FEDSTEER_ALLOW_DOWNLOAD=1`` when ``download is None``)
torchvision downloads the files, which are then read back by the same readers.

Accepted layouts inside each searched directory:

* Fashion-MNIST: ``train-images-idx3-ubyte[.gz]``, ``train-labels-idx1-ubyte[.gz]``,
  ``t10k-images-idx3-ubyte[.gz]``, ``t10k-labels-idx1-ubyte[.gz]`` directly, in
  ``FashionMNIST/raw/`` (torchvision) or in ``fashion-mnist/``.
* EMNIST: ``emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz]`` directly,
  in ``gzip/`` (NIST's zip) or in ``EMNIST/raw/`` (torchvision). The IDX files store each
  image transposed (column-major); we transpose them back so characters are upright.
  ``letters`` labels are stored as 1..26 and are shifted to 0..25.
* CIFAR-10: the python pickle batches ``data_batch_1..5`` and ``test_batch`` in
  ``cifar-10-batches-py/``. Rows are R, G, B planes of 32x32, so they reshape to (3, 32, 32).
  They are read by a restricted unpickler (`read_cifar_batch`) that builds only what the real
  files hold (dicts, lists, bytes, str, numbers and numpy arrays), so a crafted file placed
  where the loader looks runs no code: it is "not a CIFAR-10 python batch", in one line.
"""

from __future__ import annotations

import functools
import gzip
import os
import pickle
import shutil
import subprocess
import sys
import warnings
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

DATASETS = ("fmnist", "emnist", "cifar10")
EMNIST_SPLITS = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}
REPO_DATA_DIR = Path(__file__).resolve().parents[2] / "data"
DEBIAN_FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
APT_COMMAND = "sudo apt-get install -y dataset-fashion-mnist"
CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_SUBDIRS = {"fmnist": ("", "FashionMNIST/raw", "fashion-mnist"), "emnist": ("", "gzip", "EMNIST/raw"),
            "cifar10": ("cifar-10-batches-py",)}
_WHERE = {"fmnist": "plain or .gz, directly in the directory, in FashionMNIST/raw/ or in fashion-mnist/",
          "emnist": "plain or .gz, directly in the directory, in gzip/ or in EMNIST/raw/",
          "cifar10": "in cifar-10-batches-py/"}


class DatasetNotFoundError(FileNotFoundError):
    """A data set is in none of the searched directories (and was not downloaded)."""


@dataclass(frozen=True)
class DatasetSplits:
    """Train and test split of one data set, images uint8 (n, C, H, W), labels int64 (n,)."""

    name: str
    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    num_classes: int
    source: str  # the directory the files were read from, or "download:<dir>"


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


def _check_name(name: str, split: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; allowed: {', '.join(DATASETS)}")
    if name == "emnist" and split not in EMNIST_SPLITS:
        raise ValueError(f"unknown EMNIST split {split!r}; allowed: {', '.join(EMNIST_SPLITS)}")


def _file_names(name: str, split: str) -> dict[str, str]:
    """Keys train_images/train_labels/test_images/test_labels -> file name (without .gz)."""
    if name == "cifar10":
        return {f: f for f in CIFAR_FILES}
    prefix = f"emnist-{split}-" if name == "emnist" else ""
    tags = {"train": "train", "test": "test" if name == "emnist" else "t10k"}
    return {f"{s}_{k}": f"{prefix}{tags[s]}-{k}-idx{3 if k == 'images' else 1}-ubyte"
            for s in ("train", "test") for k in ("images", "labels")}


def _find_file(folder: Path, fname: str, allow_gz: bool = True) -> Path | None:
    candidates = (folder / fname, folder / f"{fname}.gz")[: 2 if allow_gz else 1]
    return next((c for c in candidates if c.is_file()), None)


def _locate(name: str, split: str, directory: Path) -> Path | None:
    """The folder under ``directory`` (one of the accepted layouts) holding all files, or None."""
    for sub in _SUBDIRS[name]:
        folder = directory / sub if sub else directory
        if all(_find_file(folder, f, name != "cifar10") for f in _file_names(name, split).values()):
            return folder
    return None


def search_dirs(name: str, root: str | os.PathLike | None = None) -> list[Path]:
    """The directories searched for ``name``, in order (duplicates dropped). An empty
    ``FEDSTEER_DATA`` is no directory (`data_env_problem` says so)."""
    _check_name(name, "balanced")
    dirs = [Path(root).expanduser()] if root is not None else []
    if os.environ.get("FEDSTEER_DATA"):
        dirs.append(Path(os.environ["FEDSTEER_DATA"]).expanduser())
    dirs.append(Path(REPO_DATA_DIR))
    if name == "fmnist":
        dirs.append(Path(DEBIAN_FMNIST_DIR))
    return list(dict.fromkeys(dirs))


def data_env_problem(name: str, split: str = "balanced") -> str | None:
    """Why ``$FEDSTEER_DATA``, when it is set, gives ``name`` nothing (None when it holds the
    data set's files, or is not set): set but empty, no such directory, or none of the files."""
    if "FEDSTEER_DATA" not in os.environ:
        return None
    value = os.environ["FEDSTEER_DATA"]
    if not value.strip():
        return "FEDSTEER_DATA is set but empty, so it names no directory (unset it, or set it to the data's folder)"
    folder = Path(value).expanduser()
    if not folder.exists():
        return f"FEDSTEER_DATA={value}: no such directory"
    if not folder.is_dir():
        return f"FEDSTEER_DATA={value}: is a file, not a directory"
    _check_name(name, split)
    if _locate(name, split if name == "emnist" else "", folder) is None:
        return (f"FEDSTEER_DATA={value} holds no {name} files "
                f"({', '.join(_file_names(name, split if name == 'emnist' else '').values())}; {_WHERE[name]})")
    return None


def _check(images: np.ndarray, labels: np.ndarray, shape: tuple, num_classes: int,
           image_file: Path, label_file: Path) -> None:
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


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = read_cifar_batch(path)
    try:
        data, labels = np.asarray(batch[b"data"]), np.asarray(batch[b"labels"], dtype=np.int64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: not a CIFAR-10 python batch (its data or labels are not arrays: {err})") from None
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"{path}: data {data.dtype} {data.shape}, expected uint8 (n, 3072)")
    images = data.reshape(-1, 3, 32, 32)
    _check(images, labels, (3, 32, 32), 10, path, path)
    return images, labels


@functools.lru_cache(maxsize=4)
def _read_folder(name: str, folder: Path, split: str, version: tuple = ()) -> DatasetSplits:
    """Read and check all files of ``name`` in ``folder`` (a located layout folder); cached per
    `version` (`_folder_version`: the files' sizes and times)."""
    if name == "cifar10":
        train = [_read_cifar_batch(folder / f) for f in CIFAR_FILES[:-1]]
        arrays = {"train": (np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])),
                  "test": _read_cifar_batch(folder / CIFAR_FILES[-1])}
        num_classes = 10
    else:
        num_classes = EMNIST_SPLITS[split] if name == "emnist" else 10
        arrays, names = {}, _file_names(name, split)
        for s in ("train", "test"):
            image_file, label_file = (_find_file(folder, names[f"{s}_{k}"]) for k in ("images", "labels"))
            images, labels = read_idx(image_file), read_idx(label_file).astype(np.int64)
            if name == "emnist":
                images = images.transpose(0, 2, 1) if images.ndim == 3 else images  # stored transposed
                labels = labels - 1 if split == "letters" else labels  # letters are 1..26
            _check(images, labels, (28, 28), num_classes, image_file, label_file)
            arrays[s] = (np.ascontiguousarray(images)[:, None], labels)
    tensors = {s: (torch.from_numpy(x), torch.from_numpy(y)) for s, (x, y) in arrays.items()}
    return DatasetSplits(name, *tensors["train"], *tensors["test"], num_classes, str(folder))


def _missing_message(name: str, split: str, dirs: list[Path], note: str = "") -> str:
    title = {"fmnist": "Fashion-MNIST", "emnist": f"EMNIST (split {split!r})", "cifar10": "CIFAR-10"}[name]
    lines = [f"{title} data set {name!r} not found. Looked in, in order:"]
    lines += [f"  {i}. {d}" for i, d in enumerate(dirs, 1)]
    lines.append(f"Expected files: {', '.join(_file_names(name, split).values())} ({_WHERE[name]}).")
    if name == "fmnist":
        lines += ["Get it with (Debian/Ubuntu):", f"  {APT_COMMAND}",
                  "or let torchvision download it into data/ (needs internet):", "  export FEDSTEER_ALLOW_DOWNLOAD=1"]
    else:
        lines += ["Let torchvision download it (needs internet):", "  export FEDSTEER_ALLOW_DOWNLOAD=1",
                  f"or put the files above in $FEDSTEER_DATA or {REPO_DATA_DIR}."]
    return "\n".join(lines + ([note] if note else []))


def _download_dir() -> Path | None:
    """First writable (creatable) of $FEDSTEER_DATA and the repository's data/."""
    env = os.environ.get("FEDSTEER_DATA")
    for d in ([Path(env).expanduser()] if env else []) + [Path(REPO_DATA_DIR)]:
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            return d
    return None


def _download(name: str, split: str, target: Path) -> None:
    import torchvision.datasets as tvd  # looked up at call time (tests replace these classes)

    cls = getattr(tvd, {"fmnist": "FashionMNIST", "emnist": "EMNIST", "cifar10": "CIFAR10"}[name])
    cls(root=str(target), train=True, download=True, **({"split": split} if name == "emnist" else {}))


def _first_found(name: str, split: str, dirs: list[Path]) -> Path | None:
    return next((f for f in (_locate(name, split, d) for d in dirs) if f is not None), None)


def find_dataset(name: str, split: str = "balanced") -> Path | None:
    """The folder `load_dataset` would read ``name`` from, None when none of the searched folders
    (`search_dirs`) holds its files: it only looks, it reads nothing (`dataset_status` reads)."""
    _check_name(name, split)
    return _first_found(name, split if name == "emnist" else "", search_dirs(name))


@dataclass(frozen=True)
class DatasetStatus:
    """What `dataset_status` found: `status` is "ok", "missing" or "corrupt"; `folder` the
    folder the loader reads (None when missing); `detail` the problem in one line; `notes` what
    the user should know even when the data is fine (a `FEDSTEER_DATA` that gives nothing)."""

    name: str
    status: str
    folder: Path | None
    detail: str
    searched: tuple[Path, ...]
    notes: tuple[str, ...] = ()


def dataset_status(name: str, split: str = "balanced") -> DatasetStatus:
    """Locate ``name`` as `load_dataset` would and read every file of it for real (IDX magic,
    header and size, image shape, label range; CIFAR-10's batches): a file that is there but
    unusable makes the data set "corrupt", with the file and the fault. About a second for
    Fashion-MNIST, so `data` and `doctor` run it every time."""
    _check_name(name, split)
    split = split if name == "emnist" else ""
    dirs = search_dirs(name)
    env = data_env_problem(name, split or "balanced")
    notes = (env,) if env else ()
    folder = _first_found(name, split, dirs)
    if folder is None:
        return DatasetStatus(name, "missing", None, "not found in " + ", ".join(map(str, dirs)), tuple(dirs), notes)
    try:
        _read_folder(name, folder.resolve(), split, _folder_version(name, split, folder.resolve()))
    except (ValueError, OSError) as err:
        return DatasetStatus(name, "corrupt", folder, str(err), tuple(dirs), notes)
    return DatasetStatus(name, "ok", folder, str(folder), tuple(dirs), notes)


def _folder_version(name: str, split: str, folder: Path) -> tuple:
    """(size, mtime) of every file the loader reads in ``folder``: a file replaced on disk is read again."""
    out = []
    for fname in _file_names(name, split).values():
        path = _find_file(folder, fname, name != "cifar10")
        st = path.stat() if path is not None else None
        out.append((fname, st.st_size if st else None, st.st_mtime_ns if st else None))
    return tuple(out)


def load_dataset(name: str, root: str | os.PathLike | None = None, *, split: str = "balanced",
                 download: bool | None = None) -> DatasetSplits:
    """Load ``name`` ("fmnist", "emnist" with ``split``, "cifar10") from the first searched dir holding it.

    ``download=None`` means: download only if ``FEDSTEER_ALLOW_DOWNLOAD=1``. Raises
    DatasetNotFoundError (listing the searched dirs and how to get the data) if it is missing,
    ValueError on unknown names/splits or corrupt files. Returned tensors are fresh copies.
    """
    _check_name(name, split)
    split = split if name == "emnist" else ""
    dirs = search_dirs(name, root)
    env = data_env_problem(name, split or "balanced")
    if env and root is None:
        warnings.warn(f"{env}; looking in the other folders", stacklevel=2)
    folder, source = _first_found(name, split, dirs), ""
    if folder is None:
        if not (download if download is not None else os.environ.get("FEDSTEER_ALLOW_DOWNLOAD") == "1"):
            raise DatasetNotFoundError(_missing_message(name, split, dirs))
        target, note = _download_dir(), "Download: no writable directory."
        if target is not None:
            try:
                _download(name, split, target)
                folder, note = _locate(name, split, target), f"Download into {target} left no usable files."
            except Exception as err:  # network, checksum, disk: all reported in one message
                note = f"Download into {target} failed: {err!r}"
        if folder is None:
            raise DatasetNotFoundError(_missing_message(name, split, dirs, note))
        source = f"download:{folder}"
    data = _read_folder(name, folder.resolve(), split, _folder_version(name, split, folder.resolve()))
    copies = {f: getattr(data, f).clone() for f in ("train_images", "train_labels", "test_images", "test_labels")}
    return replace(data, **copies, source=source or str(folder))


def ensure_fashion_mnist(verbose: bool = True) -> Path:
    """Make Fashion-MNIST available (set-up step) and return the folder holding its files,
    read and checked (`dataset_status`).

    Found and sound in the search dirs: return that folder. Found but corrupt: raise
    DatasetCorruptError naming the file and the fix. Not found: as root with apt-get, install
    the Debian package (``apt-get update`` and retry once on failure); else print (to stderr)
    what to run and raise DatasetNotFoundError. ``verbose=False`` silences apt-get's output.
    """
    found = dataset_status("fmnist")
    for note in found.notes:
        print(f"note: {note}", file=sys.stderr)
    if found.status == "corrupt":
        raise DatasetCorruptError(_corrupt_message(found))
    if found.status == "ok":
        return found.folder
    dirs, note = list(found.searched), ""
    if shutil.which("apt-get") and getattr(os, "geteuid", lambda: -1)() == 0:
        install = ["apt-get", "install", "-y", "dataset-fashion-mnist"]
        quiet = {} if verbose else {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        if subprocess.run(install, check=False, **quiet).returncode != 0:
            subprocess.run(["apt-get", "update"], check=False, **quiet)
            subprocess.run(install, check=False, **quiet)
        found = dataset_status("fmnist")
        if found.status == "ok":
            return found.folder
        if found.status == "corrupt":
            raise DatasetCorruptError(_corrupt_message(found))
        note = f"`{' '.join(install)}` (as root) did not provide the files in {DEBIAN_FMNIST_DIR}."
    message = _missing_message("fmnist", "", dirs, note)
    print(message, file=sys.stderr)
    raise DatasetNotFoundError(message)


class DatasetCorruptError(ValueError):
    """A data set's files are where the loader looks, but cannot be used."""


def _corrupt_message(found: DatasetStatus) -> str:
    fix = (f"replace or remove the files in {found.folder}"
           + (" (or unset FEDSTEER_DATA)" if os.environ.get("FEDSTEER_DATA") and found.folder is not None
              and Path(os.environ["FEDSTEER_DATA"]).expanduser() in (found.folder, *found.folder.parents) else "")
           + ("; Debian's copy: apt-get install --reinstall dataset-fashion-mnist" if found.name == "fmnist" else ""))
    return f"{found.name} is corrupt: {found.detail}; fix: {fix}"
