"""Command line: `python -m fedsteer_lib {doctor,system-packages,data,tune,sweep,status,verify,run}`.

    python -m fedsteer_lib doctor                       # every prerequisite: ok / missing, and the fix
    python -m fedsteer_lib system-packages              # install the Debian packages the project uses (root)
    python -m fedsteer_lib data                         # make sure Fashion-MNIST is on disk
    python -m fedsteer_lib tune --dataset fmnist        # FedAvg-only hyperparameter tuning (validation split)
    python -m fedsteer_lib sweep --profile paper --dataset fmnist [--what main|ablations|all] [--workers 2]
                                 [--device cuda --client-batch 100]
                                 [--executor ray --address auto --gpus-per-run 0.25]
    python -m fedsteer_lib status --profile paper       # how much of a sweep is cached
    python -m fedsteer_lib verify --sample 5            # recompute stored runs, say what changed
    python -m fedsteer_lib run --method fedsteer [--core-size 40 --lam 0.5 ...] [--gamma 0.7 --seed 3]
                               [--precision bf16]       # one run at settings of your own, cached like a sweep's

Runs use pinned kernels (`fedsteer_lib.numerics`: meant to be bit-identical on any x86-64 CPU
with AVX2, Intel or AMD) unless `--kernels native` or FEDSTEER_KERNELS=native says otherwise
(`--kernels` wins; the variable is read only by the commands that compute). `--precision bf16`
trains and evaluates under bfloat16 autocast: other runs than the fp32 ones (their own keys),
fast on CPUs with AMX and on GPUs, emulated and slower on CPUs without bfloat16 units.

A mistake in the input is one line on stderr before anything computes (exit status 2). A result
that cannot be saved is one line (exit status 1). Ctrl-C stops a command with one line saying
what was saved (exit status 130): every finished run is in the cache, the same command goes on.
`verify`'s exit statuses are in `cli_verify`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import numerics
from .cli_checks import device_problem, results_dir_problem, select_kernels
from .cli_run import add_run_parser
from .cli_verify import add_verify_options
from .config import DATASET_DEFAULTS, PROFILES
from .groups import GROUP_SETS

__all__ = ["main", "build_parser", "OneLineParser", "COMPUTING", "INTERRUPTED"]

COMPUTING = ("tune", "sweep", "verify", "run")  # the commands that compute: the only ones that select kernels
INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (`PROG: error: MESSAGE`), not the usage
    block followed by the message: the `run` command's usage alone is some twenty lines."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _group_sets(text: str) -> str:
    """`--what`: "all" or GROUP_SETS keys, comma-separated (computed in GROUP_SETS' order)."""
    wanted = text.split(",")
    unknown = [w for w in wanted if w not in GROUP_SETS] if text != "all" else []
    if unknown:
        raise argparse.ArgumentTypeError(f"{unknown[0]!r} is not one of {', '.join((*GROUP_SETS, 'all'))}")
    return text


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m fedsteer_lib", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="check every prerequisite (one line each: ok / missing, and the command that fixes it)")
    sub.add_parser("system-packages", help="install the Debian packages the project uses (apt-get as root, else says how)")
    sub.add_parser("data", help="make sure Fashion-MNIST is available (apt-get as root, else says how)")
    for name in ("tune", "sweep", "status", "verify"):
        p = sub.add_parser(name)
        p.add_argument("--dataset", choices=sorted(DATASET_DEFAULTS), default="fmnist")
        p.add_argument("--device", default="cpu")
        p.add_argument("--workers", type=int, default=1)
        if name != "status":
            p.add_argument("--kernels", choices=numerics.KERNELS, default=None,
                           help="pinned: the same bits on x86-64 CPUs with AVX2 (default, or $FEDSTEER_KERNELS); "
                                "native: the CPU's fastest kernels, CPU-dependent bits; --kernels overrides the variable")
        if name not in ("status", "verify"):
            p.add_argument("--client-batch", type=int, default=1, metavar="N",
                           help="train up to N clients of a round at once (vectorised; for GPUs, slower on a CPU; default 1)")
        p.add_argument("--results", default=None, help="results directory (default data/results)")
        if name != "verify":
            p.add_argument("--precision", choices=numerics.PRECISIONS, default=None,
                           help="every run of the selection at this precision (default: as the groups define it, "
                                "fp32 but for the precision_parity group); bf16 runs are other runs, with their own keys")
        if name == "sweep":
            p.add_argument("--executor", choices=("local", "ray"), default="local",
                           help="local: a process pool on this machine (default); ray: one Ray task per run")
            p.add_argument("--address", default=None,
                           help="with --executor ray: auto, host:port or ray://host:port (default: a local Ray instance)")
            p.add_argument("--gpus-per-run", type=float, default=0.0, metavar="F",
                           help="with --executor ray: the fraction of a GPU each run reserves (e.g. 0.25)")
        if name != "tune":
            p.add_argument("--profile", choices=sorted(PROFILES), default="paper")
            p.add_argument("--what", type=_group_sets, default="all", metavar="|".join((*GROUP_SETS, "all")),
                           help="the run groups: all, or one or more of the sets, comma-separated")
        if name == "verify":
            add_verify_options(p)
    add_run_parser(sub)
    return parser


def _input_problem(args) -> str | None:
    """The first mistake in the options that needs no data and no results to find, or None."""
    if getattr(args, "sample", None) is not None and args.sample < 1:
        return f"--sample must be an integer >= 1, got {args.sample}"
    if getattr(args, "stratify", False) and getattr(args, "sample", None) is None:
        return "--stratify goes with --sample N"
    if getattr(args, "skip_logged", False) and not args.log:
        return "--skip-logged goes with --log FILE"
    if getattr(args, "client_batch", 1) < 1:
        return f"--client-batch must be an integer >= 1, got {args.client_batch}"
    if getattr(args, "workers", 1) < 1:
        return f"--workers must be an integer >= 1 (processes running runs side by side), got {args.workers}"
    problem = device_problem(args.device) if hasattr(args, "device") else None
    if problem is None and getattr(args, "results", None) is not None:
        problem = results_dir_problem(args.results, must_exist=args.command == "status")
    if problem is None and getattr(args, "executor", "local") == "ray":
        from .ray_executor import address_problem

        problem = address_problem(args.address)
    elif problem is None and (getattr(args, "address", None) or getattr(args, "gpus_per_run", 0)):
        problem = "--address and --gpus-per-run go with --executor ray"
    if problem is None and not 0 <= getattr(args, "gpus_per_run", 0) <= 1:
        problem = f"--gpus-per-run must be a fraction in [0, 1], got {args.gpus_per_run}"
    return problem


class _Saved:
    """What a command has put in the cache, for the line Ctrl-C prints: the runs it set out to
    compute (`expect`) and how many of them are stored now."""

    def __init__(self):
        self.configs: list = []
        self.root: Path | None = None
        self.missing_before = 0
        self.note: str | None = None  # what to say instead, for a command that saves no run

    def expect(self, configs, root) -> None:
        from .sweep import missing

        self.configs, self.root = list(configs), Path(root)
        self.missing_before = len(missing(self.configs, self.root))

    def interrupted(self) -> str:
        if self.note:
            return f"interrupted (Ctrl-C): {self.note}"
        if not self.configs:
            return "interrupted (Ctrl-C): nothing was being computed, nothing is lost"
        from .sweep import missing

        saved = self.missing_before - len(missing(self.configs, self.root))
        return (f"interrupted (Ctrl-C): {saved} of the {self.missing_before} runs to compute were finished and are "
                f"saved in {self.root}; the run(s) in progress were not saved, nothing else is lost; the same command "
                f"computes only what is still missing")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    saved = _Saved()
    try:
        return _command(args, parser, saved)
    except KeyboardInterrupt:
        print(("\n" if sys.stderr.isatty() else "") + saved.interrupted(), file=sys.stderr)
        return INTERRUPTED
    except OSError as err:
        from .results import ResultNotSavedError

        if not isinstance(err, ResultNotSavedError):
            raise
        print(f"error: {err}; the runs saved before it are in the cache, the same command computes the rest",
              file=sys.stderr)
        return 1


def _command(args, parser, saved: _Saved) -> int:
    if args.command in COMPUTING:  # the kernel mode, before anything computes in this process
        problem = select_kernels(getattr(args, "kernels", None))
        if problem:
            parser.error(problem)
    problem = _input_problem(args)
    if problem:
        parser.error(problem)
    if getattr(args, "client_batch", 1) > 1 and args.device.split(":")[0] == "cpu":
        print("note: --client-batch > 1 vectorises clients for a GPU; on a CPU it was measured slower than training "
              "them one by one (data/results/bench/cpu_batching.json); the results agree up to floating-point rounding",
              file=sys.stderr)

    if args.command in ("doctor", "system-packages"):  # normally dispatched by fedsteer_lib.__main__
        from . import doctor

        return doctor.report() if args.command == "doctor" else (1 if doctor.install_system_packages() else 0)

    if args.command == "data":
        from ..simulator.data import DatasetCorruptError, DatasetNotFoundError, ensure_fashion_mnist

        try:
            print(ensure_fashion_mnist())
        except (DatasetNotFoundError, DatasetCorruptError) as err:
            print(err, file=sys.stderr)
            return 1
        return 0

    from .groups import run_groups
    from .results import RESULTS_DIR, layout_problems, results_root
    from .sweep import run_grid

    if args.command == "run":  # every setting checked before the data is even looked at
        from .cli_run import run_config

        config = run_config(args, parser)
    if args.command in ("tune", "sweep", "run"):  # fail before any work, with the message that says how to get the data
        problem = _dataset_problem(args.dataset)
        if problem:
            print(problem, file=sys.stderr)
            return 1

    if args.command == "run":
        from .cli_run import data_problem, run_one

        problem = data_problem(config)
        if problem:
            parser.error(problem)
        root = Path(args.results) if args.results else results_root("paper")
        saved.expect([config], root)
        return run_one(config, root)
    if args.command == "tune":
        root = args.results or RESULTS_DIR
        from .tuning import select, tuning_configs, tuning_table

        configs = [c.replace(client_batch=args.client_batch, **_precision(args))
                   for c in tuning_configs(args.dataset, device=args.device)]
        saved.expect(configs, root)
        run_grid(configs, root, workers=args.workers, desc="tuning (FedAvg, validation split)")
        table = tuning_table(configs, root)
        print(table.to_string(index=False))
        print(json.dumps(select(table)))
        return 0

    root = Path(args.results) if args.results else results_root(args.profile)
    groups = run_groups(args.dataset, args.profile, args.device, args.what, root=root)
    if getattr(args, "precision", None):
        groups = {name: [c.replace(precision=args.precision) for c in configs] for name, configs in groups.items()}
    # Layout problems first, one line each, before anything is read or computed.
    problems = layout_problems([c for configs in groups.values() for c in configs], root,
                               writing=args.command != "status")
    for problem in problems.values():
        print(f"cache problem: {problem}", file=sys.stderr)
    if None in problems:  # the cache as a whole cannot be used
        return 1
    if args.command == "verify":
        from .cli_verify import verify_command

        saved.note = ("the comparisons printed above are finished" + (f" and in {args.log}" if args.log else "")
                      + "; verify changes no stored run" + (" but those it replaced, each saved whole"
                                                            if args.replace_unpinned else "") + ", nothing is lost")
        return verify_command(args, groups, root, parser)
    if args.command == "status":
        return _status(args, groups, root)
    # One queue for every group, ordered seed first: an interrupted sweep leaves every chapter
    # with at least its first seeds rather than one group complete and the others empty.
    queue = list({c.key(): c.replace(client_batch=args.client_batch)
                  for configs in groups.values() for c in configs if c.key() not in problems}.values())
    saved.expect(queue, root)
    n = run_grid(queue, root, workers=args.workers, desc="+".join(groups), executor=args.executor,
                 address=args.address, gpus_per_run=args.gpus_per_run)
    print(f"computed {n} runs; {len(queue)} distinct runs in the grid (groups share some runs: "
          f"{', '.join(f'{k} {len(v)}' for k, v in groups.items())})")
    if problems:
        print(f"{len(problems)} runs were skipped: their result paths hold something other than a file "
              f"(named above)", file=sys.stderr)
        return 1
    return 0


def _dataset_problem(dataset: str) -> str | None:
    """Why `dataset` cannot be read here (corrupt or missing, with how to get it), or None."""
    from ..simulator.data import DatasetNotFoundError, dataset_status, load_dataset

    split = DATASET_DEFAULTS[dataset].get("split", "balanced")
    found = dataset_status(dataset, split)
    if found.status == "corrupt":
        return f"{dataset} is corrupt: {found.detail} (python -m fedsteer_lib doctor says how to fix it)"
    try:
        load_dataset(dataset, split=split)
    except DatasetNotFoundError as err:
        return str(err)
    return None


def _precision(args) -> dict:
    return {"precision": args.precision} if getattr(args, "precision", None) else {}


def _status(args, groups, root) -> int:
    """`status`: per group, how many of its runs are cached; the seeds complete everywhere."""
    from .groups import IN_PROGRESS
    from .sweep import complete_seeds, missing

    lacking, pending = 0, []
    for name, configs in groups.items():
        n_missing = len(missing(configs, root))
        note = ""
        if not configs:
            note = "  (its grid is fixed by runs still missing: see the other groups)"
        elif name in IN_PROGRESS:
            note = "  (in progress: the book shows the cached runs)"
            pending += [name] if n_missing else []
        else:
            lacking += n_missing
        print(f"{name:22s} {len(configs) - n_missing:4d} / {len(configs):4d} runs cached{note}")
    needed = [c for name, configs in groups.items() if name not in IN_PROGRESS for c in configs]
    seeds = complete_seeds(needed, root)
    seeds_arg = ",".join(map(str, seeds))
    if not lacking:
        hint = ("  (every run the book needs is cached: make book renders from the cache, computing nothing"
                + (", and shows the cached runs of the groups in progress)" if pending else ")"))
    elif seeds:
        hint = f"  (render from them: make book SEEDS={seeds_arg})"
    else:
        hint = ""
    print(f"seeds complete in every group{' not in progress' if pending else ''}: {seeds_arg or 'none'}{hint}")
    if pending:
        set_of = {name: key for key, build in GROUP_SETS.items()
                  for name in build(args.dataset, args.profile, args.device, root)}
        commands = "; ".join(f"python -m fedsteer_lib sweep --profile {args.profile} --what {w} --workers 2"
                             for w in dict.fromkeys(set_of[n] for n in pending))
        print(f"in progress: {', '.join(pending)} (compute with: {commands})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
