"""The `run` command: one run at settings of your own, computed into the results cache.

    python -m fedsteer_lib run --method fedsteer [--core-size 40 --lam 0.5 ...] [--gamma 0.7 --seed 3]

Its options come from where the settings are defined: one per method parameter of the registry,
one per field of FLSystem and Training. Values are read as numbers where they look like numbers
and checked by the config's own validation, so a bad value gets the same one-line message as in
a sweep (the field, what it must be, what it got). What depends on the data set (a validation
split or clients' shares larger than the training pool) and on this machine (a run whose
schedule does not fit in memory) is checked next, still before anything computes.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

from .. import numerics
from .cli_checks import run_size_problem, seed_problem
from .config import BATCH_STREAMS, DATASET_DEFAULTS, FLSystem, Training

__all__ = ["add_run_parser", "run_config", "data_problem", "run_one", "run_summary"]


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


def add_run_parser(sub) -> None:
    """The `run` subcommand's parser, added to `sub` (the command line's subparsers)."""
    from .registry import METHODS

    p = sub.add_parser("run", help="one run at settings of your own (every method parameter of the registry), "
                                   "computed into the results cache like a sweep run; cached runs are not recomputed",
                       description="One run at settings of your own. Defaults: the paper profile's Table 1 setting "
                                   "(the tuned training settings, 150 rounds, gamma 0.9, seed 0, the data set's |X| and "
                                   "lambda for FedSteer), so `run --method fedavg` is Table 1's run (already cached). "
                                   "The last round is always evaluated: the final accuracy is the model the run ends with.")
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
    p.add_argument("--seed", type=_value, default=0, help="an integer in [0, 2**64) (default 0)")
    p.add_argument("--batch-stream", default="shared", help=f"one of {list(BATCH_STREAMS)} (default shared)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--client-batch", type=int, default=1, metavar="N",
                   help="train up to N clients of a round at once (vectorised; for GPUs; default 1)")
    p.add_argument("--precision", choices=numerics.PRECISIONS, default="fp32",
                   help="fp32 (default) or bf16: bfloat16 autocast for local training and evaluation (another run, "
                        "with its own key); fast with AMX or on a GPU, emulated and slower on CPUs without bf16 units")
    p.add_argument("--kernels", choices=numerics.KERNELS, default=None,
                   help="pinned (default, or $FEDSTEER_KERNELS) or native (`fedsteer_lib.numerics`); "
                        "--kernels overrides $FEDSTEER_KERNELS")
    p.add_argument("--results", default=None, help="results directory (default data/results)")


def run_config(args, parser):
    """The `run` command's RunConfig, validated; a bad setting is `parser.error` with the
    config's own message, before anything is loaded or computed: every field's range, a seed
    in [0, 2**64), and a number of rounds whose schedule fits in this machine's memory."""
    from .config import ConfigError, RunConfig, get_profile, method
    from .sweep import profile_training

    prof = get_profile("paper")
    params_given = {k[len("param_"):]: v for k, v in vars(args).items() if k.startswith("param_") and v is not None}
    known = _method_parameters()
    params = {k: _like(v, known[k][0]) for k, v in params_given.items()}
    if args.method == "fedsteer":  # the data set's |X| and lambda, as in every group of the book
        dd = DATASET_DEFAULTS[args.dataset]
        params = {"core_size": dd["core_size"], "lam": dd["lam"], **params}
    system = {f.name: _like(getattr(args, f"FLSystem_{f.name}"), f.default) for f in dataclasses.fields(FLSystem)
              if getattr(args, f"FLSystem_{f.name}") is not None}
    base = profile_training(args.dataset, prof)
    training = {f.name: _like(getattr(args, f"Training_{f.name}"), getattr(base, f.name))
                for f in dataclasses.fields(Training) if getattr(args, f"Training_{f.name}") is not None}
    if problem := seed_problem(args.seed):  # named as the option the user typed, before the config's own check
        parser.error(problem)
    try:
        spec = method(args.method, **params)
        config = RunConfig(dataset=args.dataset, method=spec, system=dataclasses.replace(FLSystem(), **system),
                           training=dataclasses.replace(base, **training), seed=args.seed, device=args.device,
                           client_batch=args.client_batch, batch_stream=args.batch_stream, precision=args.precision,
                           emnist_split=DATASET_DEFAULTS[args.dataset].get("split", "balanced")).validate()
    except ConfigError as err:
        parser.error(str(err))
    if problem := run_size_problem(config.training.rounds, config.system.num_clients):
        parser.error(problem)
    return config


def data_problem(config) -> str | None:
    """Why `config`'s federation cannot be drawn from its data set (None when it can): a
    validation split as large as the training pool, clients whose shares add up to more images
    of a label group than the data set has (`partition.build_federation`, run on the data for
    real: a few milliseconds)."""
    from ..simulator.data import load_dataset
    from ..simulator.partition import build_federation
    from .config import ConfigError

    splits = load_dataset(config.dataset, split=config.emnist_split)
    try:
        build_federation(config.system, splits.train_labels, splits.num_classes, config.seed)
    except ConfigError as err:
        return (f"{err} (num_clients={config.system.num_clients}; {config.dataset} has {len(splits.train_labels):,} "
                f"training images)")
    return None


def run_one(config, root: Path) -> int:
    """Compute one run into the cache `root` (through `sweep.run_grid`: its lock, the layout
    checks, among them that `root` can be written and has room) unless it is there, then print
    its one-screen summary."""
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


def _last_evaluated_round(history: list[dict]) -> int | None:
    rounds = [h["round"] for h in history if h.get("accuracy") is not None and h["accuracy"] == h["accuracy"]]
    return rounds[-1] if rounds else None


def run_summary(config, payload: dict, outcome: str, path) -> str:
    """The `run` command's one screen: what was run, where its result is, final accuracy (and the
    round whose model it scores), collapse, server memory and time per phase."""
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
    last = _last_evaluated_round(payload.get("history", []))
    at_round = f" (the model of round {last})" if last is not None else ""
    mean_of = (f"mean of the last {tr.eval_last} evaluations {s['mean_last_accuracy']:.4f}" if tr.eval_last
               else "no mean over the last rounds (eval_last 0)")
    return "\n".join([
        f"run {config.key()}: {display_name(config.method.name)} ({params or 'no parameters'})",
        f"  {config.dataset}, N = {sys_.num_clients}, gamma = {sys_.gamma}, seed {config.seed}, {tr.rounds} rounds of "
        f"{tr.local_epochs} local epochs (batch {tr.batch_size}, client lr {tr.client_lr}, server lr {tr.server_lr}), "
        f"precision {config.precision}",
        f"  result: {path} ({outcome})",
        f"  final accuracy ({split}): {s['final_accuracy']:.4f}{at_round}; {mean_of}",
        f"  collapsed: {collapsed}",
        f"  server memory: {mem / 2**20:.1f} MiB ({mem:,} bytes)",
        f"  time: {s['wall_time']:.1f} s wall; per phase: {phases or 'not recorded'}",
        f"  computed on: {prov.get('device', '?')}, {prov.get('cpu', 'CPU not recorded')}, "
        f"{prov.get('kernels', 'native (before pinning existed)')} kernels, {prov.get('threads', '?')} thread(s), "
        f"code {prov.get('code_version', '?')}",
    ])
