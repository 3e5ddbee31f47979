"""Which operation gives other bits on another CPU: a trace of every tensor operation of the server.

`verify` says that a stored run did not come back bit for bit, and from which round on; this
script says which operation is the first to differ. It recomputes the first --rounds rounds of a
stored run (with the process's kernels, pinned by default) and records every ATen operation the
server strategy runs (warm-up snapshots, aggregate, update, observe): its name, the shapes and a
hash of every tensor it reads and writes, in order. The client updates the server receives and
the update it returns are recorded the same way, so a difference in client training shows up as
a difference in the server's inputs. Computed on two machines, the two traces are compared
record by record: the first operation whose inputs agree and whose output does not is the one
whose kernels differ between the two CPUs.

    .venv/bin/python bench/op_trace.py KEY [--rounds 6] [--results DIR] [--out data/results/verify/traces/KEY-<cpu>.jsonl]
    .venv/bin/python bench/op_trace.py --compare TRACE_A TRACE_B
    .venv/bin/python bench/op_trace.py KEY --mkl-as-intel   # on an AMD CPU: MKL takes its Intel code paths
    .venv/bin/python bench/op_trace.py KEY --rounds 5 --out A.jsonl --capture /tmp/server-inputs.pickle
    qemu-x86_64 -cpu Haswell .venv/bin/python bench/op_trace.py --replay /tmp/server-inputs.pickle --out B.jsonl \
        --note "QEMU, Intel Haswell"

`--capture` also saves every server call's inputs (the state as it was, the client updates), as
a pickle stream; `--replay` runs those calls again from exactly those inputs, without training a
client, and traces them. Under `qemu-x86_64 -cpu Haswell` (Debian's qemu-user) the same binaries run on an
emulated Intel CPU: every CPUID query, MKL's included, answers "GenuineIntel", and the
instructions that real CPUs only approximate, each vendor its own way (rsqrtps, rcpps), are
computed in full, so a replay there and a replay (or the capturing run) on the real CPU that
differ name an operation whose bits depend on the CPU.
That is how FedSteer's square roots were found (`numerics.sqrt`). An emulator has no AVX-512
and is not an Intel CPU: on its own it can show that an operation depends on the CPU, not that
two real CPUs agree. `bench/instruction_census.py` counts the instructions a replay executes
under QEMU: when none is one whose result the manuals leave to the CPU, a real CPU given the same
instructions computes the emulator's bits.

`--mkl-as-intel` tells MKL that the CPU is an Intel one (a C compiler builds a two-function shim
that answers MKL's vendor check, loaded with LD_PRELOAD; that it takes effect shows with
MKL_CBWR=AUTO, under which MKL's results on an AMD CPU change with it). On an AMD CPU, a trace
that agrees with the plain one says that MKL's vendor dispatch is not what differs.

Recording does not change the arithmetic (every operation runs as it would, then its output is
hashed); the run's history is checked against the stored one and the first round that differs
is printed.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Iterator

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "data" / "results" / "verify" / "traces"
SERVER_CALLS = ("warmup_snapshot", "aggregate", "update", "observe")
MKL_AS_INTEL = "FEDSTEER_MKL_AS_INTEL"
SHIM = "int mkl_serv_intel_cpu_true(void) { return 1; }\nint mkl_serv_intel_cpu(void) { return 1; }\n"


def reexec_with_mkl_as_intel() -> None:
    """Run this script again with MKL's vendor check answered 'Intel' (see the module docstring)."""
    if os.environ.get(MKL_AS_INTEL) == "1":
        return
    shim = Path(tempfile.mkdtemp()) / "libmkl_as_intel.so"
    source = shim.with_suffix(".c")
    source.write_text(SHIM)
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(source)], check=True)
    env = {**os.environ, "LD_PRELOAD": str(shim), MKL_AS_INTEL: "1"}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def tensor_record(t) -> dict[str, Any]:
    """A tensor's dtype, shape and the sha1 (12 hex) of its values, in row-major order."""
    import torch

    data = t.detach().cpu().contiguous()
    raw = data.view(torch.uint8) if data.dtype in (torch.bfloat16, torch.float16) else data
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "sha1": hashlib.sha1(raw.numpy().tobytes()).hexdigest()[:12]}


