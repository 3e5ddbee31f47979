"""The ClientApp: an ordinary Flower PyTorch client (it works under Flower's FedAvg as is).

It trains the model it is sent on its own partition and replies with the trained `arrays` and
`metrics` holding `num-examples`. Three optional extras, all standard records: it reports its
`num-steps` and `lr` (which SCAFFOLD needs) and, when its node config sets `participation-prob`
(e.g. `flower-supernode --node-config "partition-id=0 num-partitions=4 participation-prob=0.2"`),
that probability, which the strategy then samples it with; and it uses FedProx's `proximal-mu`
and SCAFFOLD's `scaffold-correction` when the server sends them.
"""
from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsteer_app.task import Net, default_partitions_dir, evaluate, load_partition, train

app = ClientApp()


def _data(context: Context) -> tuple[torch.Tensor, torch.Tensor]:
    node, run = context.node_config, context.run_config
    folder = run["partitions-dir"] or default_partitions_dir(int(run["seed"]), int(run["samples-per-node"]))
    return load_partition(int(node.get("partition-id", 0)), int(node.get("num-partitions", 1)), folder,
                          samples_per_node=int(run["samples-per-node"]), seed=int(run["seed"]),
                          data_dir=str(run["data-dir"]), data_path=str(node.get("data-path", "")))


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    images, labels = _data(context)
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    config, run = msg.content["config"], context.run_config
    correction = msg.content.array_records.get("scaffold-correction")
    generator = torch.Generator().manual_seed(
        int(run["seed"]) * 1_000_003 + int(config["server-round"]) * 1009 + int(context.node_config.get("partition-id", 0)))
    steps, loss = train(net, images, labels, epochs=int(run["local-epochs"]), batch_size=int(run["batch-size"]),
                        lr=float(run["lr"]), generator=generator, proximal_mu=float(config.get("proximal-mu", 0.0)),
                        correction=None if correction is None else list(correction.to_torch_state_dict().values()))
    metrics = {"train-loss": loss, "num-examples": len(labels), "num-steps": steps, "lr": float(run["lr"])}
    if "participation-prob" in context.node_config:
        metrics["participation-prob"] = float(context.node_config["participation-prob"])
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": MetricRecord(metrics)}), reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    images, labels = _data(context)
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loss, accuracy = evaluate(net, images, labels)
    metrics = MetricRecord({"eval-loss": loss, "eval-acc": accuracy, "num-examples": len(labels)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
