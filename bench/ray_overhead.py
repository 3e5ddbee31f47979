"""Wall time of the same small grid under the local process pool and under Ray (a local Ray
instance with the same number of CPUs, started and stopped inside the timing), in one
invocation; writes data/results/bench/ray_overhead.json and prints the ratio ray / local.

    .venv/bin/python bench/ray_overhead.py [--workers 2] [--rounds 60]
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, method
from fedsteer_lib.experiments.results import runs_table
from fedsteer_lib.experiments.sweep import run_grid

OUT = Path(__file__).resolve().parents[1] / "data" / "results" / "bench" / "ray_overhead.json"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    configs = [RunConfig(method=method(m), system=FLSystem(gamma=0.9), seed=s,
                         training=Training(rounds=args.rounds, local_epochs=1, eval_every=10, eval_last=1))
               for s in (0, 1) for m in ("fedavg", "fedavg_unbiased", "fedvarp", "mifa")]
    times, tables = {}, {}
    for executor in ("local", "ray"):
        with tempfile.TemporaryDirectory() as root:
            start = time.perf_counter()
            run_grid(configs, root, workers=args.workers, executor=executor, progress=False)
            times[executor] = time.perf_counter() - start
            tables[executor] = runs_table(configs, root)[["key", "final_accuracy", "final_loss"]]
    record = {"runs": len(configs), "rounds": args.rounds, "clients": 100, "workers": args.workers,
              "wall_time_local_s": round(times["local"], 1), "wall_time_ray_s": round(times["ray"], 1),
              "ratio_ray_over_local": round(times["ray"] / times["local"], 3),
              "identical_results": bool(tables["local"].equals(tables["ray"])),
              "machine": platform.machine(), "cpus": torch.get_num_threads(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
