"""FedSteer and every baseline of the book as Flower strategies (flwr 1.42, Message API).

    from fedsteer_lib.flower import FedSteer
    strategy = FedSteer(fraction_train=0.2, core_size=10)   # where the app had FedAvg(fraction_train=0.2)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=50)

`methods` holds the classes; `driver` the rounds they share (the warm-up, checkpoints, Flower's
loop), `exchange` the nodes (participation, sampling, messages) and `replies` the checks a reply
must pass; `checkpoint` and `persist` the checkpoint file (plain data: loading one cannot run
code), `records` the model layout. `launch` and `credentials` start a local federation (TLS and
SuperNode authentication); `replay` is the harness that checks a Flower run against our
simulator. Importing this package, building a strategy and running it change nothing global in
the process (see `driver` for the kernels).
"""
from .checkpoint import CheckpointError
from .driver import MethodStrategy
from .exchange import CORRECTION_KEY
from .methods import MIFA, STRATEGIES, FedAvg, FedAvgUnbiased, FedProx, FedStale, FedSteer, FedVARP, Scaffold
from .nodes import NodeTable
from .replies import PARTICIPATION_KEY, Limits

__all__ = ["FedSteer", "FedAvg", "FedAvgUnbiased", "FedVARP", "FedStale", "MIFA", "Scaffold", "FedProx",
           "MethodStrategy", "NodeTable", "STRATEGIES", "CORRECTION_KEY", "PARTICIPATION_KEY", "Limits",
           "CheckpointError"]
