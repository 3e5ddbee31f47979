"""One small FedSteer workload three ways: our engine, Flower's simulation and a Flower deployment
on 127.0.0.1 (both driven by `flwr run` on examples/flower_app, as a practitioner runs them).

    python bench/flower_vs_engine.py --out data/results/bench/flower_vs_engine.json

The workload: Fashion-MNIST, `--clients` clients holding the engine's partition (the paper's two
label groups, gamma = 0.5, `--points` points per client), each participating with probability
`--prob` in every training round; the paper's Fashion-MNIST CNN (the app's `Net` is the same
architecture, seeded alike); E = 1 epoch of SGD (batch 32, lr 0.05); FedSteer with |X| = 2,
lambda = 0.5, `--warmup` warm-up rounds then `--rounds` training rounds. The Flower runs train on
the engine's partitions, exported as the app's partition files; their draws are their own (the
same p_i), so their models differ from the engine's; the equivalence is measured separately.

Measured (wall time, seconds):
- engine: `engine.run` in this process, data preparation included (and apart);
- Flower simulation: a simulation SuperLink, then `flwr run` with `--clients` simulated nodes
  (Ray): the `flwr run` process from submission to the end of the run (FAB build, ServerApp
  process, Ray start, every round), the rounds themselves (`strategy.start`, from the ServerApp's
  log) and, apart, the SuperLink's start-up;
- Flower deployment: a SuperLink and `--clients` SuperNodes (every message starts a ClientApp
  process on its node), the same `flwr run` and the same split, the SuperLink's and SuperNodes'
  start-up apart.
Equivalence (Flower's in-process simulation, `fedsteer_lib.flower.replay`): FedSteer with the
engine's draws replayed against the engine, round by round. (Our FedAvg against Flower's FedAvg
is checked by tests/test_flower.py, with a client that declares no participation probability:
these engine clients declare theirs, so our FedAvg would sample them and Flower's would not.)

The JSON goes to --out; the table that book/flower.md includes goes next to it (same name, .md),
rendered from the JSON by `render`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
APP = ROOT / "examples" / "flower_app"


def workload(args: argparse.Namespace):
    from fedsteer_lib.experiments.config import FLSystem, RunConfig, Training, method

    return RunConfig(method=method("fedsteer", core_size=2, lam=0.5, warmup_cycles=args.warmup),
                     system=FLSystem(num_clients=args.clients, gamma=0.5, weak_prob=args.prob,
                                     powerful_prob=args.prob, points_scale=args.points // 2),
                     training=Training(rounds=args.rounds, local_epochs=1, batch_size=32, client_lr=0.05,
                                       eval_every=args.rounds, eval_last=1),
                     seed=0, batch_stream="per_client")


def run_config(config, partitions: Path, out: Path) -> dict:
    """The app's run config for the same workload."""
    tr, steer = config.training, config.method
    return {"method": "fedsteer", "num-server-rounds": steer.get("warmup_cycles") + tr.rounds,
            "warmup-rounds": steer.get("warmup_cycles"), "core-size": steer.get("core_size"), "lam": steer.get("lam"),
            "fraction-train": config.system.powerful_prob, "min-train-nodes": 0,
            "min-available-nodes": config.system.num_clients, "server-lr": tr.server_lr, "seed": config.seed,
            "local-epochs": tr.local_epochs, "batch-size": tr.batch_size, "lr": tr.client_lr, "samples-per-node": 0,
            "partitions-dir": str(partitions), "central-eval": False, "out-dir": str(out)}


def export_partitions(sim, folder: Path) -> None:
    """The engine's client data as the app's partition files (raw uint8 images, labels)."""
    import torch

    from fedsteer_lib.simulator.data import load_dataset

    splits = load_dataset("fmnist")
    folder.mkdir(parents=True, exist_ok=True)
    n = sim.federation.num_clients
    for i, ix in enumerate(sim.federation.client_indices):
        torch.save({"images": splits.train_images[ix].clone(), "labels": splits.train_labels[ix].long().clone()},
                   folder / f"partition-{i}-of-{n}.pt")


def engine_side(config) -> tuple[dict, list]:
    from fedsteer_lib.simulator import engine

    models, real_round = [], engine._round

    def recording(*a, **kw):
        w = real_round(*a, **kw)
        models.append(w.clone())
        return w

    start = time.perf_counter()
    sim = engine.prepare(config)
    prepared = time.perf_counter()
    engine._round = recording
    try:
        engine.run(config, progress=False, sim=sim)
    finally:
        engine._round = real_round
    end = time.perf_counter()
    return {"wall_s": end - start, "rounds_s": end - prepared, "prepare_s": prepared - start}, models, sim


