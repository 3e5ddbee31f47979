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
with AVX2, Intel or AMD) unless `--kernels native`
or FEDSTEER_KERNELS=native says otherwise. `--precision bf16` trains
and evaluates under bfloat16 autocast: other runs than the fp32 ones (their own keys), fast on
CPUs with AMX and on GPUs, emulated and slower on CPUs without bfloat16 units.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys

from .. import numerics
from .config import BATCH_STREAMS, DATASET_DEFAULTS, PROFILES, FLSystem, Training
from .groups import GROUP_SETS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedsteer_lib", description=__doc__,
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
                           help="pinned: the same bits on x86-64 CPUs with AVX2 "
                                "(default, or $FEDSTEER_KERNELS); "
                                "native: the CPU's fastest kernels, CPU-dependent bits")
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
            p.add_argument("--what", choices=(*GROUP_SETS, "all"), default="all")
        if name == "verify":
            which = p.add_mutually_exclusive_group()
            which.add_argument("--sample", type=int, metavar="N",
                               help="N runs drawn at random (with --stratify: N per group, method and gamma)")
            which.add_argument("--key", action="append", default=[], metavar="K", help="this stored run (repeatable)")
            p.add_argument("--group", action="append", default=[], metavar="G",
                           help="only the runs of this group (repeatable; names as `status` prints them)")
            p.add_argument("--stratify", action="store_true", help="with --sample: N runs per group, method and gamma")
            p.add_argument("--seed", type=int, default=0, help="the seed of the random draw (default 0)")
            p.add_argument("--log", default=None, metavar="FILE", help="append every comparison to this JSON-lines file")
            p.add_argument("--skip-logged", action="store_true",
                           help="with --log: leave out the runs FILE already has a comparison for (resumes a long "
                                "verify)")
            p.add_argument("--replace-unpinned", action="store_true",
                           help="write the recomputed (pinned) result in place of a stored run computed without "
                                "pinned kernels; only those runs of the selection are recomputed")
    _add_run_parser(sub)
    args = parser.parse_args(argv)
    if getattr(args, "kernels", None) is not None or args.command in ("tune", "sweep", "verify", "run"):
        numerics.select_kernels(args.kernels)  # before anything computes in this process
    if getattr(args, "sample", None) is not None and args.sample < 1:
        parser.error(f"--sample must be an integer >= 1, got {args.sample}")
    if getattr(args, "stratify", False) and getattr(args, "sample", None) is None:
        parser.error("--stratify goes with --sample N")
    if getattr(args, "skip_logged", False) and not args.log:
        parser.error("--skip-logged goes with --log FILE")
    if getattr(args, "client_batch", 1) < 1:
        parser.error(f"--client-batch must be an integer >= 1, got {args.client_batch}")
    if getattr(args, "workers", 1) < 1:
        parser.error(f"--workers must be an integer >= 1 (processes running runs side by side), got {args.workers}")
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

    from pathlib import Path

    from ..simulator.data import DatasetNotFoundError, dataset_status, load_dataset
    from .groups import run_groups
    from .results import RESULTS_DIR, layout_problems, results_root
    from .sweep import complete_seeds, missing, run_grid

    if args.command == "run":  # every setting checked before the data is even looked at
        config = _run_config(args, parser)
    if args.command in ("tune", "sweep", "run"):  # fail before any work, with the message that says how to get the data
        split = DATASET_DEFAULTS[args.dataset].get("split", "balanced")
        found = dataset_status(args.dataset, split)
        if found.status == "corrupt":
            print(f"{args.dataset} is corrupt: {found.detail} (python -m fedsteer_lib doctor says how to fix it)",
                  file=sys.stderr)
            return 1
        try:
            load_dataset(args.dataset, split=split)
        except DatasetNotFoundError as err:
            print(err, file=sys.stderr)
            return 1

    if args.command == "run":
        return _run_one(config, Path(args.results) if args.results else results_root("paper"))
    if args.command == "tune":
        root = args.results or RESULTS_DIR
        from .tuning import select, tuning_configs, tuning_table

        configs = [c.replace(client_batch=args.client_batch, **_precision(args))
                   for c in tuning_configs(args.dataset, device=args.device)]
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
    problems = layout_problems([c for configs in groups.values() for c in configs], root)
    for problem in problems.values():
        print(f"cache problem: {problem}", file=sys.stderr)
    if None in problems:  # the cache as a whole cannot be used
        return 1
    if args.command == "verify":
        return _verify(args, groups, root, parser)
    if args.command == "status":
        from .groups import IN_PROGRESS

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
            hint = "  (every run cached: make book renders from the cache, computing nothing)"
        elif seeds:
            hint = f"  (render from them: make book SEEDS={seeds_arg})"
        else:
            hint = ""
        print(f"seeds complete in every group: {seeds_arg or 'none'}{hint}")
        if pending:
            set_of = {name: key for key, build in GROUP_SETS.items()
                      for name in build(args.dataset, args.profile, args.device, root)}
            commands = "; ".join(f"python -m fedsteer_lib sweep --profile {args.profile} --what {w} --workers 2"
                                 for w in dict.fromkeys(set_of[n] for n in pending))
            print(f"in progress: {', '.join(pending)} (compute with: {commands})")
        return 0
    # One queue for every group, ordered seed first: an interrupted sweep leaves every chapter
    # with at least its first seeds rather than one group complete and the others empty.
    queue = list({c.key(): c.replace(client_batch=args.client_batch)
                  for configs in groups.values() for c in configs if c.key() not in problems}.values())
    n = run_grid(queue, root, workers=args.workers, desc="+".join(groups), executor=args.executor,
                 address=args.address, gpus_per_run=args.gpus_per_run)
    print(f"computed {n} runs; {len(queue)} distinct runs in the grid (groups share some runs: "
          f"{', '.join(f'{k} {len(v)}' for k, v in groups.items())})")
    if problems:
        print(f"{len(problems)} runs were skipped: their result paths hold something other than a file "
              f"(named above)", file=sys.stderr)
        return 1
    return 0


