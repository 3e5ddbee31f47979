"""The ServerApp: FedSteer (or any strategy of fedsteer_lib.flower, by `method`) where a
Flower quickstart has `FedAvg`.

The run config (pyproject.toml's [tool.flwr.app.config], or `flwr run ... --run-config`) names
the method and its arguments; the strategy's state is checkpointed to `checkpoint-path` and,
with `resume = true`, a restarted ServerApp continues from it (a checkpoint is plain data:
loading one cannot run code). The server computes with torch's own kernels; for the book's
pinned kernels, put `from fedsteer_lib import numerics; numerics.select_kernels("pinned")` first
in this module (book/flower.md).
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

import fedsteer_lib.flower as fl

from fedsteer_app.task import Net, evaluate, normalise, raw_fashion_mnist

app = ServerApp()

COMMON = ("fraction_train", "min_train_nodes", "min_available_nodes", "participation", "server_lr", "seed",
          "max_examples", "min_participation", "max_update_ratio")


def build_strategy(run: dict) -> fl.MethodStrategy:
    """The strategy class of `run["method"]` with the arguments the run config gives
    (hyphens for underscores: `core-size` is `core_size`)."""
    cls = fl.STRATEGIES[str(run["method"])]
    own = [p for p in inspect.signature(cls).parameters if p not in ("kwargs", "args")]
    kwargs = {name: run[name.replace("_", "-")] for name in (*COMMON, *own) if name.replace("_", "-") in run}
    return cls(fraction_evaluate=0.0, **kwargs)


@app.main()
def main(grid: Grid, context: Context) -> None:
    run = context.run_config
    strategy = build_strategy(run)
    torch.manual_seed(int(run["seed"]))
    initial = ArrayRecord(Net().state_dict())
    checkpoint = str(run["checkpoint-path"]) or None
    resume = checkpoint if run["resume"] and checkpoint and Path(checkpoint).exists() else None
    evaluate_fn = central_evaluation(str(run["data-dir"])) if run["central-eval"] else None
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=int(run["num-server-rounds"]),
                            timeout=float(run["round-timeout"]), evaluate_fn=evaluate_fn, checkpoint_path=checkpoint,
                            checkpoint_every=int(run["checkpoint-every"]), resume_from=resume)
    if run["out-dir"]:
        out = Path(str(run["out-dir"]))
        out.mkdir(parents=True, exist_ok=True)
        torch.save(result.arrays.to_torch_state_dict(), out / "final_model.pt")
        summary = {"rounds": strategy.round, "resumed_from": resume, "warmup": strategy.warmup_report,
                   "round_log": strategy.round_log, "nodes": vars(strategy.nodes),
                   "central_eval": {r: dict(m) for r, m in result.evaluate_metrics_serverapp.items()}}
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))


def central_evaluation(data_dir: str):
    """Accuracy of the global model on Fashion-MNIST's test set, after every training round."""
    images, labels = raw_fashion_mnist("t10k", data_dir)
    images, labels = normalise(torch.from_numpy(images.copy()).unsqueeze(1)), torch.from_numpy(labels.astype("int64"))

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = Net()
        net.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(net, images, labels)
        return MetricRecord({"loss": loss, "accuracy": accuracy})

    return evaluate_fn
