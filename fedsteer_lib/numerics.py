"""How a run's arithmetic is done: which CPU kernels, how many threads, which precision.

Kernel modes, chosen once per process by an entry point before torch computes (`select_kernels`).
Importing fedsteer_lib chooses nothing: a process that never selects keeps torch's own kernels.

- ``pinned``: a run gives the same bits on any x86-64 CPU with AVX2, Intel or AMD. ATen is limited
  to AVX2 (``ATEN_CPU_CAPABILITY``), MKL runs its strict compatible branch (``MKL_CBWR``), oneDNN
  and NNPACK are off and each run uses one thread (`kernels_for_run`), and square roots are
  correctly rounded (`sqrt`). The command line and the paper profile's notebooks select it by
  default (``FEDSTEER_KERNELS`` or ``--kernels`` choose otherwise).
- ``native``: torch's own kernels for this CPU and the caller's threads: faster, CPU-dependent bits.

What was checked on which CPUs, and what the pin costs, is the book's "Numerical reproducibility"
appendix. A run's precision (fp32, or bf16 autocast for client training and evaluation) belongs
to its config (`autocast`, `kernels_for_run`); a bf16 CPU run has oneDNN on, so it is never pinned.
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

__all__ = ["KERNELS", "PRECISIONS", "BF16_KERNELS", "ENV_VAR", "PINNED_ENV", "GPU_KERNELS", "FIRST_PIN_MKL_CBWR",
           "NumericsError", "select_kernels", "selected", "kernels", "check_kernels", "check_precision", "kernels_for_run",
           "run_kernels", "autocast", "has_bf16_units", "machine", "cpu_model", "cpu_signature", "cpu_flags",
           "tree_diff_hash", "SQRT", "sqrt"]

KERNELS = ("pinned", "native")
PRECISIONS = ("fp32", "bf16")  # a run's precision (`RunConfig.precision`)
BF16_KERNELS = "bf16"  # what a bf16 CPU run's provenance says instead of its process's mode (never "pinned")
GPU_KERNELS = "gpu"  # what a GPU run's provenance says: its bits are the GPU's, never "pinned"
BF16_UNITS = ("avx512_bf16", "amx_bf16")  # CPU features that compute bfloat16 natively
ENV_VAR = "FEDSTEER_KERNELS"
# What the pinned mode sets; each one alone changes a run's bits (see the module docstring).
PINNED_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE,STRICT"}
FIRST_PIN_MKL_CBWR = "AVX2,STRICT"  # the first pinned mode's MKL branch: Intel-only bits (module docstring)
# What a result's provenance says of its square roots since they are taken by `sqrt` (not torch.sqrt).
SQRT = "correctly rounded"
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
    in force for this process and the processes it starts (through the environment). Called by
    entry points only, never on import; it takes effect only if torch has not computed yet in
    this process (`check_kernels` says whether it did)."""
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


def selected() -> str | None:
    """The kernel mode an entry point selected in this process (`select_kernels`), else None."""
    return _MODE


def kernels() -> str:
    """The kernel mode of this process: the one `select_kernels` put in force, else "native"
    (nothing was selected, so torch computes with its own kernels)."""
    return _MODE if _MODE is not None else "native"


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
               "torch computed in this process before the pinned kernels were selected (call "
               "fedsteer_lib.numerics.select_kernels('pinned') before torch computes)")
        raise NumericsError(f"pinned kernels asked for, but torch uses {capability} kernels: {why}; "
                            f"or compute with native kernels ({ENV_VAR}=native or --kernels native)")
    changed = {k: os.environ.get(k) for k, v in PINNED_ENV.items() if os.environ.get(k) != v}
    if changed:
        raise NumericsError(f"pinned kernels asked for, but {changed} were changed after fedsteer_lib pinned them")


def check_precision(precision: str, device: str = "cpu") -> None:
    """Raise NumericsError when `precision` is not one of PRECISIONS, or is bf16 on a GPU
    without bfloat16 (before Ampere)."""
    if precision not in PRECISIONS:
        raise NumericsError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if precision == "bf16" and str(device).startswith("cuda"):
        import torch

        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
            raise NumericsError(f"precision bf16 asked for on {device}, whose GPU has no bfloat16 support; "
                                "use precision fp32")


def _is_cpu(device: str) -> bool:
    return str(device).startswith("cpu")


def run_kernels(device: str = "cpu", precision: str = "fp32") -> str:
    """The kernels one run computes with, as its provenance names them: the process's mode
    (`kernels`) for an fp32 CPU run, BF16_KERNELS for a bf16 CPU run (oneDNN on whatever the
    mode: CPU-dependent bits, see the module docstring), GPU_KERNELS for a GPU run (the CPU pin
    does not reach the GPU's kernels, so it is never "pinned")."""
    if not _is_cpu(device):
        return GPU_KERNELS
    return BF16_KERNELS if precision == "bf16" else kernels()


def has_bf16_units() -> bool:
    """Whether this CPU computes bfloat16 natively (AMX or AVX512-BF16); without, bf16 is emulated."""
    return any(f in cpu_flags() for f in BF16_UNITS)


