"""The Flower app is the folder examples/flower_app/ (its pyproject.toml, ServerApp and ClientApp);
run it with `flwr run` as book/flower.md shows. This script is a shortcut: it starts a simulation
SuperLink on 127.0.0.1, runs the app on it with `flwr run` and stops the SuperLink.

    python examples/flower_app.py [--nodes 10] [--run-config 'num-server-rounds=20 core-size=5']
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from fedsteer_lib.flower.launch import LocalFederation


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10, help="simulated nodes")
    parser.add_argument("--run-config", default="", help="run config overrides, e.g. 'method=\"fedavg\"'")
    args = parser.parse_args()
    overrides = dict(pair.split("=", 1) for pair in args.run_config.split())
    with tempfile.TemporaryDirectory() as tmp, LocalFederation(tmp, args.nodes, simulation=True) as fed:
        code = fed.run(Path(__file__).parent / "flower_app", {k: _value(v) for k, v in overrides.items()}, timeout=None)
        print(fed.log())
    return code


def _value(text: str) -> object:
    import tomllib

    return tomllib.loads(f"v = {text}")["v"]


if __name__ == "__main__":
    sys.exit(main())