def _tensors(tree) -> list:
    import torch
    from torch.utils._pytree import tree_flatten

    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class Tracer:
    """Wraps a strategy's server calls so that each records its inputs, every ATen operation it
    runs and what it returns; with `capture` (a binary file), each call's inputs are also pickled
    there as the call begins (the state as it was, the client updates), one call at a time, so
    that a long capture holds no more than one call's inputs in memory."""

    def __init__(self, capture: BinaryIO | None = None):
        self.records: list[dict[str, Any]] = []
        self.capture = capture
        self.captured = 0
        self.where: dict[str, Any] = {"call": None, "round": None}
        self.last_update = -1

    def wrap(self, strategy) -> None:
        for name in SERVER_CALLS:
            setattr(strategy, name, self._traced(name, getattr(strategy, name)))

    def _traced(self, name: str, method):
        from torch.utils._python_dispatch import TorchDispatchMode

        tracer = self

        class Recorder(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                result = func(*args, **(kwargs or {}))
                tracer.records.append({**tracer.where, "op": str(func.overloadpacket.__name__) + "." + func._overloadname,
                                       "in": [tensor_record(t) for t in _tensors((args, kwargs))],
                                       "out": [tensor_record(t) for t in _tensors(result)]})
                return result

        def call(*args, **kwargs):
            self.where.update(call=name, round=_round_of(method, args, kwargs, self.last_update))
            if name == "update":
                self.last_update = self.where["round"]
            if self.capture is not None:
                pickle.dump((name, args, kwargs), self.capture, protocol=pickle.HIGHEST_PROTOCOL)
                self.captured += 1
            tensors = [tensor_record(t) for t in _tensors((args[1:], kwargs))]  # args[0] is the state
            self.records.append({**self.where, "op": "<enter>", "in": tensors, "out": []})
            with Recorder():
                result = method(*args, **kwargs)
            self.records.append({**self.where, "op": "<return>", "in": [],
                                 "out": [tensor_record(t) for t in _tensors(result)]})
            return result
        return call

    def write(self, out: Path, head: dict[str, Any]) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w") as f:
            f.write(json.dumps(head) + "\n")
            for r in self.records:
                f.write(json.dumps(r) + "\n")


def _head(key: str, rounds: int, device: str, machine: dict, note: str | None, **more) -> dict[str, Any]:
    from fedsteer_lib.experiments.results import provenance

    return {"key": key, "rounds": rounds, "machine": machine, "code_version": provenance(device)["code_version"],
            "mkl_as_intel": os.environ.get(MKL_AS_INTEL) == "1", **({"note": note} if note else {}), **more}


def record_run(key: str, rounds: int, out: Path, results: Path | None = None, capture: Path | None = None,
               note: str | None = None) -> None:
    """Recompute the first `rounds` rounds of stored run `key`, tracing the server; with
    `capture`, also save every server call's inputs there for `replay` (a pickle stream: a head,
    then one (call name, args, kwargs) per call, written as the call begins)."""
    import fedsteer_lib  # noqa: F401  (pins the kernels before torch computes)

    from fedsteer_lib.experiments.config import RunConfig
    from fedsteer_lib.experiments.results import results_root

    path = Path(results or results_root("paper")) / "runs" / f"{key}.json"
    if not path.is_file():
        sys.exit(f"op_trace: no stored run {path}")
    stored = json.loads(path.read_text())
    config = RunConfig.from_dict(stored["config"])
    if rounds < 1 or rounds > config.training.rounds:
        sys.exit(f"op_trace: --rounds must be between 1 and the run's {config.training.rounds}")
    config = config.replace(training=dataclasses.replace(config.training, rounds=rounds))
    if capture is not None:
        capture.parent.mkdir(parents=True, exist_ok=True)
    with (capture.open("wb") if capture is not None else contextlib.nullcontext()) as saved:
        if saved is not None:
            pickle.dump({"key": key, "rounds": rounds, "config": stored["config"]}, saved)
        tracer = Tracer(saved)
        result = _traced_run(config, tracer)
    first = first_difference(stored["history"], result.history)
    machine = result.machine
    tracer.write(out, _head(key, rounds, config.device, machine, note, first_round_that_differs_from_stored=first))
    print(f"{len(tracer.records)} operations traced over {rounds} rounds on {machine['cpu']} "
          f"({machine['cpu_signature']}), {machine['kernels']} kernels -> {out}")
    print("history identical to the stored run's" if first is None else
          f"history first differs from the stored run's at {first}")
    if capture is not None:
        print(f"the inputs of {tracer.captured} server calls -> {capture}")


def _traced_run(config, tracer: Tracer):
    """`engine.run(config)` with the server strategy's calls wrapped by `tracer`."""
    from fedsteer_lib.simulator import engine

    setup = engine.server_setup

    def traced_setup(cfg, sim):
        strategy, ctx, state = setup(cfg, sim)
        tracer.wrap(strategy)
        return strategy, ctx, state

    engine.server_setup = traced_setup
    try:
        return engine.run(config, progress=False)
    finally:
        engine.server_setup = setup


def replay(capture: Path, out: Path, note: str | None = None) -> None:
    """Run the server calls saved by `record_run(capture=...)` again, each from its saved inputs
    (the state as it was, the same client updates), tracing them: another machine, or the same
    binaries under an emulated CPU, then computes the server step from exactly the inputs the
    first machine had, without any client training."""
    import fedsteer_lib  # noqa: F401  (pins the kernels before torch computes)

    from fedsteer_lib import numerics
    from fedsteer_lib.experiments.config import RunConfig

    calls = 0
    with capture.open("rb") as saved:
        head = pickle.load(saved)
        config = RunConfig.from_dict(head["config"])
        strategy = config.method.build()
        tracer = Tracer()
        tracer.wrap(strategy)
        with numerics.kernels_for_run(config.device, config.precision):
            while True:
                try:
                    name, args, kwargs = pickle.load(saved)
                except EOFError:
                    break
                getattr(strategy, name)(*args, **kwargs)
                calls += 1
            machine = numerics.machine(config.device, config.precision)
    tracer.write(out, _head(head["key"], head["rounds"], config.device, machine, note, replayed_from=capture.name))
    print(f"{calls} server calls replayed, {len(tracer.records)} operations traced on {machine['cpu']} "
          f"({machine['cpu_signature']}), {machine['kernels']} kernels -> {out}")


def _round_of(method, args: tuple, kwargs: dict, last_update: int) -> int:
    """The round a server call belongs to: its round_idx argument; for warm-up snapshots,
    -1 - the cycle; for aggregate (which takes no round), the round after the last update's."""
    given = inspect.signature(method).bind(*args, **kwargs).arguments
    if "round_idx" in given:
        return int(given["round_idx"])
    if "cycle" in given:
        return -1 - int(given["cycle"])
    return last_update + 1


def first_difference(stored: list[dict], new: list[dict]) -> str | None:
    """Where the recorded numbers first differ ("round R, field: stored -> new"), or None, over
    the fields `verify` compares. A number the stored run did not record is not compared (a run
    cut short evaluates its last round, which the full run may not)."""
    from fedsteer_lib.experiments.verify import ROUND_FIELDS

    for a, b in zip(stored, new):
        for field in ROUND_FIELDS:
            v, w = a.get(field), b.get(field)
            if v is not None and v != w:
                return f"round {a['round']}, {field}: {v} -> {w}"
    return None


def read(path: Path) -> tuple[dict, Iterator[dict]]:
    lines = path.read_text().splitlines()
    return json.loads(lines[0]), (json.loads(line) for line in lines[1:])


def compare(a: Path, b: Path) -> int:
    """Print the first operation whose output differs between traces a and b; exit status 1 then."""
    head_a, ops_a = read(a)
    head_b, ops_b = read(b)
    for name, head in ((a, head_a), (b, head_b)):
        m = head["machine"]
        told = ", MKL told the CPU is Intel's" if head.get("mkl_as_intel") else ""
        note = f" ({head['note']})" if head.get("note") else ""
        print(f"{name.name}: {m['cpu']} ({m['cpu_signature']}), {m['kernels']} kernels, MKL {m['mkl_cbwr']}{told}{note}")
    for i, (x, y) in enumerate(zip(ops_a, ops_b)):
        if (x["call"], x["round"], x["op"]) != (y["call"], y["round"], y["op"]):
            print(f"operation {i}: the traces run different operations ({x['op']} in {x['call']} vs {y['op']} in {y['call']})")
            return 1
        if x["in"] != y["in"] or x["out"] != y["out"]:
            inputs = "same inputs" if x["in"] == y["in"] else "different inputs"
            shapes = ", ".join("x".join(map(str, t["shape"])) + f" {t['dtype']}" for t in x["in"])
            print(f"operation {i} ({x['op']} in {x['call']}, round {x['round']}) differs first, with {inputs}: "
                  f"reads {shapes or 'nothing'}")
            return 1
    print("the traces agree on every operation they both hold")
    return 0


def _cpu_word(signature: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", signature).strip("-").lower()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("key", nargs="?", help="a stored run of data/results")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--results", type=Path, help="results directory (default data/results)")
    parser.add_argument("--mkl-as-intel", action="store_true", help="MKL takes its Intel code paths on any CPU")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("TRACE_A", "TRACE_B"))
    parser.add_argument("--capture", type=Path, help="also save every server call's inputs to this file (for --replay)")
    parser.add_argument("--replay", type=Path, metavar="CAPTURE", help="trace the server calls saved by --capture")
    parser.add_argument("--note", help="a word on how this trace was run (kept in its header, shown by --compare)")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.replay:
        if not args.out:
            parser.error("--replay needs --out")
        replay(args.replay, args.out, args.note)
        return 0
    if not args.key:
        parser.error("give a run key, --replay CAPTURE or --compare TRACE_A TRACE_B")
    if args.mkl_as_intel:
        reexec_with_mkl_as_intel()
    from fedsteer_lib.numerics import cpu_signature

    suffix = "-mkl-as-intel" if args.mkl_as_intel else ""
    out = args.out or TRACES / f"{args.key}-{_cpu_word(cpu_signature())}{suffix}.jsonl"
    record_run(args.key, args.rounds, out, args.results, args.capture, args.note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
