"""What the pinned kernels cost (issue 33): the same run with pinned and with native kernels.

Each measurement is the same Table 1 run (FedAvg, gamma = 0.9, seed 0, cut to --rounds rounds)
in a fresh process with one thread, FEDSTEER_KERNELS=pinned or native, alternating, --repeats
times each. Recorded per process: the run's wall time and its phases (client training,
evaluation), and the process's CPU time (user + system; less sensitive than wall time to other
work on the machine). Written to data/results/bench/numerics_cost.json; the rerun page shows it.

    .venv/bin/python bench/numerics_cost.py [--rounds 30] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "results" / "bench" / "numerics_cost.json"

CHILD = """
import json, sys, time
import fedsteer_lib
from dataclasses import replace
from fedsteer_lib import numerics
from fedsteer_lib.experiments import groups
from fedsteer_lib.simulator.engine import prepare, run
import torch
torch.set_num_threads(1)
c = next(c for c in groups.paper_grid("fmnist", "paper") if c.method.name == "fedavg" and c.system.gamma == 0.9 and c.seed == 0)
c = c.replace(training=replace(c.training, rounds=int(sys.argv[1])))
sim = prepare(c)
t = time.perf_counter()
r = run(c, progress=False, sim=sim)
print(json.dumps({"wall": time.perf_counter() - t, "client": r.summary["timing"]["client"],
                  "eval": r.summary["timing"]["eval"], "kernels": numerics.kernels(), "machine": r.machine}))
"""


def measure(kernels: str, rounds: int) -> dict:
    env = {**os.environ, "FEDSTEER_KERNELS": kernels, "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(rounds)], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    runs = []
    for _ in range(args.repeats):
        for kernels in ("native", "pinned"):
            m = measure(kernels, args.rounds)
            print(kernels, {k: round(v, 1) for k, v in m.items() if isinstance(v, float)}, flush=True)
            runs.append(m)
    machine = runs[-1]["machine"]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"cpu": machine["cpu"], "cpu_flags": machine["cpu_flags"], "torch": machine["torch"],
                               "run": f"FedAvg run of Table 1 (γ = 0.9, seed 0) cut to {args.rounds} rounds",
                               "repeats": args.repeats,
                               "runs": [{k: v for k, v in r.items() if k != "machine"} for r in runs]}, indent=1))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
