"""Client batching on one device: one round's local training, clients one by one against
vectorised groups (`client_batch`), on the real Fashion-MNIST system (N = 100, γ = 0.9, the
frozen training settings). Prints one line per setting and writes a JSON file.

    python bench/gpu_batching.py --device cuda --out data/results/bench/gpu_batching.json
    python bench/gpu_batching.py --device cpu --clients 20 --batches 1,10    # smaller, on a CPU

Measured per setting: seconds for the round (after one untimed warm-up round), samples per
second, and the largest difference to the one-by-one updates relative to their largest entry
(the two agree up to floating-point rounding, which training can amplify; for scale, the
one-by-one round is repeated with the model in the default memory format instead of
channels_last: the same algorithm through other kernels)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedsteer_lib.experiments.config import TUNED, FLSystem, RunConfig, method  # noqa: E402
from fedsteer_lib.simulator.engine import _torch_gen, client_updates, prepare  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(device: str, clients: int, batches: list[int], gamma: float = 0.9, seed: int = 0) -> dict:
    cfg = RunConfig(dataset="fmnist", method=method("fedavg"), system=FLSystem(gamma=gamma), training=TUNED["fmnist"],
                    seed=seed, device=device).validate()
    sim = prepare(cfg)
    dev = torch.device(device)
    ids = list(range(min(clients, cfg.system.num_clients)))
    samples = sum(int(sim.client_labels[i].numel()) for i in ids) * cfg.training.local_epochs
    rows, reference = [], None
    for batch in [1] + [b for b in batches if b != 1]:
        sim.client_batch = batch
        client_updates(sim, cfg.training, sim.initial_weights, ids, _torch_gen(seed, 6))  # warm-up (kernels, caches)
        _sync(dev)
        start = time.perf_counter()
        updates, _, _ = client_updates(sim, cfg.training, sim.initial_weights, ids, _torch_gen(seed, 6))
        _sync(dev)
        seconds = time.perf_counter() - start
        if reference is None:
            reference = updates
        rel = float((updates - reference).abs().max() / reference.abs().max())
        rows.append({"client_batch": batch, "seconds": seconds, "samples_per_s": samples / seconds,
                     "max_rel_diff_to_one_by_one": rel})
        print(f"client_batch={batch:4d}: {seconds:8.3f} s for {len(ids)} clients ({samples / seconds:10.0f} samples/s),"
              f" max rel. diff to one by one {rel:.1e}", flush=True)
    # For scale: the same one-by-one loop with the model in the default (not channels_last) memory
    # format, the layout the vectorised path computes in. Same algorithm, other kernels.
    sim.client_batch = 1
    model = sim.flat_model.model
    model.to(memory_format=torch.contiguous_format)
    contiguous, _, _ = client_updates(sim, cfg.training, sim.initial_weights, ids, _torch_gen(seed, 6))
    model.to(memory_format=torch.channels_last)
    noise = float((contiguous - reference).abs().max() / reference.abs().max())
    print(f"one by one, default memory format: max rel. diff {noise:.1e} (other kernels, same algorithm)", flush=True)
    name = (torch.cuda.get_device_name(dev) if dev.type == "cuda"
            else f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads")
    return {"device": f"{device} ({name})", "torch": torch.__version__, "clients": len(ids), "gamma": gamma,
            "local_samples": samples, "training": vars(cfg.training), "rows": rows,
            "rounding_reference_rel_diff": noise}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--batches", default="1,10,25,50,100", help="client_batch values, comma-separated")
    parser.add_argument("--out", default=str(ROOT / "data/results/bench/gpu_batching.json"))
    args = parser.parse_args()
    result = measure(args.device, args.clients, [int(b) for b in args.batches.split(",")])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
