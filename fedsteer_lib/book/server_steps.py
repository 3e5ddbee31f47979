"""Each method's own server step (chapter 9): the validation search over eta_s and Table 1 with
every method at the step it chose next to the frozen step. The choice itself is
`experiments.tuning.select_server_steps`; the runs are `experiments.groups.server_step_grid` and
`own_step_grid`. Tables take the tidy runs of `conventions.role_runs`.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ..experiments import tuning
from ..experiments.config import DATASET_DEFAULTS, SERVER_LRS, SERVER_STEP_FEDSTALE_BETA, TUNED, MethodSpec
from ..experiments.registry import display_name, role_of
from .conventions import _cell, _role_name, _stats
from .stats import counted

__all__ = ["server_step_table", "own_step_runs", "own_step_display", "describe_own_steps", "describe_step_effects"]


def server_step_table(runs: pd.DataFrame, server_lrs: Sequence[float] = SERVER_LRS,
                      metric: str = "final_accuracy") -> pd.DataFrame:
    """The server-step search for reading (`runs`: `role_runs` of `groups.server_step_grid`,
    accuracies on the validation split): one row per method with its validation accuracy at each
    server step of `server_lrs` (the profile's; mean over the gammas) and the step it gets
    (`experiments.tuning.select_server_steps`), the latter only once every (step, gamma) run of
    the method is in; "—" where a run is missing."""
    if runs.empty:
        return pd.DataFrame(columns=["method", *(f"η_s = {lr:g}" for lr in server_lrs), "chosen η_s"])
    gammas = runs["gamma"].nunique()
    choice = tuning.select_server_steps(runs.assign(label=runs["role"])).set_index("label")["server_lr"]
    rows = []
    for role, mine in runs.groupby("role", sort=False):
        means = mine.groupby("server_lr")[metric].agg(["mean", "count"])
        row = {"method": _role_name(role, runs)}
        for lr in server_lrs:
            done = lr in means.index and means.loc[lr, "count"] == gammas
            row[f"η_s = {lr:g}"] = f"{means.loc[lr, 'mean']:.3f}" if done else "—"
        complete = all(row[f"η_s = {lr:g}"] != "—" for lr in server_lrs)
        row["chosen η_s"] = f"{choice[role]:g}" if complete else "—"
        rows.append(row)
    return pd.DataFrame(rows)


def _step_roles(choices: Mapping[MethodSpec, float], dataset: str) -> dict[str, float]:
    """`groups.server_step_choices` keyed by role (table row)."""
    dd = {k: v for k, v in DATASET_DEFAULTS[dataset].items() if k in ("core_size", "lam")}
    return {role_of(spec.name, dict(spec.params), dd): lr for spec, lr in choices.items()}


def own_step_runs(frozen: pd.DataFrame, reruns: pd.DataFrame, choices: Mapping[MethodSpec, float] | None,
                  dataset: str = "fmnist") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every method of the server-step search at the frozen step, and at its own step), as runs
    tables (`role_runs`). `choices` is `groups.server_step_choices`; at its own step a method's
    runs are its reruns (`groups.own_step_grid`, in `reruns`) where the step is not the frozen
    one, else its runs in `frozen` (Table 1's). FedStale at the beta its step was searched at
    (`config.SERVER_STEP_FEDSTALE_BETA`) in both. Both empty while `choices` is None."""
    frozen_step = TUNED[dataset].server_lr
    steps = _step_roles(choices or {}, dataset)

    def at(step_of: Mapping[str, float]) -> pd.DataFrame:
        parts = []
        for role, server_lr in step_of.items():
            source = frozen if server_lr == frozen_step else reruns
            if source.empty:
                continue
            mine = source[(source["role"] == role) & np.isclose(source["server_lr"], server_lr)]
            parts.append(mine[np.isclose(mine["beta"], SERVER_STEP_FEDSTALE_BETA)] if role == "fedstale" else mine)
        return pd.concat(parts, ignore_index=True) if parts else frozen.iloc[0:0]

    return at({role: frozen_step for role in steps}), at(steps)


def own_step_display(frozen: pd.DataFrame, own: pd.DataFrame, choices: Mapping[MethodSpec, float] | None,
                     dataset: str = "fmnist", metric: str = "final_accuracy") -> pd.DataFrame:
    """Each searched method at the frozen step next to its own (the two tables of
    `own_step_runs`): one row per (gamma, method) with its chosen step and mean ± std over the
    seeds (the collapsed runs counted) at both; "—" where the runs are not in yet."""
    steps = _step_roles(choices or {}, dataset)
    rows = []
    for gamma in sorted(set(frozen["gamma"]) | set(own["gamma"])):
        for role, server_lr in steps.items():
            row = {"γ": f"{gamma:g}", "method": _role_name(role, frozen), "its η_s": f"{server_lr:g}"}
            seeds = frozen.loc[(frozen["role"] == role) & np.isclose(frozen["gamma"], gamma), "seed"].nunique()
            for name, table in ((f"at η_s = {TUNED[dataset].server_lr:g}", frozen), ("at its η_s", own)):
                sel = table[(table["role"] == role) & np.isclose(table["gamma"], gamma)]
                stats = _stats(sel[metric])
                row[name] = _cell(stats["mean"], stats["std"], stats["n"], int(sel["collapsed"].sum()) if len(sel) else 0,
                                  of_seeds=seeds)
            rows.append(row)
    return pd.DataFrame(rows)


def describe_own_steps(choices: Mapping[MethodSpec, float] | None, reruns_missing: int, dataset: str = "fmnist") -> str:
    """The server-step search's outcome in words: which methods keep the frozen step and which
    get another, and whether their reruns on the test split are in."""
    if choices is None:
        return "The search is not complete yet, so no method has its own step."
    frozen_step = TUNED[dataset].server_lr
    names = {role: (f"FedStale (β = {spec.get('beta'):g})" if spec.name == "fedstale" else display_name(role))
             for role, spec in zip(_step_roles(choices, dataset), choices)}
    steps = dict(zip(names, choices.values()))
    moved = {role: lr for role, lr in steps.items() if lr != frozen_step}
    kept = [names[r] for r in steps if r not in moved]
    text = (f"Of the {counted(len(steps), 'method')} searched, {len(kept)} {'keeps' if len(kept) == 1 else 'keep'} "
            f"η_s = {frozen_step:g}" + (f" ({', '.join(kept)})" if kept else "")
            + (("; " + ", ".join(f"{names[r]} gets η_s = {lr:g}" for r, lr in moved.items())) if moved else "")
            + ".")
    if moved:
        rerun = "That method is rerun at its own step" if len(moved) == 1 else f"Those {len(moved)} are rerun at their own step"
        text += (f" {rerun} with every seed and γ of Table 1"
                 + (f"; {reruns_missing} of {'its' if len(moved) == 1 else 'their'} runs are still being computed "
                    "(`python -m fedsteer_lib sweep --what server_step`)." if reruns_missing else "."))
    return text


def describe_step_effects(frozen: pd.DataFrame, own: pd.DataFrame, choices: Mapping[MethodSpec, float] | None,
                          dataset: str = "fmnist", metric: str = "final_accuracy") -> str:
    """What the chosen steps did on the test split (the two tables of `own_step_runs`): per gamma,
    how many of the methods given another step end higher and how many lower at it than at the
    frozen step, by their mean over the seeds, with the range of the changes (a sentence saying so
    while no method has another step or its runs are not in)."""
    frozen_step = TUNED[dataset].server_lr
    moved = [role for role, lr in _step_roles(choices or {}, dataset).items() if lr != frozen_step]
    sentences = []
    for gamma in sorted(set(own["gamma"]), reverse=True):
        change = {}
        for role in moved:
            at = [t.loc[(t["role"] == role) & np.isclose(t["gamma"], gamma), metric].mean() for t in (frozen, own)]
            if not np.isnan(at).any():
                change[role] = at[1] - at[0]
        if not change:
            continue
        up, down = [c for c in change.values() if c > 0], [c for c in change.values() if c <= 0]
        parts = [f"{'all ' if len(group) == len(change) > 1 else ''}{len(group)} end{'s' if len(group) == 1 else ''} {word} "
                 + (f"(by {abs(group[0]):.3f})" if len(group) == 1 else
                    f"(by {min(map(abs, group)):.3f} to {max(map(abs, group)):.3f})")
                 for group, word in ((up, "higher"), (down, "lower")) if group]
        sentences.append(f"At γ = {gamma:g}, of the {counted(len(change), 'method')} given another step, "
                         + " and ".join(parts) + f" at it than at η_s = {frozen_step:g}.")
    return " ".join(sentences) or "No method given another step has its runs in yet."
