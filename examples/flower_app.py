"""FedSteer in a Flower app: a ServerApp running `FlowerStrategy`, a ClientApp training on the
simulated Fashion-MNIST federation, run in Flower's simulation. book/flower.md shows this file
and tests/test_flower.py runs it (at a small size), so the page cannot go stale.

    python examples/flower_app.py            # the paper's FedSteer on 100 clients, 20 rounds
"""
from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedsteer_lib.experiments.config import RunConfig, Training, method
from fedsteer_lib.flower import FlowerStrategy, client_app


def server_app(configs: list[RunConfig]) -> tuple[ServerApp, list[FlowerStrategy]]:
    """A ServerApp that runs one FlowerStrategy per config, one after the other, on the same
    clients; the strategies are returned so that their models can be read after the run."""
    strategies = [FlowerStrategy(config) for config in configs]
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        for strategy in strategies:
            strategy.run(grid)

    return app, strategies


def simulate(configs: list[RunConfig], cpus: int = 2) -> list[FlowerStrategy]:
    """Run the configs (same data, system and seed) in Flower's simulation, one node per client."""
    app, strategies = server_app(configs)
    run_simulation(server_app=app, client_app=client_app(configs[0]),
                   num_supernodes=configs[0].system.num_clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": cpus, "include_dashboard": False}})
    return strategies


if __name__ == "__main__":
    config = RunConfig(method=method("fedsteer", core_size=40, lam=0.5),
                       training=Training(rounds=20, local_epochs=2, batch_size=32, client_lr=0.1),
                       batch_stream="per_client")
    (strategy,) = simulate([config])
    print("final model norm:", float(strategy.weights.norm()))
