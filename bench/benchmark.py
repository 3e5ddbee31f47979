"""Speed and memory benchmark (issue: library speed targets). Run: `.venv/bin/python bench/benchmark.py`.

Prints, from one run on this machine:
1. fp32 matrix-multiply peak (GFLOP/s) and local training throughput of the Fashion-MNIST CNN
   (samples/s and GFLOP/s, the ratio to the peak; target >= 70 %);
2. evaluation time of 10,000 test images;
3. FedSteer's server step at d = 1.8 M (EMNIST model, N = 100, k = 10, ~10 active clients)
   as a share of a round's time (target <= 5 %);
4. server state bytes per method at N = 100 for both models;
5. a one-round timing breakdown per method on the real Fashion-MNIST system.
The numbers are written to data/results/bench/benchmark.json.
"""
from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedsteer_lib.experiments.config import METHOD_DEFAULTS, FLSystem, RunConfig, TUNED, method  # noqa: E402
from fedsteer_lib.simulator.engine import prepare, run  # noqa: E402
from fedsteer_lib.simulator.models import build_model, num_parameters  # noqa: E402
from fedsteer_lib.experiments.registry import make_strategy  # noqa: E402
from fedsteer_lib.strategy import ServerContext  # noqa: E402
from fedsteer_lib.simulator.training import FlatModel, evaluate, local_train  # noqa: E402