def _precision(args) -> dict:
    return {"precision": args.precision} if getattr(args, "precision", None) else {}


# ------------------------------------------------------------------------------------- run
# The `run` command's options come from where the settings are defined: one per method parameter
# of the registry, one per field of FLSystem and Training. Values are read as numbers where they
# look like numbers and checked by the config's own validation, so a bad value gets the same
# one-line message as in a sweep (the field, what it must be, what it got).
_RUN_FIXED = {"dataset", "method", "seed", "device", "kernels", "precision", "client_batch", "results",
              "batch_stream"}


def _method_parameters() -> dict[str, tuple[object, list[str], str]]:
    """{parameter: (its default in its first method, the methods that have it with their defaults,
    what it allows)}."""
    from .registry import METHODS

    out: dict[str, tuple[object, list[str], str]] = {}
    for name, info in METHODS.items():
        for key, param in info.params.items():
            default, owners, allowed = out.get(key, (param.default, [], param.allowed))
            out[key] = (default, owners + [f"{name} (default {param.default})"], allowed)
    return out


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _value(text: str) -> object:
    """A number where the text is one (int, else float), else the text itself."""
    if re.fullmatch(r"[+-]?\d+", text.strip()):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def _like(value: object, default: object) -> object:
    """`value` in the type of the setting's default where that loses nothing (1 for a float
    setting is 1.0, so `--lam 1` and `--lam 1.0` name the same run)."""
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _add_run_parser(sub) -> None:
    from .registry import METHODS

    p = sub.add_parser("run", help="one run at settings of your own (every method parameter of the registry), "
                                   "computed into the results cache like a sweep run; cached runs are not recomputed",
                       description="One run at settings of your own. Defaults: the paper profile's Table 1 setting "
                                   "(the tuned training settings, 150 rounds, gamma 0.9, seed 0, the data set's |X| and "
                                   "lambda for FedSteer), so `run --method fedavg` is Table 1's run (already cached).")
    p.add_argument("--dataset", choices=sorted(DATASET_DEFAULTS), default="fmnist")
    p.add_argument("--method", choices=list(METHODS), required=True)
    group = p.add_argument_group("method parameters (from the registry; each belongs to the methods named)")
    for key, (default, owners, allowed) in _method_parameters().items():
        group.add_argument(_option(key), dest=f"param_{key}", type=_value, default=None, metavar="V",
                           help=f"{allowed}; a parameter of {', '.join(owners)}")
    for cls, title, defaults in ((FLSystem, "the federation", FLSystem()), (Training, "training (defaults: the tuned "
                                 "settings of the data set and the paper profile's rounds and evaluation)", None)):
        group = p.add_argument_group(title)
        for f in dataclasses.fields(cls):
            shown = f" (default {getattr(defaults, f.name)})" if defaults is not None else ""
            group.add_argument(_option(f.name), dest=f"{cls.__name__}_{f.name}", type=_value, default=None, metavar="V",
                               help=f"{f.name}{shown}")
    p.add_argument("--seed", type=_value, default=0)
    p.add_argument("--batch-stream", default="shared", help=f"one of {list(BATCH_STREAMS)} (default shared)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--client-batch", type=int, default=1, metavar="N",
                   help="train up to N clients of a round at once (vectorised; for GPUs; default 1)")
    p.add_argument("--precision", choices=numerics.PRECISIONS, default="fp32",
                   help="fp32 (default) or bf16: bfloat16 autocast for local training and evaluation (another run, "
                        "with its own key); fast with AMX or on a GPU, emulated and slower on CPUs without bf16 units")
    p.add_argument("--kernels", choices=numerics.KERNELS, default=None,
                   help="pinned (default, or $FEDSTEER_KERNELS) or native (`fedsteer_lib.numerics`)")
    p.add_argument("--results", default=None, help="results directory (default data/results)")


