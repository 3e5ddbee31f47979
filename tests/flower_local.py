"""What the Flower tests share: a quickstart-style ClientApp (a small MLP that is none of ours, on
each node's own synthetic data) and an in-process Grid (Flower's Grid interface over a ClientApp
called in this process, for runs without Ray). Imports nothing of fedsteer_lib, except when run
as a script: then it prints, as JSON, the environment, torch's thread count and backend flags
before and after importing fedsteer_lib.flower and running a strategy (tests/test_flower_trust.py)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from flwr.app import ArrayRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from torch import nn

FLAKY, FLAKY_ROUNDS = 1, (2, 4)  # partition 1 raises in these server rounds (the simulation's client)


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def tiny_data(partition: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + partition)
    x = torch.randn(40 + 10 * partition, 8, generator=gen) + 0.5 * partition  # each node its own mix
    return x, (x[:, :3] + 0.3 * torch.randn(x.shape[0], 3, generator=gen)).argmax(1)


def tiny_initial() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(TinyNet().state_dict())


def train_tiny(msg: Message, context: Context) -> Message:
    """Flower's quickstart client: load the arrays, train, reply arrays + metrics with num-examples.
    It uses FedProx's proximal-mu and SCAFFOLD's correction when sent, and reports num-steps and lr."""
    partition, rnd = int(context.node_config["partition-id"]), int(msg.content["config"]["server-round"])
    net = TinyNet()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    anchor = [p.detach().clone() for p in net.parameters()]
    mu = float(msg.content["config"].get("proximal-mu", 0.0))
    correction = msg.content.array_records.get("scaffold-correction")
    correction = list(correction.to_torch_state_dict().values()) if correction is not None else None
    x, y = tiny_data(partition)
    lr, steps = 0.1, 0
    for idx in torch.randperm(len(y), generator=torch.Generator().manual_seed(1000 * rnd + partition)).split(16):
        loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
        net.zero_grad()
        loss.backward()
        with torch.no_grad():
            for j, p in enumerate(net.parameters()):
                grad = p.grad + mu * (p - anchor[j]) + (correction[j] if correction is not None else 0)
                p -= lr * grad
        steps += 1
    metrics = MetricRecord({"train-loss": float(loss.detach()), "num-examples": len(y), "num-steps": steps, "lr": lr})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)


def quickstart_train(msg: Message, context: Context) -> Message:
    """`train_tiny`, except that partition FLAKY raises in FLAKY_ROUNDS."""
    partition, rnd = int(context.node_config["partition-id"]), int(msg.content["config"]["server-round"])
    if partition == FLAKY and rnd in FLAKY_ROUNDS:
        raise RuntimeError(f"node {partition} fails in round {rnd}")
    return train_tiny(msg, context)


def client_app(train: Callable[[Message, Context], Message]) -> ClientApp:
    app = ClientApp()
    app.train()(train)
    return app


quickstart = client_app(quickstart_train)


class LocalGrid(Grid):
    """Flower's Grid interface over a ClientApp called in this process, for runs without Ray:
    node i has node config partition-id i and node id `first_id` + 17 i. `down` holds nodes that
    are not connected; a node that raises answers with an error reply, as in Flower.
    `block_round`: a server round whose messages never return (the ServerApp hangs there, to be
    killed)."""

    def __init__(self, app: ClientApp, num_nodes: int, block_round: int = 0, marker: Path | None = None,
                 first_id: int = 1000) -> None:
        from flwr.common.constant import SUPERLINK_NODE_ID
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID
        self.app, self.block_round, self.marker = app, block_round, marker
        self.ids = [first_id + 17 * i for i in range(num_nodes)]
        self.contexts = {n: Context(run_id=1, node_id=n, node_config={"partition-id": i, "num-partitions": num_nodes},
                                    state=RecordDict(), run_config={}) for i, n in enumerate(self.ids)}
        self.down: set[int] = set()

    def set_run(self, run) -> None:
        pass

    @property
    def run(self):
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return [n for n in self.ids if n not in self.down]

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        replies = []
        for msg in messages:
            if self.block_round and int(msg.content["config"]["server-round"]) == self.block_round:
                self.marker.write_text("blocked")
                time.sleep(3600)
            node = msg.metadata.dst_node_id
            if node in self.down:
                continue  # gone: no reply
            try:
                replies.append(self.app(msg, self.contexts[node]))
            except Exception as err:  # noqa: BLE001 - Flower turns a ClientApp's exception into an error reply
                replies.append(Message(Error(code=0, reason=repr(err)), reply_to=msg))
        return replies


def _snapshot() -> dict:
    return {"env": dict(os.environ), "threads": torch.get_num_threads(), "mkldnn": torch.backends.mkldnn.enabled,
            "nnpack": torch._C._get_nnpack_enabled()}


if __name__ == "__main__":  # argument "pinned": select the pinned kernels first, as book/flower.md says
    if sys.argv[1:] == ["pinned"]:
        from fedsteer_lib import numerics

        numerics.select_kernels("pinned")
    import flwr.serverapp.strategy  # noqa: F401 - importing flwr sets GRPC_VERBOSITY: not ours to test

    before = _snapshot()
    import fedsteer_lib.flower as fl

    imported = _snapshot()
    strategy, in_step = fl.FedSteer(core_size=2, warmup_rounds=1, fraction_evaluate=0.0), []
    aggregate = strategy.core.aggregate

    def recorded(*args):  # the thread count and oneDNN flag the server step computes with
        in_step.append([torch.get_num_threads(), torch.backends.mkldnn.enabled])
        return aggregate(*args)

    strategy.core.aggregate = recorded
    strategy.start(LocalGrid(quickstart, 3), tiny_initial(), num_rounds=3)
    print(json.dumps({"before": before, "imported": imported, "ran": _snapshot(), "rounds": strategy.round,
                      "in_step": in_step, "capability": torch.backends.cpu.get_cpu_capability()}))
