"""The `verify` command: recompute stored runs and say, run by run, what came back.

    python -m fedsteer_lib verify [--sample N [--stratify] | --group G | --key K] [--log FILE [--skip-logged]]

Its exit status (`experiments.verify` says more): 0 when every recomputed run came back bit for
bit; 1 when a run stored with pinned kernels did not ("NOT REPRODUCED"); 2 when only runs whose
bits depend on the CPU did not (stored with native kernels, bf16, on a GPU or under an early pin,
or recomputed here with native kernels: "DIFFERS (...)"). Every input is checked first, one
line each, before any run is recomputed: a key that is not 16 hex digits (nothing outside
--results is read), a stored file that is not the run its name says or not JSON, a log that is
not a verify log, a log whose folder does not exist.
"""
from __future__ import annotations

import os
import sys

from .. import numerics
from .cli_checks import log_problem

__all__ = ["add_verify_options", "verify_command", "NOT_REPRODUCED", "DIFFERS"]

NOT_REPRODUCED, DIFFERS = 1, 2  # exit statuses (module docstring)


def add_verify_options(p) -> None:
    """`verify`'s own options, added to its parser `p`."""
    which = p.add_mutually_exclusive_group()
    which.add_argument("--sample", type=int, metavar="N",
                       help="N runs drawn at random (with --stratify: N per group, method and gamma)")
    which.add_argument("--key", action="append", default=[], metavar="K",
                       help="this stored run (16 hex digits, its file name in --results/runs; repeatable)")
    p.add_argument("--group", action="append", default=[], metavar="G",
                   help="only the runs of this group (repeatable; names as `status` prints them)")
    p.add_argument("--stratify", action="store_true", help="with --sample: N runs per group, method and gamma")
    p.add_argument("--seed", type=int, default=0, help="the seed of the random draw (default 0)")
    p.add_argument("--log", default=None, metavar="FILE", help="append every comparison to this JSON-lines file")
    p.add_argument("--skip-logged", action="store_true",
                   help="with --log: leave out the runs FILE already has a comparison for (resumes a long verify)")
    p.add_argument("--replace-unpinned", action="store_true",
                   help="write the recomputed (pinned) result in place of a stored run computed without "
                        "pinned kernels; only those runs of the selection are recomputed")


def verify_command(args, groups, root, parser) -> int:
    """`verify`: recompute the selected stored runs, print one comparison each and a summary;
    the exit status of the module docstring."""
    from .results import load_run
    from .verify import read_log, select, stored_kernels, verify_runs

    unknown = [g for g in args.group if g not in groups]
    if unknown:
        parser.error(f"--group {unknown[0]!r}: not a group of --what {args.what}; one of {', '.join(groups)}")
    if args.log:
        problem = log_problem(args.log)
        if problem:
            parser.error(problem)
    chosen = {g: groups[g] for g in args.group} if args.group else groups
    try:
        configs = select(chosen, root, sample=args.sample, seed=args.seed, keys=args.key, stratify=args.stratify)
        logged = {r["key"] for r in read_log([args.log])} if args.skip_logged and os.path.isfile(args.log) else None
        runs = [(c, load_run(c, root)) for c in configs]
    except (ValueError, FileNotFoundError) as err:  # one line naming the file (`select`, `read_log`, `load_run`)
        parser.error(str(err))
    if logged is not None:
        print(f"leaving out {sum(c.key() in logged for c, _ in runs)} runs already in {args.log}")
        runs = [(c, payload) for c, payload in runs if c.key() not in logged]
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
    differing = [c for c in out if not c.identical and not c.failed]
    changes = sorted(abs(c.new_accuracy - c.stored_accuracy) for c in out if not c.identical)
    largest = f", largest change of final accuracy {changes[-1]:.4f}" if changes else ""
    print(f"{same} of {len(out)} bit-identical; {flipped} collapses flipped{largest}")
    if failed:
        print(f"{len(failed)} runs stored with pinned kernels did not reproduce bit for bit: "
              + ", ".join(c.key for c in failed), file=sys.stderr)
        return NOT_REPRODUCED
    if differing and args.replace_unpinned:
        print(f"{len(differing)} runs that were not stored pinned came back with other bits and were replaced by "
              f"the pinned result")
        return 0
    if differing:
        print(f"{len(differing)} runs did not come back bit for bit, each with bits that depend on the CPU (stored "
              f"with native, bf16 or GPU kernels or an early pin, or recomputed here with native kernels): "
              f"reported as DIFFERS, exit status {DIFFERS}", file=sys.stderr)
        return DIFFERS
    return 0
