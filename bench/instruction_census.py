"""Which x86 instructions a program executes, counted under QEMU: whether bits seen under an
emulated Intel CPU are the bits a real Intel CPU computes.

`bench/op_trace.py --replay` showed that FedSteer's server calls give the same bits, operation
for operation, on this AMD EPYC and under `qemu-x86_64 -cpu Haswell-noTSX`, an emulated Intel
CPU. On its own that shows less than it seems: an emulator computes every instruction exactly as
the manuals define it, and so do real CPUs, except for the few instructions whose results the
manuals leave to each implementation:

- the approximate reciprocals and reciprocal square roots, ``rcpps``, ``rsqrtps`` and their
  scalar, VEX and AVX-512 forms (Intel and AMD use different tables; QEMU computes them in
  full, so it agrees with neither);
- x87's transcendental instructions (``fsin``, ``fpatan``, ``fyl2x``, ...), whose last bits
  differ between the vendors (QEMU computes them with the host's libm).

Every other floating-point instruction (IEEE 754's basic operations, square root, FMA,
conversions, all under MXCSR's rounding mode) has one correct result, which every CPU that
executes it computes. So if a computation executes none of the instructions above under QEMU,
any real CPU that executes the same instruction stream computes the same bits as the emulator.

This script counts, by mnemonic, every instruction a program executes under QEMU, with a TCG
plugin (`bench/qemu_census.c`, built here with the C compiler), and says whether any of them is
one of those (`IMPLEMENTATION_DEFINED`). Exit status 1 when one ran, 0 otherwise.

    .venv/bin/python bench/instruction_census.py --self-test
    .venv/bin/python bench/instruction_census.py --out CENSUS.json [--cpu Haswell-noTSX] [--note TEXT] \
        -- .venv/bin/python bench/op_trace.py --replay /tmp/server-inputs.pickle --out B.jsonl

`--self-test` runs a small C program that takes one approximate reciprocal square root and one
exact square root, natively and under QEMU with the census: the census must find ``rsqrtps``
(it prints the result on this CPU beside the one under QEMU, which computes it in full), and
the same program told to take only the square root must execute nothing from the list. A long
command's output is shown as it comes (and its last lines kept in the census file).

What this does not cover: which instructions a real CPU is given depends on what it reports
(CPUID). The emulated Haswell is an Intel CPU with AVX2 and FMA, as is every Intel Core and
Xeon CPU since Haswell (2013); with the pinned kernels ATen stays at AVX2 and MKL on its COMPATIBLE branch whatever more
a CPU has, but numpy and glibc choose their own code for CPUs with AVX-512. The census is of
what the emulated CPU was given.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_SOURCE = Path(__file__).with_name("qemu_census.c")
QEMU = "qemu-x86_64"

# Mnemonics (as QEMU's disassembler writes them) whose results the Intel and AMD manuals leave to
# the implementation: the approximate reciprocal / reciprocal square root family (SSE, AVX,
# AVX-512, AVX-512ER, AVX512-FP16, 3DNow!) and x87's transcendental instructions.
IMPLEMENTATION_DEFINED: frozenset[str] = frozenset(
    [f"{v}{op}{form}" for v in ("", "v") for op in ("rcp", "rsqrt") for form in ("ps", "ss")]
    + [f"v{op}{bits}{form}" for op in ("rcp", "rsqrt") for bits in ("14", "28") for form in ("ps", "pd", "ss", "sd")]
    + ["vexp2ps", "vexp2pd", "vrcpph", "vrcpsh", "vrsqrtph", "vrsqrtsh"]
    + ["pfrcp", "pfrsqrt", "pfrcpit1", "pfrcpit2", "pfrsqit1"]
    + ["fsin", "fcos", "fsincos", "fptan", "fpatan", "f2xm1", "fyl2x", "fyl2xp1"])

PROBE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* probe rsqrt|sqrt X: 1/sqrt(X) by the approximate rsqrtps, or sqrt(X) by the exact sqrtps */
__attribute__((noinline)) static __m128 approximate(__m128 x) { return _mm_rsqrt_ps(x); }
__attribute__((noinline)) static __m128 exact(__m128 x) { return _mm_sqrt_ps(x); }
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    __m128 x = _mm_set1_ps(strtof(argv[2], NULL));
    float out[4];
    if (strcmp(argv[1], "rsqrt") == 0)
        _mm_storeu_ps(out, approximate(x));
    else
        _mm_storeu_ps(out, exact(x));
    printf("%a\n", out[0]);
    return 0;
}
"""


