"""Tests for fedsteer_lib.simulator.data: exact round trips of synthetic files in the real formats,
layouts, search order, missing-data messages, offline download path, corrupt files, and the
real Fashion-MNIST installed by the set-up."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets

from fedsteer_lib.simulator import data, data_files

REAL_DEBIAN_DIR = data.DEBIAN_FMNIST_DIR
FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IDX_CODES = {"u1": 0x08, "i1": 0x09, "i2": 0x0B, "i4": 0x0C, "f4": 0x0D, "f8": 0x0E}


def write_idx(path: Path, arr: np.ndarray, gz: bool = False) -> Path:
    """Write ``arr`` as an IDX file (independent of the reader under test)."""
    body = bytes([0, 0, IDX_CODES[arr.dtype.str[1:]], arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    body += arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    path = Path(f"{path}.gz") if gz else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(body) if gz else body)
    return path


def make_mnist_like(folder: Path, names: tuple[str, ...], gz: bool, seed: int = 0, num_classes: int = 10,
                    label_offset: int = 0, n_train: int = 7, n_test: int = 5) -> dict[str, np.ndarray]:
    """Random IDX images/labels under the four file ``names``; returns the arrays as written."""
    rng = np.random.default_rng(seed)
    arrays = {"train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
              "train_labels": rng.integers(0, num_classes, n_train).astype(np.uint8) + label_offset,
              "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
              "test_labels": rng.integers(0, num_classes, n_test).astype(np.uint8) + label_offset}
    for fname, arr in zip(names, arrays.values()):
        write_idx(folder / fname, arr.astype(np.uint8), gz)
    return arrays


def emnist_names(split: str) -> tuple[str, ...]:
    return tuple(f"emnist-{split}-{s}-{k}-ubyte" for s in ("train", "test") for k in ("images-idx3", "labels-idx1"))


def make_cifar(folder: Path, seed: int = 0, n: int = 3) -> dict[str, np.ndarray]:
    """CIFAR-10 python batches with ``n`` images each; returns expected (N, 3, 32, 32) arrays."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, list] = {"train_images": [], "train_labels": [], "test_images": [], "test_labels": []}
    for fname in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        labels = rng.integers(0, 10, n).tolist()
        # a row is the 1024 red values, then green, then blue, each plane row-major
        rows = np.stack([np.concatenate([img[0].ravel(), img[1].ravel(), img[2].ravel()]) for img in images])
        with open(folder / fname, "wb") as f:
            pickle.dump({b"batch_label": fname.encode(), b"labels": labels, b"data": rows}, f)
        key = "test" if fname == "test_batch" else "train"
        out[f"{key}_images"].append(images)
        out[f"{key}_labels"].append(np.array(labels))
    return {k: np.concatenate(v) for k, v in out.items()}


def assert_same(ds: data.DatasetSplits, expected: dict[str, np.ndarray]) -> None:
    for key, arr in expected.items():
        got = getattr(ds, key)
        want = torch.from_numpy(np.ascontiguousarray(arr[:, None] if arr.ndim == 3 else arr))
        want = want.to(torch.uint8 if "images" in key else torch.int64)
        assert got.dtype == want.dtype and torch.equal(got, want), key


