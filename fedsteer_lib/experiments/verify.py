"""Recompute stored runs from their configs and say what a rerun changes (`python -m fedsteer_lib verify`).

A stored run is recomputed in this process's kernel mode (`numerics`) and compared with what is
stored: "bit-identical" when everything the run computes comes back to the bit (`deterministic`:
its whole history, its extras such as the probes, participation and core set, and its summary
but for the wall times), else the change of the final accuracy, whether the collapse flipped
and which fields differ, with both runs' machines.

Whatever kernels a stored file claims, a run that does not come back bit for bit is reported as
differing and the command's exit status is not 0:

- 1, "NOT REPRODUCED": a run stored with pinned kernels, recomputed with pinned kernels;
- 2, "DIFFERS (...)": only runs whose stored provenance says their bits depend on the CPU that
  computed them (native kernels, bf16, a GPU, the early pins `FIRST_PIN` and `VECTOR_SQRT_PIN`),
  or runs recomputed here with native kernels. Such a difference is expected on another CPU, so
  it is not called a failure, but editing a file's `provenance.kernels` cannot turn a run that
  does not come back into a pass.

`replace_unpinned` also writes the recomputed result in place of a stored run that was not
computed with pinned kernels (how Table 1 was brought into the pinned mode); every comparison
can be appended to a JSON-lines log, from which the rerun page computes its figures.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from .. import numerics
from .config import RunConfig
from .results import json_safe, load_run, parse_result, save_run
from .sweep import run_lock

__all__ = ["Comparison", "Progress", "compare", "select", "verify_runs", "stored_kernels", "machine_words",
           "deterministic", "differences", "read_log", "KEY_PATTERN"]

# The summary's fields that measure time or how the run was computed, not what it computed: left
# out of the comparison (the warm-up's reuse depends on the run before it in the same process).
UNCOMPARED_SUMMARY = ("wall_time", "timing", "warmup_reused")
KEY_PATTERN = re.compile(r"[0-9a-f]{16}")  # a run's key (`RunConfig.key`)


FIRST_PIN = "pinned to MKL's AVX2 branch"  # Intel-only bits: see numerics' module docstring
# A pinned run whose server step took torch.sqrt (before `numerics.sqrt`): its bits depend on the
# CPU (MKL's vector math). Only FedSteer's server takes square roots (`numerics.sqrt` names it).
VECTOR_SQRT_PIN = "pinned, square roots by MKL's vector math"
METHODS_TAKING_SQUARE_ROOTS = ("fedsteer",)


def stored_kernels(payload: dict[str, Any]) -> str:
    """The kernel mode a stored run was computed with ("pinned", "native", "bf16", "gpu"; results
    from before the modes existed are "native": torch's choice on whatever CPU computed them).
    A run pinned under the first pin (MKL's AVX2 branch, whose bits MKL gives only on Intel CPUs)
    is FIRST_PIN, not "pinned": its bits are not demanded on another CPU. Nor are those of a
    FedSteer run pinned before its square roots were correctly rounded (no ``sqrt`` in its
    provenance): VECTOR_SQRT_PIN. `--replace-unpinned` recomputes both kinds."""
    prov = payload.get("provenance", {})
    kernels = prov.get("kernels", "native")
    if kernels == "pinned" and prov.get("mkl_cbwr") == numerics.FIRST_PIN_MKL_CBWR:
        return FIRST_PIN
    if (kernels == "pinned" and "sqrt" not in prov
            and payload.get("config", {}).get("method", {}).get("name") in METHODS_TAKING_SQUARE_ROOTS):
        return VECTOR_SQRT_PIN
    return kernels


def machine_words(prov: dict[str, Any]) -> str:
    """A run's machine in a few words: CPU (with its signature where recorded), kernel mode, code version."""
    cpu = prov.get("cpu") or prov.get("machine") or "unknown CPU"
    if prov.get("cpu_signature", "unknown") != "unknown":
        cpu += f" ({prov['cpu_signature']})"
    kernels = prov.get("kernels", "native (before pinning existed)")
    if kernels == "pinned":
        kernels += f" (MKL {prov.get('mkl_cbwr', '?')})"
    return f"{cpu}, {kernels} kernels, code {prov.get('code_version', '?')}"


def deterministic(history: list, summary: dict[str, Any], extras: dict[str, Any]) -> dict[str, Any]:
    """Everything a run computes that must come back bit for bit, as stored (JSON, NaN as None):
    the history, the extras and the summary without `UNCOMPARED_SUMMARY`."""
    kept = {k: v for k, v in summary.items() if k not in UNCOMPARED_SUMMARY}
    return json.loads(json.dumps(json_safe({"history": history, "summary": kept, "extras": extras})))


def differences(stored: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The fields in which two `deterministic` records differ: "history round R: FIELD" (the
    first differing round), "summary.FIELD" and "extras.FIELD" for each such field."""
    out = []
    old_rows, new_rows = stored.get("history") or [], new.get("history") or []
    for i in range(max(len(old_rows), len(new_rows))):
        a = old_rows[i] if i < len(old_rows) else {}
        b = new_rows[i] if i < len(new_rows) else {}
        if a != b:
            fields = sorted(k for k in {**a, **b} if a.get(k, "absent") != b.get(k, "absent"))
            out.append(f"history round {(a or b).get('round', i)}: {', '.join(fields)}")
            break
    if len(old_rows) != len(new_rows):
        out.append(f"history length {len(old_rows)} -> {len(new_rows)} rows")
    for part in ("summary", "extras"):
        a, b = stored.get(part) or {}, new.get(part) or {}
        out += [f"{part}.{k}" for k in sorted({**a, **b}) if a.get(k) != b.get(k)]
    return out


@dataclass(frozen=True)
class Comparison:
    key: str
    label: str
    gamma: float
    seed: int
    stored_kernels: str
    identical: bool
    stored_accuracy: float
    new_accuracy: float
    stored_collapsed: bool
    new_collapsed: bool
    stored_machine: str
    new_machine: str
    differs_in: tuple[str, ...] = ()  # `differences` (empty when identical)

    @property
    def collapse_flipped(self) -> bool:
        return self.stored_collapsed != self.new_collapsed

    @property
    def must_match(self) -> bool:
        """A pinned run recomputed with pinned kernels must come back bit for bit."""
        return self.stored_kernels == "pinned" and numerics.kernels() == "pinned"

    @property
    def failed(self) -> bool:
        """A run whose bits are demanded (`must_match`) did not come back: exit status 1."""
        return self.must_match and not self.identical

    @property
    def why_not_demanded(self) -> str:
        """Why a difference of this run is expected on another CPU (for a run that `must_match`, "")."""
        if self.must_match:
            return ""
        if self.stored_kernels in (FIRST_PIN, VECTOR_SQRT_PIN):
            return f"its bits are not demanded: {self.stored_kernels}"
        if self.stored_kernels != "pinned":
            return f"stored with {self.stored_kernels} kernels: its bits depend on the CPU that computed it"
        return "recomputed here with native kernels: their bits depend on this CPU"

    def line(self) -> str:
        head = f"{self.key}  {self.label:28s} gamma {self.gamma} seed {self.seed}: "
        if self.identical:
            body = "bit-identical"
        else:
            change = self.new_accuracy - self.stored_accuracy
            flip = (f"; collapse flipped ({'collapsed' if self.stored_collapsed else 'ran'} -> "
                    f"{'collapsed' if self.new_collapsed else 'ran'})") if self.collapse_flipped else "; collapse unchanged"
            body = f"final accuracy {self.stored_accuracy:.4f} -> {self.new_accuracy:.4f} ({change:+.4f}){flip}"
            verdict = ("NOT REPRODUCED (a pinned run must come back bit for bit)" if self.failed
                       else f"DIFFERS ({self.why_not_demanded})")
            shown = list(self.differs_in[:4]) + ([f"{len(self.differs_in) - 4} more"] if len(self.differs_in) > 4 else [])
            body = f"{verdict}: {body}" + (f"; differs in {'; '.join(shown)}" if shown else "")
        return f"{head}{body}\n    stored on {self.stored_machine}\n    now on    {self.new_machine}"

    def record(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "differs_in": list(self.differs_in),
                "collapse_flipped": self.collapse_flipped, "now_kernels": numerics.kernels()}


def compare(payload: dict[str, Any], result, new_provenance: dict[str, Any]) -> Comparison:
    """The comparison of a stored payload with a recomputed `RunResult`: identical when every
    field of `deterministic` is the same to the bit (whatever the payload's provenance says)."""
    config = RunConfig.from_dict(payload["config"])
    s, n = payload["summary"], result.summary
    differ = differences(deterministic(payload["history"], s, payload.get("extras") or {}),
                         deterministic(result.history, n, result.extras))
    return Comparison(key=payload["key"], label=config.method.label, gamma=config.system.gamma, seed=config.seed,
                      stored_kernels=stored_kernels(payload), identical=not differ, differs_in=tuple(differ),
                      stored_accuracy=float(s["final_accuracy"]), new_accuracy=float(n["final_accuracy"]),
                      stored_collapsed=bool(s["collapsed"]), new_collapsed=bool(n["collapsed"]),
                      stored_machine=machine_words(payload.get("provenance", {})),
                      new_machine=machine_words(new_provenance))


def select(configs_by_group: dict[str, list[RunConfig]], root, *, sample: int | None = None, seed: int = 0,
           keys: Sequence[str] = (), stratify: bool = False) -> list[RunConfig]:
    """The stored runs to recompute: those of `keys`, else of the groups (all of them, or a
    random `sample` of N drawn with `seed`; with `stratify`, N per (group, method, gamma), every
    stratum's first draw first). ValueError, one line naming the file, for a key that is not a
    run key (16 hex digits: nothing outside `root`/runs is ever read) or whose file is missing or
    is not that run's usable result."""
    from .results import has_run

    if keys:
        out = []
        for k in keys:
            if not KEY_PATTERN.fullmatch(k):
                raise ValueError(f"--key {k!r}: not a run key (16 hex digits, the name of a file in {Path(root) / 'runs'})")
            path = Path(root) / "runs" / f"{k}.json"
            payload, problem = parse_result(path)
            if problem == "missing":
                raise ValueError(f"--key {k}: no stored run with that key ({path} does not exist)")
            if payload is None:
                raise ValueError(f"--key {k}: {path}: {problem}")
            out.append(RunConfig.from_dict(payload["config"]))
        return out
    seen: dict[str, tuple[str, RunConfig]] = {}
    for group, configs in configs_by_group.items():
        for c in configs:
            seen.setdefault(c.key(), (group, c))
    stored = [(g, c) for g, c in seen.values() if has_run(c, root)]
    if sample is None:
        return [c for _, c in stored]
    rand = random.Random(seed)
    if not stratify:
        return [c for _, c in rand.sample(stored, min(sample, len(stored)))]
    strata: dict[tuple, list[RunConfig]] = {}
    for g, c in stored:
        strata.setdefault((g, c.method.label, c.system.gamma), []).append(c)
    draws = []
    for key in sorted(strata, key=str):
        members = sorted(strata[key], key=lambda c: c.key())
        draws.append(rand.sample(members, min(sample, len(members))))
    # Every stratum's first draw before any stratum's second: a verify cut off early has still
    # covered as many strata as it could.
    out = [d[i] for i in range(sample) for d in draws if i < len(d)]
    return list({c.key(): c for c in out}.values())


def _verify_one(args: tuple[RunConfig, str, int, bool]):
    """Recompute one stored run: (key, RunResult), the result None when `replace` and the run is
    already pinned on disk (another process replaced it) or another process holds its lock."""
    import torch

    from ..simulator.engine import run

    config, root, threads, replace = args
    torch.set_num_threads(threads)
    if not replace:
        return config.key(), run(config, progress=False)
    with run_lock(config, root, wait=False) as held:
        # Read again under the lock: what is on disk now, not what the caller read before.
        if not held or stored_kernels(load_run(config, root)) == "pinned":
            return config.key(), None
        result = run(config, progress=False)
        save_run(result, config, root)
        return config.key(), result


def _start_worker(kernels: str) -> None:
    """A pool worker: this process's kernel mode, and Ctrl-C left to the parent (which stops the
    pool and says what was done), not a KeyboardInterrupt traceback from every worker."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    numerics.select_kernels(kernels)


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


class Progress:
    """How far a long verify has come and about how long it has left: the stored runs' own wall
    times (summary.wall_time, from the machines that first computed them) weigh the runs, scaled
    by how fast this machine has gone through the finished ones, so that an hour-long run left
    for last is not estimated like a one-minute one. Runs without a stored time count alike."""

    def __init__(self, costs: dict[str, float], clock=None):
        import time

        self.clock = clock or time.monotonic
        self.start = self.clock()
        self.costs = costs if all(costs.values()) else dict.fromkeys(costs, 1.0)
        self.total, self.finished, self.done_cost = len(costs), 0, 0.0
        self.left_cost = sum(self.costs.values())

    def finish(self, key: str, computed: bool = True) -> str:
        """Count run `key` as finished (`computed` False: skipped, it took no time) and say where
        the whole stands."""
        self.finished += 1
        self.left_cost -= self.costs[key]
        self.done_cost += self.costs[key] if computed else 0.0
        elapsed = self.clock() - self.start
        words = f"{self.finished} of {self.total} done in {_duration(elapsed)}"
        if self.finished < self.total and self.done_cost > 0:
            words += f", about {_duration(elapsed * self.left_cost / self.done_cost)} left"
        return words


def verify_runs(runs: Sequence[tuple[RunConfig, dict[str, Any]]], root, *, workers: int = 1,
                log: str | os.PathLike | None = None, replace_unpinned: bool = False,
                on_result=print) -> list[Comparison]:
    """Recompute stored runs, given as (config, stored payload) pairs, and compare each with its
    stored result; `on_result` gets each comparison's `line()` as it finishes, with how far the
    whole has come (`Progress`). With `replace_unpinned`, a recomputed run whose stored result
    was not computed with pinned kernels replaces it (this process must be in the pinned mode);
    the runs are then taken seed by seed, each under its run lock, so that several such
    processes share the work and one killed at any moment loses only its current run."""
    from .results import provenance

    if replace_unpinned and numerics.kernels() != "pinned":
        raise numerics.NumericsError("replacing unpinned results needs pinned kernels (this process is native)")
    runs = [(c.replace(device="cpu"), payload) for c, payload in runs]
    stored = {c.key(): payload for c, payload in runs}
    configs = [c for c, _ in runs]
    if replace_unpinned:
        configs.sort(key=lambda c: (c.seed, c.method.name == "full"))
    progress = Progress({k: float(p["summary"].get("wall_time") or 0.0) for k, p in stored.items()})
    out: list[Comparison] = []

    def done(key_result) -> None:
        key, result = key_result
        if result is None:
            progress.finish(key, computed=False)
            return
        comparison = compare(stored[key], result, provenance("cpu", result.machine))
        out.append(comparison)
        on_result(comparison.line() + "\n    " + progress.finish(key))
        if log:  # opened per record: a log file replaced while runs compute (a git checkout) keeps every line
            with open(log, "a") as log_file:
                log_file.write(json.dumps(comparison.record()) + "\n")

    import torch

    todo = [(c, str(root), 1 if workers > 1 else torch.get_num_threads(), replace_unpinned) for c in configs]
    if workers == 1:
        for args in todo:
            done(_verify_one(args))
    else:
        with mp.get_context("spawn").Pool(workers, initializer=_start_worker,
                                          initargs=(numerics.kernels(),)) as pool:  # this process's kernel mode
            for key_result in pool.imap_unordered(_verify_one, todo):
                done(key_result)
    return out


def read_log(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    """Every record of the given JSON-lines logs (the last record of a key wins). ValueError, one
    line naming the file and the line, for a file that is not such a log (unreadable, a line that
    is not a JSON object with a "key")."""
    records: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: cannot be read as a verify log ({getattr(err, 'strerror', None) or err})") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{path}: line {number} is not a verify record (not JSON: {err})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("key"), str):
                raise ValueError(f"{path}: line {number} is not a verify record (no \"key\")")
            records[rec["key"]] = rec
    return list(records.values())
