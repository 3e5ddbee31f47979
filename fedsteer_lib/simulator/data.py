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
  They are read by a restricted unpickler (`data_files.read_cifar_batch`) that builds only what
  the real files hold, so a crafted file placed where the loader looks runs no code.

The file formats themselves (IDX, CIFAR-10's batches) are read by `data_files`.
"""

from __future__ import annotations

import functools
import gzip
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from .data_files import check_arrays, cifar_arrays, read_idx

DATASETS = ("fmnist", "emnist", "cifar10")
EMNIST_SPLITS = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}
REPO_DATA_DIR = Path(__file__).resolve().parents[2] / "data"
DEBIAN_FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
APT_COMMAND = "sudo apt-get install -y dataset-fashion-mnist"
CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)

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


@functools.lru_cache(maxsize=4)
def _read_folder(name: str, folder: Path, split: str, version: tuple = ()) -> DatasetSplits:
    """Read and check all files of ``name`` in ``folder`` (a located layout folder); cached per
    `version` (`_folder_version`: the files' sizes and times)."""
    if name == "cifar10":
        train = [cifar_arrays(folder / f) for f in CIFAR_FILES[:-1]]
        arrays = {"train": (np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])),
                  "test": cifar_arrays(folder / CIFAR_FILES[-1])}
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
            check_arrays(images, labels, (28, 28), num_classes, image_file, label_file)
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