def forbid(*args, **kwargs):
    raise AssertionError("a download was attempted")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No env vars, empty repo/Debian dirs, no cache, and any torchvision download fails the test."""
    monkeypatch.delenv("FEDSTEER_DATA", raising=False)
    monkeypatch.delenv("FEDSTEER_ALLOW_DOWNLOAD", raising=False)
    monkeypatch.setattr(data, "REPO_DATA_DIR", tmp_path / "repo_data")
    monkeypatch.setattr(data, "DEBIAN_FMNIST_DIR", tmp_path / "debian")
    for cls in ("FashionMNIST", "EMNIST", "CIFAR10"):
        monkeypatch.setattr(torchvision.datasets, cls, forbid)
    data._read_folder.cache_clear()
    yield
    data._read_folder.cache_clear()


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("dtype", list(IDX_CODES))
def test_read_idx_round_trip(tmp_path, dtype, gz):
    rng = np.random.default_rng(1)
    arr = (rng.normal(size=(3, 4, 5)) * 100).astype(dtype)
    out = data_files.read_idx(write_idx(tmp_path / "x-idx3", arr, gz))
    assert out.dtype == np.dtype(dtype) and out.shape == (3, 4, 5) and np.array_equal(out, arr)


@pytest.mark.parametrize("corrupt", ["magic", "dtype", "truncated", "trailing", "gzip", "empty"])
def test_read_idx_corrupt(tmp_path, corrupt):
    good = bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + bytes(range(10))
    raw = {"magic": b"\x01\x02" + good[2:], "dtype": good[:2] + b"\x07" + good[3:], "truncated": good[:-3],
           "trailing": good + b"\0", "gzip": gzip.compress(good)[:-6], "empty": b""}[corrupt]
    (tmp_path / "bad").write_bytes(raw)
    with pytest.raises(ValueError, match="bad"):
        data_files.read_idx(tmp_path / "bad")
    assert np.array_equal(data_files.read_idx(write_idx(tmp_path / "good", np.arange(10, dtype=np.uint8))), np.arange(10))


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("sub", ["", "FashionMNIST/raw", "fashion-mnist"])
def test_fmnist_layouts(tmp_path, sub, gz):
    folder = tmp_path / "root" / sub
    expected = make_mnist_like(folder, FMNIST_FILES, gz)
    ds = data.load_dataset("fmnist", tmp_path / "root")
    assert_same(ds, expected)
    assert ds.name == "fmnist" and ds.num_classes == 10 and ds.source == str(folder)
    assert ds.train_images.shape == (7, 1, 28, 28) and ds.test_labels.shape == (5,)


@pytest.mark.parametrize("sub", ["", "gzip", "EMNIST/raw"])
@pytest.mark.parametrize("split,classes", [("balanced", 47), ("letters", 26), ("byclass", 62), ("digits", 10)])
def test_emnist_layouts_transpose_and_labels(tmp_path, sub, split, classes):
    offset = 1 if split == "letters" else 0
    written = make_mnist_like(tmp_path / sub, emnist_names(split), gz=(sub == "gzip"), num_classes=classes,
                              label_offset=offset)
    ds = data.load_dataset("emnist", tmp_path, split=split)
    expected = {k: (v.transpose(0, 2, 1) if "images" in k else v.astype(np.int64) - offset) for k, v in written.items()}
    assert_same(ds, expected)
    assert ds.num_classes == classes and int(ds.train_labels.min()) >= 0
    assert ds.train_images[0, 0, 1, 0] == written["train_images"][0, 0, 1]  # upright: (row, col) = stored (col, row)


def test_emnist_default_split_is_balanced(tmp_path):
    make_mnist_like(tmp_path, emnist_names("balanced"), gz=True, num_classes=47)
    assert data.load_dataset("emnist", tmp_path).num_classes == 47
    with pytest.raises(data.DatasetNotFoundError, match="emnist-letters-train-images-idx3-ubyte"):
        data.load_dataset("emnist", tmp_path, split="letters")


def test_cifar10_layout(tmp_path):
    expected = make_cifar(tmp_path / "cifar-10-batches-py")
    ds = data.load_dataset("cifar10", tmp_path)
    assert_same(ds, expected)
    assert ds.train_images.shape == (15, 3, 32, 32) and ds.test_images.shape == (3, 3, 32, 32) and ds.num_classes == 10


def test_search_order(tmp_path, monkeypatch):
    root, env, repo = tmp_path / "root", tmp_path / "env", tmp_path / "repo_data"
    sets = {d: make_mnist_like(d, FMNIST_FILES, gz=True, seed=i) for i, d in enumerate((root, env, repo))}
    monkeypatch.setenv("FEDSTEER_DATA", str(env))
    assert data.search_dirs("fmnist", root) == [root, env, repo, tmp_path / "debian"]
    assert data.search_dirs("cifar10") == [env, repo]
    for chosen, arg in ((root, root), (env, None)):
        ds = data.load_dataset("fmnist", arg)
        assert ds.source == str(chosen)
        assert_same(ds, sets[chosen])
    monkeypatch.delenv("FEDSTEER_DATA")
    assert_same(data.load_dataset("fmnist"), sets[repo])
    # an explicit root without the data falls through to the next places
    assert data.load_dataset("fmnist", tmp_path / "empty").source == str(repo)


def test_debian_dir_is_last_resort_for_fmnist(tmp_path):
    expected = make_mnist_like(tmp_path / "debian", FMNIST_FILES, gz=True)
    assert_same(data.load_dataset("fmnist"), expected)
    make_mnist_like(tmp_path / "debian", emnist_names("balanced"), gz=True, num_classes=47)
    with pytest.raises(data.DatasetNotFoundError):  # not searched for other data sets
        data.load_dataset("emnist")


@pytest.mark.parametrize("name", data.DATASETS)
@pytest.mark.parametrize("env", [None, "0"])
def test_missing_message_and_no_download(tmp_path, monkeypatch, name, env):
    if env is not None:
        monkeypatch.setenv("FEDSTEER_ALLOW_DOWNLOAD", env)
    monkeypatch.setenv("FEDSTEER_DATA", str(tmp_path / "env"))
    with pytest.raises(data.DatasetNotFoundError) as info:
        data.load_dataset(name, tmp_path / "root")
    assert isinstance(info.value, FileNotFoundError)
    msg = str(info.value)
    places = [str(d) for d in data.search_dirs(name, tmp_path / "root")]
    assert [msg.index(p) for p in places] == sorted(msg.index(p) for p in places)  # all listed, in order
    assert "FEDSTEER_ALLOW_DOWNLOAD=1" in msg
    assert ("sudo apt-get install -y dataset-fashion-mnist" in msg) == (name == "fmnist")
    assert {"fmnist": "t10k-images-idx3-ubyte", "emnist": "emnist-balanced-test-labels-idx1-ubyte",
            "cifar10": "data_batch_5"}[name] in msg
    assert not (tmp_path / "env").exists() and not (tmp_path / "repo_data").exists()


def test_unknown_name_or_split():
    with pytest.raises(ValueError, match="fmnist, emnist, cifar10"):
        data.load_dataset("mnist")
    with pytest.raises(ValueError, match="byclass, bymerge, balanced, letters, digits, mnist"):
        data.load_dataset("emnist", split="bogus")


class FakeCIFAR10:
    def __init__(self, root, train=True, download=False, **kwargs):
        assert download
        make_cifar(Path(root) / "cifar-10-batches-py", seed=5)


class FakeFashionMNIST:
    def __init__(self, root, train=True, download=False, **kwargs):
        assert download
        make_mnist_like(Path(root) / "FashionMNIST" / "raw", FMNIST_FILES, gz=True, seed=6)


class FakeEMNIST:
    def __init__(self, root, split, train=True, download=False, **kwargs):
        make_mnist_like(Path(root) / "EMNIST" / "raw", emnist_names(split), gz=False, seed=7, num_classes=26,
                        label_offset=1)


def test_download_cifar10_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR10)
    monkeypatch.setenv("FEDSTEER_DATA", str(tmp_path / "env"))
    ds = data.load_dataset("cifar10", download=True)
    assert_same(ds, make_cifar(tmp_path / "check", seed=5))
    assert ds.source == f"download:{tmp_path / 'env' / 'cifar-10-batches-py'}"


def test_download_by_env_into_repo_data(tmp_path, monkeypatch):
    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", FakeFashionMNIST)
    monkeypatch.setattr(torchvision.datasets, "EMNIST", FakeEMNIST)
    monkeypatch.setenv("FEDSTEER_ALLOW_DOWNLOAD", "1")
    ds = data.load_dataset("fmnist")
    assert_same(ds, make_mnist_like(tmp_path / "check", FMNIST_FILES, gz=False, seed=6))
    assert ds.source == f"download:{tmp_path / 'repo_data' / 'FashionMNIST' / 'raw'}"
    written = make_mnist_like(tmp_path / "check2", emnist_names("letters"), gz=False, seed=7, num_classes=26,
                              label_offset=1)
    ds = data.load_dataset("emnist", split="letters")
    assert_same(ds, {k: (v.transpose(0, 2, 1) if "images" in k else v.astype(np.int64) - 1) for k, v in written.items()})
    # once downloaded, the files are found without downloading again
    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", forbid)
    assert data.load_dataset("fmnist", download=False).source == str(tmp_path / "repo_data" / "FashionMNIST" / "raw")


def test_failed_download_is_one_clear_error(monkeypatch):
    def offline(*args, **kwargs):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz: no internet")
    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", offline)
    with pytest.raises(data.DatasetNotFoundError, match="(?s)Looked in.*dataset-fashion-mnist.*no internet"):
        data.load_dataset("fmnist", download=True)


@pytest.mark.parametrize("problem", ["label_range", "count", "shape", "letters_zero"])
def test_bad_contents_name_the_file(tmp_path, problem):
    names = emnist_names("letters") if problem == "letters_zero" else FMNIST_FILES
    arrays = make_mnist_like(tmp_path, names, gz=True, label_offset=1 if problem == "letters_zero" else 0,
                             num_classes=26 if problem == "letters_zero" else 10)
    bad_file = {"label_range": names[1], "count": names[1], "shape": names[0], "letters_zero": names[3]}[problem]
    if problem == "label_range":
        write_idx(tmp_path / names[1], np.array([0, 1, 10, 2, 3, 4, 5], np.uint8), gz=True)
    elif problem == "count":
        write_idx(tmp_path / names[1], arrays["train_labels"][:-1], gz=True)
    elif problem == "shape":
        write_idx(tmp_path / names[0], arrays["train_images"][:, :27], gz=True)
    else:
        write_idx(tmp_path / names[3], np.array([0, 1, 2, 3, 4], np.uint8), gz=True)
    with pytest.raises(ValueError, match=bad_file):
        data.load_dataset("emnist" if problem == "letters_zero" else "fmnist", tmp_path, split="letters")


def test_bad_cifar_labels_and_data(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    make_cifar(folder)
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({b"labels": [0, 10, 1], b"data": np.zeros((3, 3072), np.uint8)}, f)
    with pytest.raises(ValueError, match="data_batch_3"):
        data.load_dataset("cifar10", tmp_path)
    make_cifar(folder)
    (folder / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="test_batch"):
        data.load_dataset("cifar10", tmp_path)


def test_returned_tensors_are_independent_copies(tmp_path):
    expected = make_mnist_like(tmp_path, FMNIST_FILES, gz=False)
    data.load_dataset("fmnist", tmp_path).train_images.zero_()
    assert_same(data.load_dataset("fmnist", tmp_path), expected)


def test_ensure_fashion_mnist_found(tmp_path, monkeypatch):
    make_mnist_like(tmp_path / "repo_data" / "FashionMNIST" / "raw", FMNIST_FILES, gz=True)
    monkeypatch.setattr(data.subprocess, "run", forbid)
    assert data.ensure_fashion_mnist() == tmp_path / "repo_data" / "FashionMNIST" / "raw"


def test_ensure_fashion_mnist_installs_with_apt(tmp_path, monkeypatch):
    calls = []

    class Done:
        def __init__(self, code):
            self.returncode = code

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        if cmd[:2] == ["apt-get", "install"] and len(calls) == 1:
            return Done(100)  # stale package lists
        if cmd[:2] == ["apt-get", "install"]:
            make_mnist_like(tmp_path / "debian", FMNIST_FILES, gz=True)
        return Done(0)

    monkeypatch.setattr(data.shutil, "which", lambda prog: "/usr/bin/" + prog)
    monkeypatch.setattr(data.os, "geteuid", lambda: 0)
    monkeypatch.setattr(data.subprocess, "run", fake_run)
    assert data.ensure_fashion_mnist(verbose=False) == tmp_path / "debian"
    install = ["apt-get", "install", "-y", "dataset-fashion-mnist"]
    assert calls == [install, ["apt-get", "update"], install]


def test_ensure_fashion_mnist_without_apt_explains(monkeypatch, capsys):
    monkeypatch.setattr(data.shutil, "which", lambda prog: None)
    monkeypatch.setattr(data.subprocess, "run", forbid)
    with pytest.raises(data.DatasetNotFoundError):
        data.ensure_fashion_mnist()
    err = capsys.readouterr().err
    assert "sudo apt-get install -y dataset-fashion-mnist" in err and "FEDSTEER_ALLOW_DOWNLOAD=1" in err


def test_real_fashion_mnist(monkeypatch):
    """The set-up installs the Debian package; this must find and read the real 70,000 images."""
    monkeypatch.setattr(data, "DEBIAN_FMNIST_DIR", REAL_DEBIAN_DIR)
    ds = data.load_dataset("fmnist")
    assert ds.train_images.shape == (60000, 1, 28, 28) and ds.test_images.shape == (10000, 1, 28, 28)
    assert ds.train_images.dtype == torch.uint8 and ds.train_labels.dtype == torch.int64
    assert torch.equal(torch.bincount(ds.train_labels, minlength=10), torch.full((10,), 6000))
    assert torch.equal(torch.bincount(ds.test_labels, minlength=10), torch.full((10,), 1000))
    assert ds.num_classes == 10 and 0 < ds.train_images.float().mean() < 255


# --- CIFAR-10 batches run no code (issue 58) ----------------------------------------------------------
class _Py2Pickler(pickle._Pickler):
    """Pickles as Python 2's cPickle did when CIFAR-10 was published: protocol 2, byte strings as
    BINSTRING (no `_codecs.encode` global), numpy's reconstructor under its old name numpy.core."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_bytes_py2(self, obj: bytes) -> None:
        n = len(obj)
        self.write((pickle.SHORT_BINSTRING + bytes([n]) if n < 256 else pickle.BINSTRING + struct.pack("<i", n)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_bytes_py2


def write_cifar_as_distributed(path: Path, images: np.ndarray, labels: list[int]) -> None:
    rows = images.reshape(len(images), -1)
    buffer = __import__("io").BytesIO()
    _Py2Pickler(buffer, protocol=2).dump({b"batch_label": b"training batch 1 of 5", b"labels": labels, b"data": rows,
                                           b"filenames": [b"img_%d.png" % i for i in range(len(labels))]})
    raw = buffer.getvalue()
    assert b"cnumpy._core.multiarray\n_reconstruct\n" in raw or b"cnumpy.core.multiarray\n_reconstruct\n" in raw
    path.write_bytes(raw.replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n"))


def test_a_batch_in_the_distributed_format_loads(tmp_path):
    """The files as distributed (Python 2, protocol 2, numpy.core's reconstructor) need only the
    globals the restricted unpickler admits."""
    folder = tmp_path / "cifar-10-batches-py"
    expected = make_cifar(folder)
    images = np.random.default_rng(3).integers(0, 256, (4, 3, 32, 32), dtype=np.uint8)
    write_cifar_as_distributed(folder / "data_batch_1", images, [1, 2, 3, 4])
    ds = data.load_dataset("cifar10", tmp_path)
    assert torch.equal(ds.train_images[:4], torch.from_numpy(images)) and ds.train_labels[:4].tolist() == [1, 2, 3, 4]
    assert torch.equal(ds.test_images, torch.from_numpy(expected["test_images"]))


class _Payload:
    """What a hostile data_batch_1 holds: unpickling it with pickle.load runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def _hostile_cifar(folder: Path, marker: Path) -> Path:
    make_cifar(folder)
    path = folder / "data_batch_1"
    with open(path, "wb") as f:
        pickle.dump({b"labels": [0, 1, 2], b"data": _Payload(marker)}, f)
    with open(folder / "check", "wb") as f:  # the payload is real: pickle.load does run it
        pickle.dump(_Payload(tmp := folder / "payload-works"), f)
    with open(folder / "check", "rb") as f:
        pickle.load(f)
    assert tmp.exists()
    return path


def test_a_crafted_cifar_batch_runs_nothing_and_is_named_in_one_line(tmp_path):
    marker = tmp_path / "marker"
    path = _hostile_cifar(tmp_path / "cifar-10-batches-py", marker)
    with pytest.raises(ValueError) as info:
        data.load_dataset("cifar10", tmp_path)
    assert not marker.exists(), "loading the batch ran its payload"
    assert str(info.value) == f"{path}: not a CIFAR-10 python batch (it refers to posix.system, which a CIFAR-10 batch never holds)"


def test_doctor_runs_nothing_from_a_crafted_cifar_batch_in_fedsteer_data(tmp_path):
    import os
    import subprocess
    import sys

    marker = tmp_path / "marker"
    path = _hostile_cifar(tmp_path / "cifar-10-batches-py", marker)
    env = {**os.environ, "FEDSTEER_DATA": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "fedsteer_lib", "doctor"], cwd=Path(__file__).resolve().parents[1],
                          env=env, capture_output=True, text=True, timeout=300)
    assert not marker.exists(), "doctor ran the batch's payload"
    line = next(line for line in proc.stdout.splitlines() if " cifar10 " in f" {line} ")
    assert line.startswith("corrupt") and f"{path}: not a CIFAR-10 python batch (it refers to posix.system" in line, line
    assert "Traceback" not in proc.stdout + proc.stderr
