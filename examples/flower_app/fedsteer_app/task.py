"""The model, the data of one node and local training: an ordinary Flower PyTorch task.

Nothing here knows FedSteer: the same ClientApp works under Flower's own FedAvg.

Data. A node trains on its own partition file, `partition-{i}-of-{n}.pt` (uint8 images
(m, 1, 28, 28) and int64 labels) in `partitions_dir`, and loads nothing else: a ClientApp
process starts, reads a few hundred kilobytes and trains. The first node that finds the folder
without its file cuts Fashion-MNIST into the n partitions (each of `samples_per_node` images
from two label shards, so the nodes' label mixes differ) and writes them all, under a file
lock; every later message reads its own file only. A real deployment gives each node its own
file with the node config `data-path`.
"""
from __future__ import annotations

import fcntl
import gzip
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's pixel statistics
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist


class Net(nn.Module):
    """The CNN of McMahan et al. (2017) for (Fashion-)MNIST: two 5x5 convolutions (32, 64
    channels) with max-pooling, a 512-unit hidden layer (582,026 parameters); the architecture
    the book's simulator uses for Fashion-MNIST, so that bench/flower_vs_engine.py compares like
    with like."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=5)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5)
        self.fc1 = nn.Linear(64 * 4 * 4, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def _idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST's format), plain or gzipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def raw_fashion_mnist(split: str, data_dir: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST's `split` ("train" or "t10k") from `data_dir`, $FEDSTEER_DATA or Debian's copy."""
    dirs = [Path(d) for d in (data_dir, os.environ.get("FEDSTEER_DATA", "")) if d] + [DEBIAN_DIR]
    for folder in dirs:
        for sub in ("", "FashionMNIST/raw", "fashion-mnist"):
            for ext in (".gz", ""):
                images = folder / sub / f"{split}-images-idx3-ubyte{ext}"
                if images.exists():
                    return _idx(images), _idx(folder / sub / f"{split}-labels-idx1-ubyte{ext}")
    raise FileNotFoundError(f"no Fashion-MNIST files ({split}-images-idx3-ubyte[.gz]) in {[str(d) for d in dirs]}")


def default_partitions_dir(seed: int, samples_per_node: int) -> Path:
    """Where the partitions are cut to when the run config names no `partitions-dir`."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "fedsteer-flower-app" / f"fmnist-seed{seed}-samples{samples_per_node}"


def partition_path(partitions_dir: str | Path, partition_id: int, num_partitions: int) -> Path:
    return Path(partitions_dir) / f"partition-{partition_id}-of-{num_partitions}.pt"


def write_partitions(partitions_dir: str | Path, num_partitions: int, samples_per_node: int, seed: int,
                     data_dir: str = "") -> None:
    """Cut Fashion-MNIST's training set into `num_partitions` files: the images sorted by label
    are split into 2 n shards, and each node gets `samples_per_node` images (0: all) of two
    shards drawn at random."""
    images, labels = raw_fashion_mnist("train", data_dir)
    gen = np.random.default_rng(seed)
    order = np.argsort(labels, kind="stable")
    shards = np.array_split(order, 2 * num_partitions)
    pairs = gen.permutation(2 * num_partitions).reshape(num_partitions, 2)
    Path(partitions_dir).mkdir(parents=True, exist_ok=True)
    for i, pair in enumerate(pairs):
        idx = gen.permutation(np.concatenate([shards[j] for j in pair]))
        idx = idx[:samples_per_node] if samples_per_node else idx
        path = partition_path(partitions_dir, i, num_partitions)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save({"images": torch.from_numpy(images[idx].copy()).unsqueeze(1),
                    "labels": torch.from_numpy(labels[idx].astype(np.int64))}, tmp)
        os.replace(tmp, path)


def load_partition(partition_id: int, num_partitions: int, partitions_dir: str | Path, samples_per_node: int = 0,
                   seed: int = 0, data_dir: str = "", data_path: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """This node's images (normalised float32) and labels: from `data_path` if given, else its
    partition file (written first if the folder lacks it, see the module docstring)."""
    path = Path(data_path) if data_path else partition_path(partitions_dir, partition_id, num_partitions)
    if not path.exists() and not data_path:
        Path(partitions_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(partitions_dir) / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one writer; the others wait, then read
            if not path.exists():
                write_partitions(partitions_dir, num_partitions, samples_per_node, seed, data_dir)
    data = torch.load(path)
    return normalise(data["images"]), data["labels"]


def normalise(images: torch.Tensor) -> torch.Tensor:
    return (images.float() / 255.0 - MEAN) / STD


def train(net: Net, images: torch.Tensor, labels: torch.Tensor, *, epochs: int, batch_size: int, lr: float,
          generator: torch.Generator, proximal_mu: float = 0.0,
          correction: list[torch.Tensor] | None = None) -> tuple[int, float]:
    """`epochs` epochs of minibatch SGD; FedProx's proximal term and SCAFFOLD's correction are
    added to the gradient when the server sends them. Returns (steps, mean loss of the last epoch)."""
    anchor = [p.detach().clone() for p in net.parameters()] if proximal_mu else None
    net.train()
    steps, losses = 0, []
    for _ in range(epochs):
        losses = []
        for idx in torch.randperm(len(labels), generator=generator).split(batch_size):
            loss = F.cross_entropy(net(images[idx]), labels[idx])
            net.zero_grad()
            loss.backward()
            with torch.no_grad():
                for j, p in enumerate(net.parameters()):
                    grad = p.grad
                    if anchor is not None:
                        grad = grad + proximal_mu * (p - anchor[j])
                    if correction is not None:
                        grad = grad + correction[j]
                    p -= lr * grad
            losses.append(float(loss.detach()))
            steps += 1
    return steps, float(np.mean(losses)) if losses else float("nan")


@torch.no_grad()
def evaluate(net: Net, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 1000) -> tuple[float, float]:
    """(mean cross-entropy, accuracy)."""
    net.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(labels), batch_size):
        out = net(images[start:start + batch_size])
        loss += float(F.cross_entropy(out, labels[start:start + batch_size], reduction="sum"))
        correct += int((out.argmax(1) == labels[start:start + batch_size]).sum())
    return loss / len(labels), correct / len(labels)