def build(source: Path | str, out: Path, shared: bool) -> Path:
    """Compile C `source` (a path, or the code itself) with the system's C compiler."""
    if isinstance(source, str):
        path = out.with_suffix(".c")
        path.write_text(source)
        source = path
    if shutil.which("cc") is None:
        sys.exit("instruction_census: no C compiler (cc); install Debian's build-essential")
    flags = ["-shared", "-fPIC"] if shared else []
    proc = subprocess.run(["cc", "-O2", *flags, "-o", str(out), str(source)], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"instruction_census: cc failed on {source}:\n{proc.stderr}")
    return out


def census(command: list[str], cpu: str = "Haswell-noTSX", workdir: Path | None = None,
           echo: bool = False) -> tuple[dict[str, int], subprocess.CompletedProcess]:
    """Run `command` under `qemu-x86_64 -cpu CPU` with the census plugin: {mnemonic: executions}
    and the finished process, its standard output captured (with `echo`, also shown as it comes,
    unbuffered, and its standard error left on the terminal)."""
    if shutil.which(QEMU) is None:
        sys.exit(f"instruction_census: no {QEMU}; install Debian's qemu-user (`make system-packages` does, as root)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        plugin = build(PLUGIN_SOURCE, tmp / "libqemu_census.so", shared=True)
        table = tmp / "census.tsv"
        args = [QEMU, "-cpu", cpu, "-plugin", f"{plugin},out={table}", *command]
        if echo:
            with subprocess.Popen(args, cwd=workdir, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"}) as running:
                lines = []
                for line in running.stdout:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                    lines.append(line)
            proc = subprocess.CompletedProcess(args, running.returncode, "".join(lines), "")
        else:
            proc = subprocess.run(args, cwd=workdir, capture_output=True, text=True)
        if not table.is_file():
            sys.exit(f"instruction_census: QEMU wrote no census (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        counts: dict[str, int] = {}
        for line in table.read_text().splitlines():
            if line.startswith("#"):
                sys.exit(f"instruction_census: {line[1:].strip()}")
            name, count = line.split("\t")
            counts[name] = int(count)
    return {k: v for k, v in counts.items() if v > 0}, proc


def implementation_defined(counts: dict[str, int]) -> dict[str, int]:
    """The executed instructions whose results depend on the CPU that computes them."""
    return {name: n for name, n in counts.items() if name.split()[-1] in IMPLEMENTATION_DEFINED}


def self_test() -> int:
    """The census finds an approximate instruction where one runs, and none where none does."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = build(PROBE, Path(tmp) / "probe", shared=False)
        found, proc = census([str(probe), "rsqrt", "3"])
        native = subprocess.run([str(probe), "rsqrt", "3"], capture_output=True, text=True, check=True).stdout.strip()
        clean, _ = census([str(probe), "sqrt", "3"])
    flagged, flagged_clean = implementation_defined(found), implementation_defined(clean)
    print(f"rsqrtps(3): {native} on this CPU, {proc.stdout.strip()} under QEMU; the census found {flagged or 'nothing'}")
    print(f"sqrtps(3) alone: the census found {flagged_clean or 'nothing'} from the list "
          f"({sum(clean.values())} instructions executed, sqrtps {clean.get('sqrtps', 0)} times)")
    ok = flagged.get("rsqrtps", 0) >= 1 and clean.get("sqrtps", 0) >= 1 and not flagged_clean
    print("self-test " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--self-test", action="store_true", help="check that the census finds an rsqrtps")
    parser.add_argument("--out", type=Path, help="write the census here (JSON)")
    parser.add_argument("--cpu", default="Haswell-noTSX", help="QEMU's CPU model (default: Haswell-noTSX)")
    parser.add_argument("--note", help="what the command computes, for the census file")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.self_test:
        return self_test()
    if not command or args.out is None:
        parser.error("give --out CENSUS.json -- COMMAND ARGS... (or --self-test)")
    counts, proc = census(command, args.cpu, ROOT, echo=True)
    if proc.returncode != 0:
        sys.exit(f"instruction_census: the command failed under QEMU (exit {proc.returncode})")
    flagged = implementation_defined(counts)
    version = subprocess.run([QEMU, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    record = {"command": command, "cpu": args.cpu, "qemu": version, **({"note": args.note} if args.note else {}),
              "instructions_executed": sum(counts.values()), "distinct_mnemonics": len(counts),
              "implementation_defined_executed": flagged, "output_tail": proc.stdout[-2000:],
              "counts": dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{record['instructions_executed']:,} instructions of {len(counts)} kinds executed under {QEMU} -cpu "
          f"{args.cpu}; of those whose results depend on the CPU: {flagged or 'none'} -> {args.out}")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
