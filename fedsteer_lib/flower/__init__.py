"""FedSteer and every baseline of the book as Flower strategies (flwr 1.42, Message API).

    from fedsteer_lib.flower import FedSteer
    strategy = FedSteer(fraction_train=0.2, core_size=10)   # where the app had FedAvg(fraction_train=0.2)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=50)

`strategies` holds the classes (see its docstring for participation, drop-outs, the warm-up and
checkpoints), `records` the model layout and the checkpoint file; `replay` is the harness that
checks a Flower run against our simulator (not needed to use the strategies).
"""
from .strategies import (CORRECTION_KEY, MIFA, PARTICIPATION_KEY, STRATEGIES, FedAvg, FedAvgUnbiased, FedProx,
                         FedStale, FedSteer, FedVARP, MethodStrategy, NodeTable, Scaffold)

__all__ = ["FedSteer", "FedAvg", "FedAvgUnbiased", "FedVARP", "FedStale", "MIFA", "Scaffold", "FedProx",
           "MethodStrategy", "NodeTable", "STRATEGIES", "CORRECTION_KEY", "PARTICIPATION_KEY"]
