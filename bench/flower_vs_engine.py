"""The same FedSteer workload in our engine and in Flower's simulation, side by side.

    OMP_NUM_THREADS=1 python bench/flower_vs_engine.py [--rounds 20] [--clients 100] [--out PATH]

FedSteer as in the paper on Fashion-MNIST (|X| = 40, lambda = 0.5, 5 warm-up cycles), the paper's
participation (100 clients, p_i in {0.04, 0.16}), the tuned local training, batch_stream =
"per_client" so that both compute the same model. Each side runs in its own child process (one
invocation of this script starts both, one after the other), and the parent samples the RSS of
that child's whole process tree (Ray's processes included) every 0.1 s. Printed, per side and
as Flower / engine ratios:

- wall time: the child's whole run (data loading, Ray start-up, warm-up, rounds);
- training-phase time: in the engine the time in `client_updates` (all local training, warm-up
  included; not the warm-up's core-set selection); in Flower the time the server waits on the
  clients' training replies (grid.send_and_receive of TRAIN messages, warm-up included), i.e.
  local training plus Flower's messaging;
- peak RSS of the process tree;
- the max abs difference of the two final models.

The engine evaluates only at rounds 0 and T (Flower not at all). JSON goes to `--out` only.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def workload(clients: int, rounds: int, warmup_cycles: int):
    from dataclasses import replace

    from fedsteer_lib.experiments.config import TUNED, FLSystem, RunConfig, method

    training = replace(TUNED["fmnist"], rounds=rounds, eval_every=rounds, eval_last=1)
    return RunConfig(method=method("fedsteer", core_size=min(40, clients), lam=0.5, warmup_cycles=warmup_cycles),
                     system=FLSystem(num_clients=clients), training=training, seed=0, batch_stream="per_client")


def run_engine(config, model_path: str) -> dict:
    import torch

    from fedsteer_lib.simulator import engine

    final, trained = {}, {"s": 0.0}
    real_round, real_updates = engine._round, engine.client_updates

    def keep_last(*args, **kwargs):
        final["w"] = real_round(*args, **kwargs)
        return final["w"]

    def timed_updates(*args, **kwargs):  # local training only (the warm-up's timing also holds the selection)
        start = time.perf_counter()
        out = real_updates(*args, **kwargs)
        trained["s"] += time.perf_counter() - start
        return out

    engine._round, engine.client_updates = keep_last, timed_updates
    start = time.perf_counter()
    engine.run(config, progress=False)
    wall = time.perf_counter() - start
    torch.save(final["w"], model_path)
    return {"wall_s": wall, "training_s": trained["s"]}


def run_flower(config, model_path: str, cpus: int) -> dict:
    import torch
    from flwr.app import Context, MessageType
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from fedsteer_lib.flower import FlowerStrategy, client_app

    strategy = FlowerStrategy(config)
    waited = {"s": 0.0}

    class TimedGrid:  # the real grid, timing the waits on training replies
        def __init__(self, grid):
            self.grid = grid

        def __getattr__(self, name):
            return getattr(self.grid, name)

        def send_and_receive(self, messages, **kw):
            messages = list(messages)
            start = time.perf_counter()
            replies = list(self.grid.send_and_receive(messages, **kw))
            if messages and messages[0].metadata.message_type == MessageType.TRAIN:
                waited["s"] += time.perf_counter() - start
            return replies

    app = ServerApp()

    @app.main()
    def main(grid, context: Context) -> None:
        strategy.run(TimedGrid(grid))

    start = time.perf_counter()
    run_simulation(server_app=app, client_app=client_app(config), num_supernodes=config.system.num_clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": cpus, "include_dashboard": False}})
    wall = time.perf_counter() - start
    torch.save(strategy.weights, model_path)
    return {"wall_s": wall, "training_s": waited["s"]}


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc] + proc.children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(side: str, args: argparse.Namespace, tmp: Path) -> dict:
    """Run one side in a child process; its numbers plus the peak RSS of its process tree."""
    report = tmp / f"{side}.json"
    cmd = [sys.executable, __file__, "--side", side, "--clients", str(args.clients), "--rounds", str(args.rounds),
           "--warmup-cycles", str(args.warmup_cycles), "--flower-cpus", str(args.flower_cpus), "--tmp", str(tmp)]
    log = tmp / f"{side}.log"
    with log.open("w") as sink:
        child = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
        proc, peak = psutil.Process(child.pid), 0
        while child.poll() is None:
            peak = max(peak, tree_rss(proc))
            time.sleep(0.1)
    if child.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"the {side} side failed (exit {child.returncode}):\n{tail}")
    return {**json.loads(report.read_text()), "peak_rss_mb": peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup-cycles", type=int, default=5)
    parser.add_argument("--flower-cpus", type=int, default=1, help="CPUs Ray may use (one client actor per CPU)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here (nothing is written without it)")
    parser.add_argument("--side", choices=("engine", "flower"), help=argparse.SUPPRESS)
    parser.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    config = workload(args.clients, args.rounds, args.warmup_cycles)
    if args.side:  # a child: run one side, leave its numbers and final model in --tmp
        model = str(args.tmp / f"{args.side}.pt")
        numbers = run_engine(config, model) if args.side == "engine" else run_flower(config, model, args.flower_cpus)
        (args.tmp / f"{args.side}.json").write_text(json.dumps(numbers))
        return

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        sides = {side: measure(side, args, Path(tmp)) for side in ("engine", "flower")}
        diff = float((torch.load(Path(tmp) / "engine.pt") - torch.load(Path(tmp) / "flower.pt")).abs().max())
    ratios = {k: sides["flower"][k] / sides["engine"][k] for k in ("wall_s", "training_s", "peak_rss_mb")}
    out = {"workload": {"clients": args.clients, "rounds": args.rounds, "warmup_cycles": args.warmup_cycles,
                        "method": config.method.label, "flower_cpus": args.flower_cpus, "config_key": config.key()},
           **sides, "ratio_flower_over_engine": ratios, "final_model_max_abs_diff": diff}
    for side in ("engine", "flower"):
        s = sides[side]
        print(f"{side:7s} wall {s['wall_s']:7.1f} s   training {s['training_s']:7.1f} s   peak RSS {s['peak_rss_mb']:7.0f} MB")
    print("Flower / engine: wall {wall_s:.2f}x, training {training_s:.2f}x, peak RSS {peak_rss_mb:.2f}x".format(**ratios))
    print(f"final models: max abs difference {diff:.3g}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
