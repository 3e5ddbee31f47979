"""How a run's arithmetic is done, decided in this one place: which CPU kernels, how many threads.

Two kernel modes, fixed for a whole process before torch computes anything:

- ``pinned`` (the default): the same run gives the same bits on any x86-64 CPU with AVX2 (every
  server and desktop CPU of the last decade), whatever its best instruction set (AVX-512, AMX).
  ATen's kernels are limited to AVX2 (``ATEN_CPU_CAPABILITY=avx2``); MKL runs its AVX2 branch in
  strict reproducible mode (``MKL_CBWR=AVX2,STRICT``, Intel's "conditional numerical
  reproducibility"); oneDNN is switched off for the run, so convolutions are torch's own
  (im2col and MKL's GEMM): pinning oneDNN to AVX2 is not enough, since its kernels block the
  work by the CPU's cache sizes (the same FedAvg run, pinned to AVX2, ended at 0.8146 on an
  Intel CPU with AMX and at 0.8148 on an AMD EPYC); NNPACK, which torch would use instead, sizes
  its blocks by the caches too, and is off as well; and every CPU run uses one intra-op thread
  (a second thread changes the order of the sums). Each of these changes a run's bits on its
  own (measured with torch 2.14).
- ``native``: torch's own choice for this CPU (oneDNN, AVX-512/AMX where present) and as many
  threads as the caller sets. Faster, but the bits depend on the CPU.

The mode comes from ``FEDSTEER_KERNELS`` (``pinned`` when unset) when `fedsteer_lib` is first
imported, which sets the variables above before torch computes; `select_kernels` changes it in
a process that has not computed yet (the command line's ``--kernels``). Child processes
(sweep workers, Ray tasks) inherit it through the environment; `kernels_for_run` applies the
per-run part (threads, oneDNN) around every run of the engine. The kernels are not part of a
run's key: pinned and native runs of a config are the same run computed two ways, and the
result's provenance says which (`machine`).

The other numerical choice, a run's precision (float32, or bfloat16 autocast), belongs to the
run's config and key, not to the process: see `RunConfig.precision`.

Standard library only at import, so that it can run before torch is imported.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

__all__ = ["KERNELS", "ENV_VAR", "PINNED_ENV", "NumericsError", "select_kernels", "kernels", "check_kernels",
           "kernels_for_run", "machine", "cpu_model", "cpu_flags", "tree_diff_hash"]

KERNELS = ("pinned", "native")
ENV_VAR = "FEDSTEER_KERNELS"
# What the pinned mode sets; each one alone changes a run's bits (see the module docstring).
PINNED_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT"}
PINNED_CAPABILITY = "AVX2"  # what torch.backends.cpu.get_cpu_capability() reports when the pin holds
# The CPU features that decide which kernels torch may use.
FLAGS_THAT_MATTER = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
                     "amx_int8")

_USER_ENV = {k: os.environ.get(k) for k in PINNED_ENV}  # what the user had, restored by "native"
_MODE: str | None = None


class NumericsError(RuntimeError):
    """The kernels asked for cannot be (or are not) in force in this process."""


def select_kernels(mode: str | None = None) -> str:
    """Put kernel mode `mode` ("pinned" or "native"; None: ``$FEDSTEER_KERNELS``, else "pinned")
    in force for this process and its children. Takes effect only if torch has not computed yet
    in this process (`check_kernels` says whether it did)."""
    global _MODE
    mode = mode if mode is not None else (os.environ.get(ENV_VAR) or "pinned")
    if mode not in KERNELS:
        raise NumericsError(f"kernels must be one of {KERNELS}, got {mode!r} (from {ENV_VAR} or --kernels)")
    if mode == "pinned":
        os.environ.update(PINNED_ENV)
    else:
        for name, value in _USER_ENV.items():  # the user's own settings, if any, else torch's choice
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    os.environ[ENV_VAR] = mode
    _MODE = mode
    return mode


def kernels() -> str:
    """The kernel mode of this process."""
    return _MODE if _MODE is not None else select_kernels()


def check_kernels(device: str = "cpu") -> None:
    """Raise NumericsError when this process is in the pinned mode but torch is not using the
    pinned kernels: torch computed before `fedsteer_lib` was imported (import it first), or this
    CPU lacks AVX2. Nothing to check for native kernels or a GPU run."""
    if kernels() != "pinned" or not str(device).startswith("cpu"):
        return
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    if capability != PINNED_CAPABILITY:
        why = ("this CPU lacks AVX2" if "avx2" not in cpu_flags() else
               "torch computed in this process before fedsteer_lib pinned its kernels (import fedsteer_lib before "
               "using torch)")
        raise NumericsError(f"pinned kernels asked for, but torch uses {capability} kernels: {why}; "
                            f"or compute with native kernels ({ENV_VAR}=native or --kernels native)")
    changed = {k: os.environ.get(k) for k, v in PINNED_ENV.items() if os.environ.get(k) != v}
    if changed:
        raise NumericsError(f"pinned kernels asked for, but {changed} were changed after fedsteer_lib pinned them")


@contextlib.contextmanager
def kernels_for_run(device: str = "cpu") -> Iterator[None]:
    """The kernels of one run, for its duration: for a pinned CPU run, checked (`check_kernels`),
    one intra-op thread, oneDNN and NNPACK off (torch's own convolutions: im2col and MKL's GEMM),
    all restored after; for a native or GPU run, the caller's settings."""
    import torch

    check_kernels(device)
    if kernels() != "pinned" or not str(device).startswith("cpu"):
        yield
        return
    before = (torch.get_num_threads(), torch.backends.mkldnn.enabled, torch._C._get_nnpack_enabled())
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    torch._C._set_nnpack_enabled(False)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        torch.backends.mkldnn.enabled = before[1]
        torch._C._set_nnpack_enabled(before[2])


