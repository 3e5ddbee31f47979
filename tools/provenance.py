"""Where the committed results come from, and what a rerun elsewhere changes: per run group, how
many runs, their wall time, and the CPUs, kernels, devices, threads, library and code versions
recorded in each run's `provenance`; one tidy CSV of every run's summary; what `verify` found
when committed runs were recomputed (`data/results/verify/*.jsonl`), per log, run group and
method; the cost of the pinned kernels (`data/results/bench/numerics_cost.json`). The rerun
page includes them; `tools/generated.py` writes them into `book/_generated/`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from fedsteer_lib.experiments.config import RunConfig
from fedsteer_lib.experiments.groups import GROUP_TITLES
from fedsteer_lib.experiments.registry import METHODS
from fedsteer_lib.experiments.results import has_run, load_run, runs_table
from fedsteer_lib.experiments.verify import read_log, stored_kernels

__all__ = ["cached_configs", "run_provenance", "runtime_table", "runtime_markdown", "all_runs_table",
           "verify_table", "verify_breakdown", "verify_markdown", "cost_markdown", "markdown_table"]

RUNTIME_COLUMNS = ("group", "runs", "total wall time (h)", "median wall time (min)", "kernels", "CPU", "device",
                   "threads", "torch", "code versions")
REPO_ROOT = Path(__file__).resolve().parents[1]
VERIFY_DIR = REPO_ROOT / "data" / "results" / "verify"
COST_FILE = REPO_ROOT / "data" / "results" / "bench" / "numerics_cost.json"
CHANCE_ACCURACY = 0.11  # ten balanced classes: a model that learned nothing scores 0.10


def cached_configs(configs: Iterable[RunConfig], root: str | os.PathLike) -> list[RunConfig]:
    """The configs whose result is cached (and valid) under `root`, in order, each key once."""
    seen: set[str] = set()
    out = []
    for c in configs:
        if c.key() not in seen and has_run(c, root):
            seen.add(c.key())
            out.append(c)
    return out


def run_provenance(configs: Iterable[RunConfig], root: str | os.PathLike) -> pd.DataFrame:
    """One row per cached run of `configs`: its key, wall time (s) and recorded provenance (the
    kernels as `verify.stored_kernels` reads them)."""
    rows = []
    for c in cached_configs(configs, root):
        payload = load_run(c, root)
        prov = payload.get("provenance", {})
        rows.append({"key": c.key(), "wall_time": payload["summary"]["wall_time"],
                     "kernels": stored_kernels(payload), "cpu": prov.get("cpu", "not recorded"),
                     **{k: prov.get(k) for k in ("device", "threads", "torch", "python", "code_version", "date")}})
    return pd.DataFrame(rows, columns=["key", "wall_time", "kernels", "cpu", "device", "threads", "torch", "python",
                                       "code_version", "date"])


def _values(column: pd.Series) -> str:
    """The distinct values of a column, in order of first appearance, joined by ', '."""
    values = (int(v) if isinstance(v, float) and v.is_integer() else v for v in column.dropna())
    return ", ".join(str(v) for v in dict.fromkeys(values))  # 1.0 (a column with gaps) reads 1


def _counts(column: pd.Series) -> str:
    """'pinned 12, native 212': each distinct value with how many runs have it."""
    return ", ".join(f"{v} {n}" for v, n in column.value_counts(sort=False).items())


def _version_span(runs: pd.DataFrame) -> str:
    """'first … last (n versions)' of the code versions, ordered by the runs' dates."""
    versions = list(dict.fromkeys(runs.sort_values("date")["code_version"].dropna()))
    if len(versions) <= 1:
        return versions[0] if versions else ""
    return f"{versions[0]} … {versions[-1]} ({len(versions)} versions)"