def _run_config(args, parser):
    """The `run` command's RunConfig, validated; a bad setting is `parser.error` with the
    config's own message, before anything is loaded or computed."""
    from .config import ConfigError, RunConfig, get_profile, method

    prof = get_profile("paper")
    params_given = {k[len("param_"):]: v for k, v in vars(args).items() if k.startswith("param_") and v is not None}
    known = _method_parameters()
    params = {k: _like(v, known[k][0]) for k, v in params_given.items()}
    if args.method == "fedsteer":  # the data set's |X| and lambda, as in every group of the book
        dd = DATASET_DEFAULTS[args.dataset]
        params = {"core_size": dd["core_size"], "lam": dd["lam"], **params}
    system = {f.name: _like(getattr(args, f"FLSystem_{f.name}"), f.default) for f in dataclasses.fields(FLSystem)
              if getattr(args, f"FLSystem_{f.name}") is not None}
    from .sweep import profile_training

    base = profile_training(args.dataset, prof)
    training = {f.name: _like(getattr(args, f"Training_{f.name}"), getattr(base, f.name))
                for f in dataclasses.fields(Training) if getattr(args, f"Training_{f.name}") is not None}
    try:
        spec = method(args.method, **params)
        config = RunConfig(dataset=args.dataset, method=spec, system=dataclasses.replace(FLSystem(), **system),
                           training=dataclasses.replace(base, **training), seed=args.seed, device=args.device,
                           client_batch=args.client_batch, batch_stream=args.batch_stream, precision=args.precision,
                           emnist_split=DATASET_DEFAULTS[args.dataset].get("split", "balanced")).validate()
    except ConfigError as err:
        parser.error(str(err))
    return config


def _run_one(config, root) -> int:
    """Compute one run into the cache `root` (through `sweep.run_grid`: its lock, the layout
    checks) unless it is there, then print its one-screen summary."""
    from .results import has_run, layout_problems, load_run, run_path
    from .sweep import run_grid

    problems = layout_problems([config], root)
    for problem in problems.values():
        print(f"cache problem: {problem}", file=sys.stderr)
    if problems:
        return 1
    if has_run(config, root):
        outcome = "already in the cache: nothing computed"
    else:
        print(f"computing run {config.key()} ({config.method.label}, {numerics.run_kernels(config.device, config.precision)} "
              f"kernels, {config.precision}) into {run_path(config, root)}", flush=True)
        computed = run_grid([config], root, workers=1, progress=False, run_progress=True, desc=config.method.label)
        outcome = "computed now" if computed else "computed meanwhile by another process: nothing computed here"
    print(run_summary(config, load_run(config, root), outcome, run_path(config, root)))
    return 0


def run_summary(config, payload: dict, outcome: str, path) -> str:
    """The `run` command's one screen: what was run, where its result is, final accuracy,
    collapse, server memory and time per phase."""
    from .registry import display_name

    s, prov = payload["summary"], payload.get("provenance", {})
    params = ", ".join(f"{k}={v}" for k, v in payload["config"]["method"].items() if k != "name")
    sys_, tr = config.system, config.training
    split = f"validation split of {sys_.validation_size}" if sys_.validation_size else "test set"
    collapsed = (f"yes, at round {s['collapse_round']} (accuracy before the collapse "
                 f"{s.get('accuracy_before_collapse'):.4f})" if s["collapsed"] else "no")
    timing = s.get("timing", {})
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(timing.items(), key=lambda kv: -kv[1]) if v > 0)
    mem = s["server_memory_bytes"]
    return "\n".join([
        f"run {config.key()}: {display_name(config.method.name)} ({params or 'no parameters'})",
        f"  {config.dataset}, N = {sys_.num_clients}, gamma = {sys_.gamma}, seed {config.seed}, {tr.rounds} rounds of "
        f"{tr.local_epochs} local epochs (batch {tr.batch_size}, client lr {tr.client_lr}, server lr {tr.server_lr}), "
        f"precision {config.precision}",
        f"  result: {path} ({outcome})",
        f"  final accuracy ({split}): {s['final_accuracy']:.4f}; mean of the last {tr.eval_last} evaluations "
        f"{s['mean_last_accuracy']:.4f}",
        f"  collapsed: {collapsed}",
        f"  server memory: {mem / 2**20:.1f} MiB ({mem:,} bytes)",
        f"  time: {s['wall_time']:.1f} s wall; per phase: {phases or 'not recorded'}",
        f"  computed on: {prov.get('device', '?')}, {prov.get('cpu', 'CPU not recorded')}, "
        f"{prov.get('kernels', 'native (before pinning existed)')} kernels, {prov.get('threads', '?')} thread(s), "
        f"code {prov.get('code_version', '?')}",
    ])


