"""float32 against bfloat16 on this machine, in one process, interleaved (issue 32).

    .venv/bin/python bench/precision.py [--repeats 3] [--rounds 150] [--out data/results/bench/precision.json]
    python bench/precision.py --device cuda --rounds 30 --out $OUT/precision_cuda.json   # bench/gpu_session.sh

Every measurement runs with the kernels a run of that precision gets (`numerics.kernels_for_run`:
in the default pinned process, fp32 with ATen at AVX2, oneDNN off, one thread; bf16 with oneDNN
on, one thread) and is timed in process CPU time (less sensitive than wall time to the other
work on a shared machine; wall time is recorded too), fp32 and bf16 alternating, `--repeats`
times each (medians are reported):

- the matrix-multiply peaks of float32 and bfloat16 (square matrices of 256, 512 and 1024; the
  best size), so each figure below is also a share of its own peak;
- (a) client training (`training.local_train`, batch 32) of each of the three models, in
  samples/s and GFLOP/s (forward + backward = 3 x the forward's multiply-adds);
- (b) evaluation (`training.evaluate`) of the 10,000 Fashion-MNIST test images;
- what else might help bf16 beyond autocast: oneDNN off (the pinned fp32 setting), the images
  stored in bfloat16, evaluation in batches of 1,000;
- (c) a whole run of Table 1 (Fashion-MNIST, gamma = 0.9, seed 0) of FedAvg and of FedSteer, cut
  to `--rounds` rounds, with its phases (`--run-repeats` times each, 0 to skip).

The machine's load average is recorded before and after each part. The rerun page's "Running
faster" section is generated from the JSON (`tools/precision_report.py`). With `--device cuda`
(a GPU session, `bench/gpu_session.sh`) the same measurements run on the GPU, timed in wall time
with the GPU synchronised, the peaks over larger matrices.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fedsteer_lib  # noqa: E402,F401  (sets the kernel mode before torch computes)
import torch  # noqa: E402

from fedsteer_lib import numerics  # noqa: E402
from fedsteer_lib.experiments import groups  # noqa: E402
from fedsteer_lib.simulator.engine import prepare, run  # noqa: E402
from fedsteer_lib.simulator.models import build_model  # noqa: E402
from fedsteer_lib.simulator.training import FlatModel, evaluate, local_train  # noqa: E402

OUT = ROOT / "data" / "results" / "bench" / "precision.json"
PRECISIONS = ("fp32", "bf16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# The goals for bf16 over fp32 on a 2-core machine with AMX (speed ratios, > 1 is faster).
GOALS = {"client_training": 1.6, "whole_run": 1.5}
MODELS = {  # data set: (input shape, classes, training samples per measurement)
    "fmnist": ((1, 28, 28), 10, 1024),
    "emnist": ((1, 28, 28), 47, 512),
    "cifar10": ((3, 32, 32), 10, 64),
}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


DEVICE = "cpu"  # set by --device


def _sync() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


class Timer:
    """Process CPU time and wall time of a block; `cpu` is what the figures use: the process's
    CPU time on a CPU, the wall time with the GPU synchronised on a GPU."""

    def __enter__(self):
        _sync()
        self.cpu, self.wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        _sync()
        self.cpu, self.wall = time.process_time() - self.cpu, time.perf_counter() - self.wall
        if DEVICE.startswith("cuda"):
            self.cpu = self.wall


def matmul_gflops(precision: str, n: int, min_cpu: float = 0.5) -> float:
    """GFLOP/s of n x n @ n x n at `precision`, repeated until `min_cpu` seconds of CPU time."""
    with numerics.kernels_for_run(DEVICE, precision):
        a = torch.randn(n, n, device=DEVICE).to(DTYPES[precision])
        b = torch.randn(n, n, device=DEVICE).to(DTYPES[precision])
        a @ b
        reps, spent = 0, 0.0
        while spent < min_cpu:
            with Timer() as t:
                a @ b
            reps, spent = reps + 1, spent + t.cpu
    return 2 * n**3 * reps / spent / 1e9


def forward_flops(model: torch.nn.Module, shape: tuple[int, ...]) -> float:
    """Multiply-add FLOPs (x2) of the conv and linear layers for one sample."""
    total = 0.0

    def hook(mod, inp, out):
        nonlocal total
        if isinstance(mod, torch.nn.Conv2d):
            total += 2 * out.numel() * (mod.in_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1]
        elif isinstance(mod, torch.nn.Linear):
            total += 2 * mod.in_features * mod.out_features * (out.numel() // mod.out_features)

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, *shape, device=next(model.parameters()).device))
    model.train(was_training)
    for h in handles:
        h.remove()
    return total


def train_once(fm: FlatModel, x: torch.Tensor, y: torch.Tensor, precision: str, onednn: bool | None = None) -> Timer:
    """One epoch of `local_train` over (x, y) at `precision` with its run's kernels (`onednn`:
    force oneDNN on or off inside them)."""
    with numerics.kernels_for_run(DEVICE, precision):
        if onednn is not None:
            torch.backends.mkldnn.enabled = onednn
        with Timer() as t:
            local_train(fm, fm.get_flat(), x, y, epochs=1, batch_size=32, lr=0.01,
                        generator=torch.Generator().manual_seed(0), precision=precision)
    return t


def eval_once(fm: FlatModel, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, precision: str,
              batch_size: int = 128) -> Timer:
    with numerics.kernels_for_run(DEVICE, precision):
        with Timer() as t:
            evaluate(fm, w, x, y, batch_size=batch_size, precision=precision)
    return t


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of (a), (b) and the peaks")
    parser.add_argument("--rounds", type=int, default=150, help="rounds of the whole runs (c)")
    parser.add_argument("--run-repeats", type=int, default=1, help="interleaved repeats of each whole run (0: skip)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--smoke", action="store_true",
                        help="a check of this script only: the Fashion-MNIST model, 1,000 images, FedAvg's run only")
    args = parser.parse_args()
    models = {"fmnist": (MODELS["fmnist"][0], 10, 128)} if args.smoke else MODELS

    def save() -> None:  # after every part: a crash or a kill keeps what was measured
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")

    global DEVICE
    DEVICE = args.device
    gpu = DEVICE.startswith("cuda")
    torch.set_num_threads(1)
    machine = numerics.machine(DEVICE)
    out: dict = {"cpu": machine["cpu"], "cpu_flags": machine["cpu_flags"], "bf16_units": numerics.has_bf16_units(),
                 "torch": machine["torch"], "onednn_version": machine["onednn_version"],
                 "process_kernels": numerics.kernels(),
                 "run_kernels": {p: numerics.run_kernels(DEVICE, p) for p in PRECISIONS}, "threads": 1,
                 "device": torch.cuda.get_device_name(DEVICE) if gpu else "cpu",
                 "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                 "repeats": args.repeats, "goals": GOALS, "load": {"start": load()},
                 "timer": "wall time, GPU synchronised" if gpu else "process CPU time"}
    print(f"{out['cpu']} ({', '.join(out['cpu_flags'])}); bf16 units: {out['bf16_units']}; load {out['load']['start']}",
          flush=True)

    # Peaks.
    sizes = (1024, 2048, 4096, 8192) if gpu else (256, 512, 1024)
    peaks = {p: {n: [] for n in sizes} for p in PRECISIONS}
    for _ in range(args.repeats):
        for n in sizes:
            for p in PRECISIONS:
                peaks[p][n].append(matmul_gflops(p, n))
    out["peaks"] = {p: {"gflops": max(median(v) for v in peaks[p].values()),
                        "by_size": {str(n): median(v) for n, v in peaks[p].items()}} for p in PRECISIONS}
    out["load"]["after_peaks"] = load()
    print("peaks GFLOP/s:", {p: round(v["gflops"], 1) for p, v in out["peaks"].items()}, flush=True)
    save()

    # (a) client training of each model, and what might help bf16 beyond autocast.
    out["training"] = {}
    variants = {"bf16, oneDNN off": ("bf16", False, False), "bf16, images stored in bf16": ("bf16", None, True)}
    out["variants"] = {}
    for dataset, (shape, classes, samples) in models.items():
        torch.manual_seed(0)
        model = build_model(dataset, classes, shape[0])
        flops = 3 * forward_flops(model, shape)
        fm = FlatModel(model, DEVICE)
        x = torch.randn(samples, *shape).contiguous(memory_format=torch.channels_last).to(DEVICE)
        y = torch.randint(0, classes, (samples,)).to(DEVICE)
        times: dict[str, list[Timer]] = {p: [] for p in PRECISIONS}
        extra: dict[str, list[Timer]] = {v: [] for v in variants} if dataset == "fmnist" and not gpu else {}
        for p in PRECISIONS:  # first touch: allocations, kernel choice
            train_once(fm, x[:64], y[:64], p)
        for _ in range(args.repeats):
            for p in PRECISIONS:
                times[p].append(train_once(fm, x, y, p))
            for name in extra:
                p, onednn, stored = variants[name]
                extra[name].append(train_once(fm, x.to(torch.bfloat16) if stored else x, y, p, onednn))
        row: dict = {"samples": samples, "flops_per_sample": flops}
        for p in PRECISIONS:
            cpu = median([t.cpu for t in times[p]])
            rate = samples / cpu
            row[p] = {"samples_per_s": rate, "gflops": rate * flops / 1e9,
                      "share_of_peak": rate * flops / 1e9 / out["peaks"][p]["gflops"],
                      "cpu_s": [t.cpu for t in times[p]], "wall_s": [t.wall for t in times[p]]}
        row["bf16_speedup"] = row["bf16"]["samples_per_s"] / row["fp32"]["samples_per_s"]
        out["training"][dataset] = row
        for name, ts in extra.items():
            rate = samples / median([t.cpu for t in ts])
            out["variants"][f"fmnist training, {name}"] = {
                "samples_per_s": rate, "vs_chosen_bf16": rate / row["bf16"]["samples_per_s"]}
        print(f"training {dataset}: fp32 {row['fp32']['samples_per_s']:.0f}/s, bf16 {row['bf16']['samples_per_s']:.0f}/s "
              f"({row['bf16_speedup']:.2f}x)", flush=True)
    out["load"]["after_training"] = load()
    save()

    # (b) evaluation of the 10,000 test images.
    c = next(c for c in groups.paper_grid("fmnist", "paper") if c.method.name == "fedavg" and c.system.gamma == 0.9
             and c.seed == 0).replace(device=DEVICE)
    sim = prepare(c)
    fm, w = sim.flat_model, sim.initial_weights
    xt, yt = sim.eval_images, sim.eval_labels
    if args.smoke:
        xt, yt = xt[:1000], yt[:1000]
    for p in PRECISIONS:
        eval_once(fm, w, xt[:1000], yt[:1000], p)
    ev: dict[str, list[Timer]] = {p: [] for p in PRECISIONS}
    ev_big: list[Timer] = []
    for _ in range(args.repeats):
        for p in PRECISIONS:
            ev[p].append(eval_once(fm, w, xt, yt, p))
        ev_big.append(eval_once(fm, w, xt, yt, "bf16", batch_size=1000))
    out["evaluation"] = {"images": int(yt.shape[0]), "batch_size": 128,
                         **{p: {"cpu_s": median([t.cpu for t in ev[p]]), "wall_s": median([t.wall for t in ev[p]])}
                            for p in PRECISIONS}}
    out["evaluation"]["bf16_speedup"] = out["evaluation"]["fp32"]["cpu_s"] / out["evaluation"]["bf16"]["cpu_s"]
    out["variants"]["evaluation, bf16 in batches of 1000"] = {
        "cpu_s": median([t.cpu for t in ev_big]), "vs_chosen_bf16": out["evaluation"]["bf16"]["cpu_s"] / median(
            [t.cpu for t in ev_big])}
    out["load"]["after_evaluation"] = load()
    save()
    print(f"evaluation: fp32 {out['evaluation']['fp32']['cpu_s']:.2f} s, bf16 {out['evaluation']['bf16']['cpu_s']:.2f} s",
          flush=True)

    # (c) whole runs.
    out["runs"] = {}
    if args.run_repeats:
        specs = {"fedavg": c, "fedsteer": next(
            g for g in groups.paper_grid("fmnist", "paper") if g.method.name == "fedsteer" and g.system.gamma == 0.9
            and g.seed == 0 and g.method.get("refresh_every") == 1).replace(device=DEVICE)}
        if args.smoke:
            specs.pop("fedsteer")  # its warm-up alone takes minutes
        res: dict = {m: {p: [] for p in PRECISIONS} for m in specs}
        for _ in range(args.run_repeats):
            for m, spec in specs.items():
                for p in PRECISIONS:
                    cfg = spec.replace(training=replace(spec.training, rounds=args.rounds), precision=p)
                    sim.warmup = None  # every run pays its own warm-up
                    with Timer() as t:
                        r = run(cfg, progress=False, sim=sim)
                    res[m][p].append({"cpu_s": t.cpu, "wall_s": t.wall, "timing": r.summary["timing"],
                                      "final_accuracy": r.summary["final_accuracy"], "load": load()})
                    print(f"run {m} {p}: {t.cpu:.0f} s CPU, {t.wall:.0f} s wall, "
                          f"{ {k: round(v, 1) for k, v in r.summary['timing'].items() if v} }", flush=True)
        for m in specs:
            row = {"rounds": args.rounds, **{p: {"cpu_s": median([x["cpu_s"] for x in res[m][p]]),
                                                 "wall_s": median([x["wall_s"] for x in res[m][p]]),
                                                 "timing": res[m][p][0]["timing"], "repeats": res[m][p]}
                                             for p in PRECISIONS}}
            row["bf16_speedup"] = row["fp32"]["cpu_s"] / row["bf16"]["cpu_s"]
            out["runs"][m] = row
    out["load"]["end"] = load()
    out["complete"] = True
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