def _cpuinfo() -> dict[str, str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    first = text.split("\n\n")[0]
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines()) if k.strip()}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else the platform's word)."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> list[str]:
    """The CPU features of `FLAGS_THAT_MATTER` this CPU has."""
    flags = set(_cpuinfo().get("flags", "").split())
    return [f for f in FLAGS_THAT_MATTER if f in flags]


def _library_versions() -> dict[str, str | None]:
    import torch

    config = torch.__config__.show()
    onednn = re.search(r"MKL-DNN v([\w.]+)", config) or re.search(r"oneDNN v([\w.]+)", config)
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", config)
    return {"torch": torch.__version__, "onednn_version": onednn.group(1) if onednn else None,
            "mkl_version": mkl.group(1) if mkl else None}


def machine(device: str = "cpu") -> dict[str, Any]:
    """What a result's provenance records of the process that computed it: the CPU and the
    features that decide its kernels, the kernel mode and the choices in force (ATen's CPU
    capability, oneDNN on or off and its ISA limit, MKL's instruction branch; "default" where
    nothing limits them), the library versions and the intra-op thread count. Called inside
    `kernels_for_run`, it describes the run's own settings."""
    import torch

    return {"kernels": kernels(), "cpu": cpu_model(), "cpu_flags": cpu_flags(),
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "onednn": ("on, max ISA " + (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
                                         or "default") if torch.backends.mkldnn.enabled else "off"),
            "nnpack": "on" if torch._C._get_nnpack_enabled() else "off",
            "mkl_cbwr": os.environ.get("MKL_CBWR") or "default",
            **_library_versions(), "threads": torch.get_num_threads(), "machine": platform.machine()}


def tree_diff_hash(repo: str | os.PathLike) -> str | None:
    """sha1 (12 hex) of `git diff HEAD` in `repo`: names the uncommitted changes a dirty tree
    computed with (None when the tree is clean or git is unavailable)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "diff", "HEAD", "--binary"], capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return hashlib.sha1(out.stdout).hexdigest()[:12] if out.returncode == 0 and out.stdout else None