@contextlib.contextmanager
def kernels_for_run(device: str = "cpu", precision: str = "fp32") -> Iterator[None]:
    """The kernels of one run, for its duration, all restored after. The process's mode is
    checked first (`check_kernels`), then, on a CPU:

    | process | fp32 run | bf16 run |
    | --- | --- | --- |
    | pinned | one thread, oneDNN and NNPACK off | one thread, oneDNN on, NNPACK off |
    | native | the caller's settings | the caller's threads, oneDNN on |

    A GPU run keeps the caller's settings (its precision is `autocast`'s business)."""
    import torch

    check_kernels(device)
    check_precision(precision, device)
    pinned = kernels() == "pinned"
    if not _is_cpu(device) or (not pinned and precision == "fp32"):
        yield
        return
    before = (torch.get_num_threads(), torch.backends.mkldnn.enabled, torch._C._get_nnpack_enabled())
    if pinned:
        torch.set_num_threads(1)
        torch._C._set_nnpack_enabled(False)
    torch.backends.mkldnn.enabled = precision == "bf16"  # bf16's units are reached through oneDNN only
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        torch.backends.mkldnn.enabled = before[1]
        torch._C._set_nnpack_enabled(before[2])


def autocast(precision: str, device: str = "cpu") -> contextlib.AbstractContextManager:
    """The arithmetic of client training and evaluation at `precision`: nothing for fp32;
    for bf16, ``torch.autocast`` on the device's type with dtype bfloat16 (matmuls and
    convolutions in bfloat16, losses and reductions in float32, the weights float32). Wrap
    the forward pass and the loss; the backward pass follows the forward's dtypes."""
    if precision == "fp32":
        return contextlib.nullcontext()
    check_precision(precision, device)
    import torch

    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


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


def cpu_signature() -> str:
    """The CPU's vendor, family, model and stepping ("GenuineIntel 6/207/2"): it tells two CPUs
    apart whose model name is a generic word (virtual machines often say "Intel(R) Xeon(R)
    Processor" for several generations); "unknown" off Linux."""
    info = _cpuinfo()
    parts = [info.get(k) for k in ("vendor_id", "cpu family", "model", "stepping")]
    if not all(parts):
        return "unknown"
    return f"{parts[0]} {parts[1]}/{parts[2]}/{parts[3]}"


def cpu_flags() -> list[str]:
    """The CPU features of `FLAGS_THAT_MATTER` this CPU has."""
    flags = set(_cpuinfo().get("flags", "").split())
    return [f for f in FLAGS_THAT_MATTER if f in flags]


def _library_versions() -> dict[str, str | None]:
    import numpy
    import torch

    config = torch.__config__.show()
    onednn = re.search(r"MKL-DNN v([\w.]+)", config) or re.search(r"oneDNN v([\w.]+)", config)
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", config)
    return {"torch": torch.__version__, "onednn_version": onednn.group(1) if onednn else None,
            "mkl_version": mkl.group(1) if mkl else None, "numpy_version": numpy.__version__}


def machine(device: str = "cpu", precision: str = "fp32") -> dict[str, Any]:
    """What a result's provenance records of the process that computed it: the CPU (model name,
    `cpu_signature`) and the features that decide its kernels, the kernels of the run
    (`run_kernels`: the process's mode, or "bf16" for a bf16 CPU run) and the choices in force
    (ATen's CPU capability, oneDNN on or off and its ISA limit, MKL's instruction branch;
    "default" where nothing limits them; square roots `SQRT`), the library versions and the intra-op thread count; a
    bf16 run also records its precision.
    Called inside `kernels_for_run`, it describes the run's own settings."""
    import torch

    extra = {} if precision == "fp32" else {"precision": precision, "process_kernels": kernels()}
    return {"kernels": run_kernels(device, precision), **extra, "cpu": cpu_model(),
            "cpu_signature": cpu_signature(), "cpu_flags": cpu_flags(),
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "onednn": ("on, max ISA " + (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
                                         or "default") if torch.backends.mkldnn.enabled else "off"),
            "nnpack": "on" if torch._C._get_nnpack_enabled() else "off",
            "mkl_cbwr": os.environ.get("MKL_CBWR") or "default", "sqrt": SQRT,
            **_library_versions(), "threads": torch.get_num_threads(), "machine": platform.machine()}


def sqrt(x: "torch.Tensor") -> "torch.Tensor":
    """Element-wise square root, correctly rounded (IEEE 754), so the same bits on every CPU.

    On a CPU, torch.sqrt of a float tensor calls MKL's vector math library (VML) in its
    high-accuracy mode: within 1 ulp of the true root but not always the rounded one, and which
    last bit it gives depends on the CPU (the pinned mode does not reach it: ``MKL_CBWR``
    governs BLAS and LAPACK). Measured with torch 2.14: on an AMD EPYC, 12 of 1,000 float64
    roots differ from the correctly rounded ones, and under QEMU's emulation of an Intel CPU
    153 do, with the same binary. This was why FedSteer's server step, the only one that takes
    square roots, gave other bits on an Intel Xeon and an AMD EPYC. numpy's sqrt uses the
    processor's square-root instruction, which IEEE 754 requires to round correctly, so every
    x86-64 CPU gives the same answer. On a GPU, torch.sqrt is correctly rounded already."""
    import numpy as np
    import torch

    if x.device.type != "cpu":
        return x.sqrt()
    return torch.from_numpy(np.sqrt(x.detach().numpy()))


def tree_diff_hash(repo: str | os.PathLike) -> str | None:
    """sha1 (12 hex) of `git diff HEAD` in `repo`: names the uncommitted changes a dirty tree
    computed with (None when the tree is clean or git is unavailable)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "diff", "HEAD", "--binary"], capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return hashlib.sha1(out.stdout).hexdigest()[:12] if out.returncode == 0 and out.stdout else None