def matmul_peak(n: int = 1024, reps: int = 20) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def forward_flops(model: torch.nn.Module, shape: tuple[int, ...]) -> float:
    """Multiply-add FLOPs (x2) of conv and linear layers for one sample."""
    total = 0.0

    def hook(mod, inp, out):
        nonlocal total
        if isinstance(mod, torch.nn.Conv2d):
            total += 2 * out.numel() * (mod.in_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1]
        elif isinstance(mod, torch.nn.Linear):
            total += 2 * mod.in_features * mod.out_features * (out.numel() // mod.out_features)

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        model(torch.zeros(1, *shape))
    for h in handles:
        h.remove()
    return total


def training_throughput(dataset: str, classes: int, samples: int = 4000) -> dict:
    model = build_model(dataset, classes, 1)
    flops = 3 * forward_flops(model, (1, 28, 28))  # forward + backward ~ 3x forward
    fm = FlatModel(model)
    w = fm.get_flat()
    x = torch.randn(samples, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (samples,))
    gen = torch.Generator().manual_seed(0)
    local_train(fm, w, x[:256], y[:256], epochs=1, batch_size=32, lr=0.01, generator=gen)
    start = time.perf_counter()
    local_train(fm, w, x, y, epochs=1, batch_size=32, lr=0.01, generator=gen)
    rate = samples / (time.perf_counter() - start)
    return {"samples_per_s": rate, "gflops": rate * flops / 1e9, "flops_per_sample": flops,
            "params": num_parameters(model), "model": fm}


def main() -> None:
    torch.manual_seed(0)
    out: dict = {"machine": platform.machine(), "threads": torch.get_num_threads(), "torch": torch.__version__}
    peak = matmul_peak()
    fm_train = training_throughput("fmnist", 10)
    out["matmul_peak_gflops"] = peak
    out["fmnist_training"] = {k: v for k, v in fm_train.items() if k != "model"}
    out["fmnist_training_share_of_peak"] = fm_train["gflops"] / peak
    print(f"fp32 matmul peak: {peak:.0f} GFLOP/s ({torch.get_num_threads()} threads)")
    print(f"FMNIST CNN local training: {fm_train['samples_per_s']:.0f} samples/s = {fm_train['gflops']:.0f} GFLOP/s "
          f"= {100 * out['fmnist_training_share_of_peak']:.0f} % of peak (target >= 70 %)")

    fm = fm_train["model"]
    xt = torch.randn(10000, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    yt = torch.randint(0, 10, (10000,))
    evaluate(fm, fm.get_flat(), xt[:1000], yt[:1000])
    start = time.perf_counter()
    evaluate(fm, fm.get_flat(), xt, yt)
    out["eval_10k_s"] = time.perf_counter() - start
    print(f"evaluation of 10,000 images: {out['eval_10k_s']:.2f} s")

    # FedSteer server step at the EMNIST model size against the clients' share of a round.
    em = training_throughput("emnist", 47, samples=1000)
    d = em["model"].dim
    n, k, m = 100, 10, 10
    ctx = ServerContext(weights=torch.full((n,), 1 / n), probs=torch.full((n,), 0.1), dim=d, device=torch.device("cpu"), client_lr=0.05)
    steer = make_strategy(method("fedsteer", core_size=k))
    state = steer.init_state(ctx)
    grads = torch.randn(n, d)
    steer.warmup_snapshot(state, ctx, grads, 0, last=True)
    active = torch.tensor(sorted(set(state["core"].tolist()[:3]) | set(range(50, 57))))
    times = []
    for r in range(5):
        updates = grads[active] * (1.0 + 0.1 * r)  # the engine hands the strategy one stacked (m, d) tensor
        start = time.perf_counter()
        delta = steer.aggregate(state, ctx, active, updates)
        steer.update(state, ctx, active, updates, torch.ones(len(active), dtype=torch.long), r)
        times.append(time.perf_counter() - start)
    server_s = sorted(times)[len(times) // 2]
    client_s = m * 100 * TUNED["emnist"].local_epochs / em["samples_per_s"]  # ~10 clients x 100 points x E epochs
    out["emnist"] = {"dim": d, "params": em["params"], "samples_per_s": em["samples_per_s"],
                     "fedsteer_server_step_s": server_s, "round_client_s": client_s,
                     "server_share_of_round": server_s / (server_s + client_s)}
    print(f"EMNIST CNN d={d:,}: FedSteer server step {1000 * server_s:.1f} ms vs clients {client_s:.2f} s per round "
          f"= {100 * out['emnist']['server_share_of_round']:.1f} % of the round (target <= 5 %)")
    assert torch.isfinite(delta).all()

    out["server_state_bytes"] = {}
    for dname, dim in (("fmnist", fm.dim), ("emnist", d)):
        meta = ServerContext(weights=torch.full((n,), 1 / n), probs=torch.full((n,), 0.1), dim=dim,
                             device=torch.device("meta"), client_lr=0.05)
        row = {}
        for name in sorted(METHOD_DEFAULTS):
            kw = {"core_size": 40 if dname == "fmnist" else 10} if name == "fedsteer" else {}
            s = make_strategy(method(name, **kw))
            row[name] = s.memory_bytes(s.init_state(meta))
        out["server_state_bytes"][dname] = row
        print(f"server state bytes, {dname} (d={dim:,}, N=100): " + ", ".join(f"{k}={v / 2**20:.1f} MiB" for k, v in row.items()))

    # One round on the real system: where the time goes, per method.
    out["one_round"] = {}
    base = RunConfig(system=FLSystem(gamma=0.9), training=TUNED["fmnist"].__class__(
        **{**TUNED["fmnist"].__dict__, "rounds": 3, "eval_every": 3, "eval_last": 0}))
    sim = prepare(base)
    for name in sorted(METHOD_DEFAULTS):
        kw = {"warmup_cycles": 1} if name == "fedsteer" else {}
        res = run(base.replace(method=method(name, **kw)), progress=False, sim=sim)
        t = res.summary["timing"]
        per_round = {key: t[key] / 3 for key in ("client", "server", "eval")}
        out["one_round"][name] = per_round
        print(f"{name:16s} per round: clients {per_round['client']:.3f} s, server {1000 * per_round['server']:.1f} ms, "
              f"eval (amortised) {per_round['eval']:.3f} s")
    path = ROOT / "data" / "results" / "bench" / "benchmark.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"written {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
