"""Command line: `python -m fedsteer_lib {doctor,system-packages,data,tune,sweep,status}`.

    python -m fedsteer_lib doctor                       # every prerequisite: ok / missing, and the fix
    python -m fedsteer_lib system-packages              # install the Debian packages the project uses (root)
    python -m fedsteer_lib data                         # make sure Fashion-MNIST is on disk
    python -m fedsteer_lib tune --dataset fmnist        # FedAvg-only hyperparameter tuning (validation split)
    python -m fedsteer_lib sweep --profile paper --dataset fmnist [--what main|ablations|all] [--workers 2]
                                 [--device cuda --client-batch 100]
    python -m fedsteer_lib status --profile paper       # how much of a sweep is cached
"""
from __future__ import annotations

import argparse
import json
import sys

from .config import DATASET_DEFAULTS, PROFILES
from .groups import GROUP_SETS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedsteer_lib", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="check every prerequisite (one line each: ok / missing, and the command that fixes it)")
    sub.add_parser("system-packages", help="install the Debian packages the project uses (apt-get as root, else says how)")
    sub.add_parser("data", help="make sure Fashion-MNIST is available (apt-get as root, else says how)")
    for name in ("tune", "sweep", "status"):
        p = sub.add_parser(name)
        p.add_argument("--dataset", choices=sorted(DATASET_DEFAULTS), default="fmnist")
        p.add_argument("--device", default="cpu")
        p.add_argument("--workers", type=int, default=1)
        if name != "status":
            p.add_argument("--client-batch", type=int, default=1, metavar="N",
                           help="train up to N clients of a round at once (vectorised; for GPUs, slower on a CPU; default 1)")
        p.add_argument("--results", default=None, help="results directory (default data/results)")
        if name != "tune":
            p.add_argument("--profile", choices=sorted(PROFILES), default="paper")
            p.add_argument("--what", choices=(*GROUP_SETS, "all"), default="all")
    args = parser.parse_args(argv)
    if getattr(args, "client_batch", 1) < 1:
        parser.error(f"--client-batch must be an integer >= 1, got {args.client_batch}")
    if getattr(args, "client_batch", 1) > 1 and args.device.split(":")[0] == "cpu":
        print("note: --client-batch > 1 vectorises clients for a GPU; on a CPU it was measured slower than training "
              "them one by one (data/results/bench/cpu_batching.json); the results agree up to floating-point rounding",
              file=sys.stderr)

    if args.command in ("doctor", "system-packages"):  # normally dispatched by fedsteer_lib.__main__
        from . import doctor

        return doctor.report() if args.command == "doctor" else (1 if doctor.install_system_packages() else 0)

    if args.command == "data":
        from ..simulator.data import DatasetNotFoundError, ensure_fashion_mnist

        try:
            print(ensure_fashion_mnist())
        except DatasetNotFoundError as err:
            print(err, file=sys.stderr)
            return 1
        return 0

    from ..simulator.data import DatasetNotFoundError, load_dataset
    from .groups import run_groups
    from .results import RESULTS_DIR, results_root
    from .sweep import complete_seeds, missing, run_grid

    if args.command in ("tune", "sweep"):  # fail before any work, with the message that says how to get the data
        try:
            load_dataset(args.dataset, split=DATASET_DEFAULTS[args.dataset].get("split", "balanced"))
        except DatasetNotFoundError as err:
            print(err, file=sys.stderr)
            return 1

    if args.command == "tune":
        root = args.results or RESULTS_DIR
        from .tuning import select, tuning_configs, tuning_table

        configs = [c.replace(client_batch=args.client_batch) for c in tuning_configs(args.dataset, device=args.device)]
        run_grid(configs, root, workers=args.workers, desc="tuning (FedAvg, validation split)")
        table = tuning_table(configs, root)
        print(table.to_string(index=False))
        print(json.dumps(select(table)))
        return 0

    root = args.results or results_root(args.profile)
    groups = run_groups(args.dataset, args.profile, args.device, args.what)
    if args.command == "status":
        from .groups import IN_PROGRESS

        lacking, pending = 0, []
        for name, configs in groups.items():
            n_missing = len(missing(configs, root))
            note = ""
            if name in IN_PROGRESS:
                note = "  (in progress: the book shows the cached runs)"
                pending += [name] if n_missing else []
            else:
                lacking += n_missing
            print(f"{name:22s} {len(configs) - n_missing:4d} / {len(configs):4d} runs cached{note}")
        needed = [c for name, configs in groups.items() if name not in IN_PROGRESS for c in configs]
        seeds = complete_seeds(needed, root)
        seeds_arg = ",".join(map(str, seeds))
        if not lacking:
            hint = "  (every run cached: make book renders from the cache, computing nothing)"
        elif seeds:
            hint = f"  (render from them: make book SEEDS={seeds_arg})"
        else:
            hint = ""
        print(f"seeds complete in every group: {seeds_arg or 'none'}{hint}")
        if pending:
            set_of = {name: key for key, build in GROUP_SETS.items()
                      for name in build(args.dataset, args.profile, args.device)}
            commands = "; ".join(f"python -m fedsteer_lib sweep --profile {args.profile} --what {w} --workers 2"
                                 for w in dict.fromkeys(set_of[n] for n in pending))
            print(f"in progress: {', '.join(pending)} (compute with: {commands})")
        return 0
    # One queue for every group, ordered seed first: an interrupted sweep leaves every chapter
    # with at least its first seeds rather than one group complete and the others empty.
    queue = list({c.key(): c.replace(client_batch=args.client_batch)
                  for configs in groups.values() for c in configs}.values())
    n = run_grid(queue, root, workers=args.workers, desc="+".join(groups))
    print(f"computed {n} runs; {len(queue)} distinct runs in the grid (groups share some runs: "
          f"{', '.join(f'{k} {len(v)}' for k, v in groups.items())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