def runtime_table(groups: Mapping[str, Sequence[RunConfig]], root: str | os.PathLike) -> pd.DataFrame:
    """One row per run group (`RUNTIME_COLUMNS`): cached runs of defined runs, total wall time in
    hours, median wall time per run in minutes, and the distinct devices, thread counts, torch and
    python versions and the span of code versions its runs recorded. A run in two groups counts
    in both; the last row counts every run once. Groups without runs yet are left out."""
    rows = []
    every = {"all groups (each run once)": [c for configs in groups.values() for c in configs]}
    for name, configs in {**groups, **every}.items():
        defined = len({c.key() for c in configs})
        if not defined:  # a group defined only later (e.g. once a calibration is known)
            continue
        runs = run_provenance(configs, root)
        empty = runs.empty
        rows.append({"group": GROUP_TITLES.get(name, name), "runs": f"{len(runs)} of {defined}",
                     "total wall time (h)": None if empty else runs["wall_time"].sum() / 3600,
                     "median wall time (min)": None if empty else runs["wall_time"].median() / 60,
                     "kernels": _counts(runs["kernels"]), "CPU": _values(runs["cpu"]),
                     "device": _values(runs["device"]), "threads": _values(runs["threads"]),
                     "torch": _values(runs["torch"]), "code versions": _version_span(runs)})
    return pd.DataFrame(rows, columns=list(RUNTIME_COLUMNS))


def _cell(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value).replace("|", "\\|")