def _verify(args, groups, root, parser) -> int:
    """`verify`: recompute the selected stored runs, print one comparison each and a summary;
    exit status 1 when a run stored with pinned kernels does not come back bit for bit."""
    from .verify import read_log, select, stored_kernels, verify_runs
    from .results import load_run

    unknown = [g for g in args.group if g not in groups]
    if unknown:
        parser.error(f"--group {unknown[0]!r}: not a group of --what {args.what}; one of {', '.join(groups)}")
    chosen = {g: groups[g] for g in args.group} if args.group else groups
    try:
        configs = select(chosen, root, sample=args.sample, seed=args.seed, keys=args.key, stratify=args.stratify)
    except ValueError as err:
        parser.error(str(err))
    if args.skip_logged and os.path.isfile(args.log):
        logged = {r["key"] for r in read_log([args.log])}
        print(f"leaving out {sum(c.key() in logged for c in configs)} runs already in {args.log}")
        configs = [c for c in configs if c.key() not in logged]
    runs = [(c, load_run(c, root)) for c in configs]
    if args.replace_unpinned:
        runs = [(c, payload) for c, payload in runs if stored_kernels(payload) != "pinned"]
    if not runs:
        print("nothing to verify: no stored run matches" + (" that is not already pinned" if args.replace_unpinned else ""))
        return 0
    print(f"recomputing {len(runs)} stored runs with {numerics.kernels()} kernels on {numerics.cpu_model()}", flush=True)
    out = verify_runs(runs, root, workers=args.workers, log=args.log, replace_unpinned=args.replace_unpinned,
                      on_result=lambda line: print(line, flush=True))
    same = sum(c.identical for c in out)
    flipped = sum(c.collapse_flipped for c in out)
    failed = [c for c in out if c.failed]
    changes = sorted(abs(c.new_accuracy - c.stored_accuracy) for c in out if not c.identical)
    largest = f", largest change of final accuracy {changes[-1]:.4f}" if changes else ""
    print(f"{same} of {len(out)} bit-identical; {flipped} collapses flipped{largest}")
    if failed:
        print(f"{len(failed)} runs stored with pinned kernels did not reproduce bit for bit: "
              + ", ".join(c.key for c in failed), file=sys.stderr)
        return 1
    return 0


def device_problem(device: str) -> str | None:
    """Why `device` cannot run the simulations here (None when it can): checked before any
    compute, so that a missing GPU is one sentence, not a traceback after the progress bar."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:
        return f"--device {device!r} is not a torch device ({err}); use cpu, cuda or cuda:N"
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        return f"--device {device!r}: only cpu and cuda devices are supported"
    if not torch.cuda.is_available():
        return f"--device {device!r}: this machine has no CUDA GPU that torch can use (torch {torch.__version__}); use --device cpu"
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        return f"--device {device!r}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}"
    return None


def results_dir_problem(path: str, must_exist: bool = False) -> str | None:
    """Why `path` cannot serve as a results directory (None when it can): it must be a directory
    (or be creatable as one) that this process can write into; `must_exist` for reading it."""
    import tempfile
    from pathlib import Path

    root = Path(path)
    if root.exists() and not root.is_dir():
        return f"--results {path}: is a file, not a directory"
    if must_exist:
        return None if root.is_dir() else f"--results {path}: no such directory"
    existing = next(p for p in (root.absolute(), *root.absolute().parents) if p.exists())
    if not existing.is_dir():
        return f"--results {path}: cannot write results there ({existing} is a file)"
    try:  # the directory the sweep would write into, or the one it would create it in
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        if existing == root.absolute():
            return f"--results {path}: this process cannot write into it ({err.strerror or err})"
        return (f"--results {path}: it does not exist and cannot be created: {existing} does not let this process "
                f"create anything in it ({err.strerror or err})")
    return None


if __name__ == "__main__":
    sys.exit(main())
