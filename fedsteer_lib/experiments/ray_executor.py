"""Sweeps on a Ray cluster (`python -m fedsteer_lib sweep --executor ray`).

Each run is one Ray task that computes the run where Ray places it and returns its result to
the driver; the driver writes it with the same atomic `results.save_run` as the local pool, so
the cluster needs no shared file system and a lost task never leaves a partial file. Ray
retries a task whose worker died (`max_retries`); runs already cached are never sent.

    ray start --head --num-cpus 16                        # on the head node
    ray start --address HEAD:6379                         # on every other node
    python -m fedsteer_lib sweep --executor ray --address auto --workers 16 [--gpus-per-run 0.25]
"""
from __future__ import annotations

import socket
from typing import Callable, Sequence
from urllib.parse import urlparse

from .config import RunConfig, same_data

__all__ = ["RayUnavailableError", "address_problem", "run_on_ray", "MAX_RETRIES"]

MAX_RETRIES = 3  # Ray re-runs a task whose worker or node died this many times


class RayUnavailableError(RuntimeError):
    """Ray is not installed, or the cluster at the given address does not answer."""


def address_problem(address: str | None, timeout: float = 5.0) -> str | None:
    """Why a Ray cluster cannot be reached at `address` (None when it answers, or when `address`
    is None/"local": a local instance is started). "auto" needs a running local cluster; a
    host:port or ray://host:port address must accept a TCP connection within `timeout` seconds."""
    if address in (None, "local"):
        return None
    if address == "auto":
        try:
            from ray._private.services import find_gcs_addresses  # the lookup ray.init("auto") does
        except ImportError:
            return None  # let ray.init report it
        return None if find_gcs_addresses() else "--address auto: no Ray cluster is running on this machine (start one with `ray start --head`)"
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    if not parsed.hostname or not parsed.port:
        return f"--address {address!r}: expected auto, host:port or ray://host:port"
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout):
            return None
    except OSError as err:
        return f"--address {address}: no Ray cluster answers there ({err.strerror or err})"


_SIM = None  # the prepared data of this Ray worker's last run, reused while it fits


def _compute(config: RunConfig, threads: int, kernels: str):
    import torch

    from .. import numerics
    from ..simulator.engine import prepare, run

    global _SIM
    numerics.select_kernels(kernels)  # the driver's kernel mode, before this worker computes
    torch.set_num_threads(threads)
    if _SIM is None or not same_data(_SIM.config, config):
        _SIM = prepare(config)
    return config.key(), run(config, progress=False, sim=_SIM)


def run_on_ray(todo: Sequence[RunConfig], save: Callable, *, workers: int, address: str | None = None,
               gpus_per_run: float = 0.0, on_done: Callable[[RunConfig], None] = lambda c: None) -> None:
    """Compute `todo` as Ray tasks (at most `workers` at a time, each with 1 CPU and
    `gpus_per_run` of a GPU) and `save(result, config)` each one on the driver as it finishes."""
    try:
        import ray
    except ImportError as err:
        raise RayUnavailableError("--executor ray needs the ray package (pip install -r requirements.txt)") from err
    problem = address_problem(address)
    if problem:
        raise RayUnavailableError(problem)
    started_here = not ray.is_initialized()
    if started_here:
        kwargs = {"num_cpus": workers} if address in (None, "local") else {"address": address}
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, **kwargs)
    try:
        from .. import numerics

        # Each task puts the driver's kernel mode in force before it computes (`_compute`).
        task = ray.remote(num_cpus=1, num_gpus=gpus_per_run, max_retries=MAX_RETRIES, retry_exceptions=False)(_compute)
        by_key = {c.key(): c for c in todo}
        queue, pending = list(todo), []
        while queue or pending:
            while queue and len(pending) < workers:
                pending.append(task.remote(queue.pop(0), 1, numerics.kernels()))
            done, pending = ray.wait(pending, num_returns=1)
            key, result = ray.get(done[0])
            save(result, by_key[key])
            on_done(by_key[key])
    finally:
        if started_here:
            ray.shutdown()