def equivalence(config, sim, engine_models: list) -> dict:
    """Flower's in-process simulation: FedSteer with the engine's draws against the engine, and
    our FedAvg against Flower's FedAvg (full participation, the same client)."""
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fedsteer_lib.flower import replay
    from fedsteer_lib.flower.records import Layout

    steer = replay.replay_strategy(config, sim.federation)
    models: dict[int, object] = {}
    initial = replay.initial_arrays(config)
    rounds = steer.warmup_rounds + config.training.rounds
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        steer.start(grid=grid, initial_arrays=initial, num_rounds=rounds,
                    evaluate_fn=lambda r, a: models.__setitem__(r, Layout.of(a).flat(a)))

    run_simulation(server_app=app, client_app=replay.engine_client_app(config), num_supernodes=config.system.num_clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False}})
    per_round = [float((models[steer.warmup_rounds + t + 1] - w).abs().max()) for t, w in enumerate(engine_models)]
    return {"fedsteer_vs_engine_max_abs_diff_per_round": per_round}


def strategy_seconds(log: str) -> float:
    found = re.findall(r"Strategy execution finished in ([0-9.]+)s", log)
    if not found:
        raise RuntimeError(f"the run did not finish:\n{log[-3000:]}")
    return float(found[-1])


def flower_side(config, folder: Path, simulation: bool) -> dict:
    from fedsteer_lib.flower.launch import LocalFederation

    name = "simulation" if simulation else "deployment"
    start = time.perf_counter()
    with LocalFederation(folder / name, config.system.num_clients, simulation=simulation) as fed:
        up = time.perf_counter()
        code = fed.run(APP, run_config(config, folder / "partitions", folder / name / "out"), timeout=1800)
        end = time.perf_counter()
        log = fed.log()
    if code != 0 or not (folder / name / "out" / "summary.json").exists():
        raise RuntimeError(f"flwr run ({name}) failed with code {code}:\n{log[-3000:]}")
    return {"wall_s": end - up, "rounds_s": strategy_seconds(log), "startup_s": up - start}


def render(data: dict) -> str:
    """The book's table (markdown) from the bench's JSON."""
    w, eq = data["workload"], data["equivalence"]
    rows = [("our engine (one process)", data["engine"]["wall_s"], data["engine"]["rounds_s"], None),
            ("Flower simulation (`flwr run`, Ray)", data["simulation"]["wall_s"], data["simulation"]["rounds_s"],
             data["simulation"]["startup_s"]),
            ("Flower deployment (`flwr run`, SuperLink + SuperNodes on 127.0.0.1)", data["deployment"]["wall_s"],
             data["deployment"]["rounds_s"], data["deployment"]["startup_s"])]
    lines = ["| run | wall time (s) | of which the rounds (s) | start-up before the run (s) |",
             "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {wall:.1f} | {rounds:.1f} | {'–' if up is None else f'{up:.1f}'} |"
              for name, wall, rounds, up in rows]
    lines += ["", f"FedSteer (|X| = {w['core_size']}, λ = {w['lam']}) on {w['clients']} Fashion-MNIST clients of "
              f"{w['points_per_client']} points each, p = {w['prob']}, {w['warmup_rounds']} warm-up + "
              f"{w['training_rounds']} training rounds, one epoch of SGD per round; measured on "
              f"{data['machine']['cpus']} CPU cores ({data['machine']['cpu']}), load average "
              f"{data['machine']['load_before']:.1f} before the runs, {data['machine']['date']}. "
              f"With the engine's draws replayed, Flower's simulation ends every round with the engine's model "
              f"(max abs difference {max(eq['fedsteer_vs_engine_max_abs_diff_per_round']):.3g} over "
              f"{len(eq['fedsteer_vs_engine_max_abs_diff_per_round'])} rounds)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--points", type=int, default=200, help="points per client")
    parser.add_argument("--prob", type=float, default=0.5, help="every client's participation probability")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4, help="training rounds (after the warm-up)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON (and the .md table) here")
    args = parser.parse_args()

    import fedsteer_lib  # noqa: F401  (the kernel mode, before torch computes)

    config = workload(args)
    load = os.getloadavg()[0]
    engine, engine_models, sim = engine_side(config)
    print(f"engine: {engine}", flush=True)
    eq = equivalence(config, sim, engine_models)
    print(f"equivalence: {eq}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        export_partitions(sim, Path(tmp) / "partitions")
        simulation = flower_side(config, Path(tmp), simulation=True)
        print(f"simulation: {simulation}", flush=True)
        deployment = flower_side(config, Path(tmp), simulation=False)
        print(f"deployment: {deployment}", flush=True)
    import torch

    data = {"workload": {"clients": args.clients, "points_per_client": args.points, "prob": args.prob,
                         "warmup_rounds": args.warmup, "training_rounds": args.rounds, "core_size": 2, "lam": 0.5,
                         "config_key": config.key()},
            "engine": engine, "simulation": simulation, "deployment": deployment, "equivalence": eq,
            "machine": {"cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
                        "load_before": load, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}}
    from fedsteer_lib import numerics

    data["machine"]["cpu"] = numerics.cpu_model()
    print(render(data))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(render(data))


if __name__ == "__main__":
    main()
