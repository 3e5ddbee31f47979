"""The command line's checks of a user's input, each one line, made before anything computes.

Every function returns why the input cannot be used (a sentence naming the option or variable
and what to do), or None when it can: the device, the results directory, the kernel mode asked
for by ``$FEDSTEER_KERNELS``, the size of a run against this machine's memory, the seed, a
verify log's path. The command line turns a problem into one line on stderr (`cli.main`).
"""
from __future__ import annotations

import os
from pathlib import Path

from .. import numerics
from ..simulator.settings import SEED_LIMIT

__all__ = ["device_problem", "results_dir_problem", "kernels_problem", "select_kernels", "run_size_problem",
           "seed_problem", "log_problem", "memory_bytes"]

# What one round adds to a run besides its participation schedule: its history row, its
# participation list and their share of the result file, generously.
ROUND_BYTES = 1024


def device_problem(device: str, option: str = "--device") -> str | None:
    """Why `device` cannot run the simulations here (None when it can): checked before any
    compute, so that a missing GPU is one sentence, not a traceback after the progress bar."""
    import torch

    if not isinstance(device, str):
        return f"{option} must be a device name such as cpu, cuda or cuda:N, got {device!r}"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:
        return f"{option} {device!r} is not a torch device ({err}); use cpu, cuda or cuda:N"
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        return f"{option} {device!r}: only cpu and cuda devices are supported"
    if not torch.cuda.is_available():
        return f"{option} {device!r}: this machine has no CUDA GPU that torch can use (torch {torch.__version__}); use {option} cpu"
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        return f"{option} {device!r}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}"
    return None


def _dangling_link(path: Path) -> Path | None:
    """The first component of `path` (from the path itself upwards) that is a symbolic link to
    nothing, or None."""
    for p in (path, *path.parents):
        if p.is_symlink() and not p.exists():
            return p
        if p.exists():
            return None
    return None


def results_dir_problem(path: str, must_exist: bool = False) -> str | None:
    """Why `path` cannot serve as a results directory (None when it can): it must be a directory
    (or be creatable as one) that this process can write into; `must_exist` for reading it. A
    symbolic link to nothing, on the path or in its parents, cannot be created through."""
    import tempfile

    root = Path(path)
    link = _dangling_link(root.absolute())
    if link is not None:
        return f"--results {path}: {link} is a symbolic link to {os.readlink(link)}, which does not exist"
    if root.exists() and not root.is_dir():
        return f"--results {path}: is a file, not a directory"
    if must_exist:
        return None if root.is_dir() else f"--results {path}: no such directory"
    existing = next(p for p in (root.absolute(), *root.absolute().parents) if p.exists())
    if not existing.is_dir():
        return f"--results {path}: cannot write results there ({existing} is a file)"
    try:  # the directory the sweep would write into, or the one it would create it in
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        if existing == root.absolute():
            return f"--results {path}: this process cannot write into it ({err.strerror or err})"
        return (f"--results {path}: it does not exist and cannot be created: {existing} does not let this process "
                f"create anything in it ({err.strerror or err})")
    return None


def kernels_problem(option: str | None) -> str | None:
    """Why the kernel mode asked for cannot be selected (None when it can): `--kernels` when
    given (it overrides the environment), else ``$FEDSTEER_KERNELS`` when set."""
    if option is not None:
        return None if option in numerics.KERNELS else f"--kernels must be one of {', '.join(numerics.KERNELS)}, got {option!r}"
    value = os.environ.get(numerics.ENV_VAR)
    if value and value not in numerics.KERNELS:
        return (f"{numerics.ENV_VAR}={value!r} is not a kernel mode: set it to {' or '.join(numerics.KERNELS)}, unset "
                f"it (pinned), or pass --kernels, which overrides it")
    return None


def select_kernels(option: str | None) -> str | None:
    """Put the kernel mode in force (`numerics.select_kernels`: `--kernels`, else the
    environment, else pinned) before anything computes; returns the problem instead when the
    mode asked for is not one (`kernels_problem`)."""
    problem = kernels_problem(option)
    if problem is None:
        try:
            numerics.select_kernels(option)
        except numerics.NumericsError as err:
            problem = str(err)
    return problem


def memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def run_size_problem(rounds: int, num_clients: int, memory: int | None = None) -> str | None:
    """Why a run of `rounds` rounds with `num_clients` clients cannot fit in this machine's
    memory (None when it can): its participation schedule (a float64 draw and a bool per round
    and client, `partition.participation_schedule`) and its history (`ROUND_BYTES` a round) are
    held whole. Checked before anything is computed: otherwise the allocation fails, or the
    machine swaps, after the data is loaded."""
    memory = memory_bytes() if memory is None else memory
    if memory is None:
        return None
    needed = rounds * (num_clients * 9 + ROUND_BYTES)
    if needed <= memory // 2:
        return None
    return (f"--rounds {rounds:,} with {num_clients:,} clients needs about {needed / 2**30:,.1f} GiB for its "
            f"participation schedule and history alone ({rounds:,} rounds x ({num_clients:,} clients x 9 bytes + "
            f"{ROUND_BYTES} bytes)), more than half of this machine's {memory / 2**30:,.1f} GiB of memory")


def seed_problem(seed: object, option: str = "--seed") -> str | None:
    """Why `seed` cannot seed a run (None when it can): an integer in [0, 2**64)."""
    if isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < SEED_LIMIT:
        return None
    return f"{option} must be an integer in [0, 2**64), got {seed!r} (torch's generators take 64-bit seeds)"


def log_problem(log: str) -> str | None:
    """Why `verify --log FILE` cannot be appended to (None when it can), checked before the first
    run is recomputed: its folder must exist and take new files, FILE must not be a folder."""
    path = Path(log)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        return f"--log {log}: is a directory, not a log file"
    if not folder.is_dir():
        return f"--log {log}: its folder {folder} does not exist (create it first)"
    if path.exists() and not os.access(path, os.W_OK):
        return f"--log {log}: this process cannot write to it"
    if not path.exists() and not os.access(folder, os.W_OK):
        return f"--log {log}: this process cannot create files in {folder}"
    return None