def markdown_table(table: pd.DataFrame, columns: Sequence[str], digits: Mapping[str, int]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for _, row in table.iterrows():
        lines.append("| " + " | ".join(_cell(row[c], digits.get(c, 0)) for c in columns) + " |")
    return lines


RUNTIME_SPLIT = 5  # the first table: group, runs, wall times and kernels; the second: the environment


def runtime_markdown(table: pd.DataFrame) -> str:
    """`runtime_table` as two Markdown pipe tables, one under the other (a page is too narrow for
    one): the runs and wall times (hours to 2 decimals, minutes to 1), then the environment."""
    digits = {"total wall time (h)": 2, "median wall time (min)": 1}
    columns = list(table.columns)
    first = markdown_table(table, columns[:RUNTIME_SPLIT], digits)
    second = markdown_table(table, columns[:1] + columns[RUNTIME_SPLIT:], digits)
    return "\n".join(first) + "\n\n" + "\n".join(second) + "\n"


def all_runs_table(groups: Mapping[str, Sequence[RunConfig]], root: str | os.PathLike) -> pd.DataFrame:
    """`results.runs_table` over every cached run of `groups`, each run once, with a `groups`
    column naming every group it belongs to (';'-separated)."""
    member: dict[str, list[str]] = {}
    configs: list[RunConfig] = []
    for name, group in groups.items():
        for c in cached_configs(group, root):
            if c.key() not in member:
                member[c.key()] = []
                configs.append(c)
            if name not in member[c.key()]:
                member[c.key()].append(name)
    table = runs_table(configs, root)
    if not table.empty:
        table.insert(0, "groups", [";".join(member[k]) for k in table["key"]])
        table.insert(1, "precision", [c.precision for c in configs])  # bf16 runs are other runs: say which
    return table


def _changes(records: pd.DataFrame) -> dict[str, Any]:
    """Of `verify` records: how many bit-identical, the median and largest absolute change of the
    final accuracy, and the collapses that flipped."""
    change = (records["new_accuracy"] - records["stored_accuracy"]).abs()
    return {"bit-identical": int(records["identical"].sum()), "median change": float(change.median()),
            "largest change": float(change.max()), "collapses flipped": int(records["collapse_flipped"].sum())}


# What each committed verify log recomputed, for a reader (the file names are for the command line).
VERIFY_LOG_TITLES = {
    "main-pinned": "Table 1 recomputed pinned (stored native, by other machines)",
    "main-pinned-rechecked": "Table 1, pinned runs recomputed in a later session",
    "main-pinned-rechecked-on-an-amd-cpu": "Table 1, pinned on an Intel Xeon, recomputed on an AMD EPYC",
    "main-pinned-rechecked-on-an-amd-cpu-with-rounded-square-roots":
        "the same, FedSteer's runs with correctly rounded square roots",
    "other-groups-random-sample": "other groups, a random sample",
    "other-groups-stratified": "other groups, two runs of every method and γ",
    "pinned-reference-on-a-second-intel-cpu": "reference run, on a second Intel Xeon",
    "pinned-reference-on-an-amd-cpu": "reference run, on an AMD EPYC",
    "pinned-reference-under-an-emulated-intel-cpu": "reference run, under an emulated Intel CPU",
    "pinned-reference-with-correctly-rounded-square-roots": "reference run, correctly rounded square roots"}


def verify_table(log_dir: str | os.PathLike = VERIFY_DIR) -> pd.DataFrame:
    """What recomputing committed runs changed, one row per `verify` log (`<name>.jsonl`: the runs
    of one group, or Table 1's recompute with pinned kernels): runs recomputed, how many came
    back bit-identical, the median and largest absolute change of the final accuracy, collapses
    that flipped, and the kernels they were stored with and recomputed with."""
    rows = []
    for path in sorted(Path(log_dir).glob("*.jsonl")):
        records = pd.DataFrame(read_log([path]))
        if records.empty:
            continue
        rows.append({"recomputed": VERIFY_LOG_TITLES.get(path.stem, path.stem.replace("-", " ")), "runs": len(records),
                     **_changes(records),
                     "stored with": _counts(records["stored_kernels"]), "recomputed with": _counts(records["now_kernels"])})
    return pd.DataFrame(rows, columns=["recomputed", "runs", "bit-identical", "median change", "largest change",
                                       "collapses flipped", "stored with", "recomputed with"])


def verify_breakdown(groups: Mapping[str, Sequence[RunConfig]], log_dir: str | os.PathLike = VERIFY_DIR,
                     by: str = "group") -> pd.DataFrame:
    """What a rerun with other kernels moved, per run group (`by="group"`) or per method, variants
    included, under its display name (`by="method"`): every recomputation of a stored, not pinned
    run in the `verify` logs (per group, a run that several groups share counts in each; a run
    recomputed in two logs counts twice, and within one log its last record counts): how many, how
    many bit-identical, the median and largest absolute change of the final accuracy, the
    collapses (non-finite updates) that flipped, and the runs that ended at chance
    (`CHANCE_ACCURACY`) one time and above it the other. Runs stored with pinned kernels are left
    out: their bits are demanded, not measured. Rows without any recomputed run are left out."""
    if by not in ("group", "method"):
        raise ValueError(f"by={by!r}: one of 'group', 'method'")
    records = pd.DataFrame([r for path in sorted(Path(log_dir).glob("*.jsonl")) for r in read_log([path])])
    columns = [by, "recomputed", "bit-identical", "median change", "largest change", "collapses flipped",
               "at chance once"]
    if records.empty:
        return pd.DataFrame(columns=columns)
    records = records[records["stored_kernels"] != "pinned"]
    if by == "group":
        members = {name: {c.key() for c in configs} for name, configs in groups.items()}
    else:
        members = {}
        for configs in groups.values():
            for c in configs:
                members.setdefault(METHODS[c.method.name].display, set()).add(c.key())
    rows = []
    for name, keys in members.items():
        mine = records[records["key"].isin(keys)]
        if mine.empty:
            continue
        rows.append({by: GROUP_TITLES.get(name, name) if by == "group" else name, "recomputed": len(mine),
                     **_changes(mine),
                     "at chance once": int(((mine["stored_accuracy"] <= CHANCE_ACCURACY)
                                            != (mine["new_accuracy"] <= CHANCE_ACCURACY)).sum())})
    return pd.DataFrame(rows, columns=columns)


def verify_markdown(table: pd.DataFrame) -> str:
    """`verify_table` as a Markdown pipe table (changes of the final accuracy to 4 decimals)."""
    if table.empty:
        return "No committed run has been recomputed yet.\n"
    return "\n".join(markdown_table(table, list(table.columns), {"median change": 4, "largest change": 4})) + "\n"


def cost_markdown(path: str | os.PathLike = COST_FILE) -> str:
    """The measured cost of the pinned kernels (`bench/numerics_cost.py`) as a Markdown table."""
    if not Path(path).is_file():
        return "The cost of the pinned kernels has not been measured on this machine yet (`bench/numerics_cost.py`).\n"
    data = json.loads(Path(path).read_text())
    table = pd.DataFrame(data["runs"])
    summary = table.groupby("kernels")[["wall", "client", "eval", "process_cpu"]].median().reset_index()
    names = {"wall": "whole run (s)", "client": "client training (s)", "eval": "evaluation (s)",
             "process_cpu": "process CPU time (s)"}
    lines = [f"Measured on {data['cpu']} ({', '.join(data['cpu_flags'])}), one thread, the same {data['run']} "
             f"({data['repeats']} times each, alternating; medians):", ""]
    lines += markdown_table(summary.rename(columns=names), ["kernels", *names.values()], {v: 1 for v in names.values()})
    ratio = summary.set_index("kernels")["process_cpu"]
    if {"pinned", "native"} <= set(ratio.index):
        lines += ["", f"Pinned over native, in CPU time: {ratio['pinned'] / ratio['native']:.2f} × on this CPU."]
    return "\n".join(lines) + "\n"
