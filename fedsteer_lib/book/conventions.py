"""Baseline conventions and regimes: Table 1 under two conventions, FedSteer's gains paired by
seed, the regime map (client lr x local epochs) and the paper-calibrated cell.

Rows are found from each run's method parameters (`experiments.registry.role_of`), never from
its label. Every function takes the tidy runs table of `role_runs` (one row per run).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from ..experiments import tuning
from ..experiments.config import CALIBRATION_TARGET, DATASET_DEFAULTS, RunConfig
from ..experiments.registry import FRAMEWORK_ROLES, TABLE1_ROLES, display_name, role_of
from ..experiments.results import runs_table
from .paper import paper_value_for
from .stats import tested_verdicts

__all__ = ["CONVENTION_PAIRS", "role_runs", "at_best_fedstale_beta", "convention_table", "convention_display", "paired_gains",
           "paired_gains_display", "describe_paired_gains", "regime_summary", "regime_gains", "calibrated_cell",
           "describe_calibrated_cell"]

# (row, today's normalised convention, the FedStale code base's convention)
CONVENTION_PAIRS: tuple[tuple[str, str, str], ...] = (
    ("FedAvg", "fedavg", "fedavg_unbiased"),
    ("FedProx", "fedprox", "fedprox_unbiased"),
    ("SCAFFOLD", "scaffold", "scaffold_unbiased"),
    ("MIFA", "mifa", "mifa_wait_all"),
    ("FedVARP", "fedvarp", "fedvarp"),
    ("FedStale (best β)", "fedstale", "fedstale"),
    ("FedSteer", "fedsteer", "fedsteer"),
    ("FedSteer (as written)", "fedsteer_as_written", "fedsteer_as_written"),
    ("Full participation", "full", "full"),
)
STEERS = ("fedsteer", "fedsteer_as_written")
NON_BASELINES = ("full", "fedsteer", "fedsteer_enforce5", "fedsteer_as_written")


def role_runs(configs: Sequence[RunConfig], root) -> pd.DataFrame:
    """The runs table with each run's role (table row), client lr, local epochs and beta; a run
    that several groups share appears once."""
    configs = list({c.key(): c for c in configs}.values())
    table = runs_table(configs, root)
    if table.empty:
        return table.assign(role=[], client_lr=[], local_epochs=[], beta=[])
    dd = {c.dataset: {k: v for k, v in DATASET_DEFAULTS[c.dataset].items() if k in ("core_size", "lam")} for c in configs}
    table["role"] = [role_of(c.method.name, dict(c.method.params), dd[c.dataset]) for c in configs]
    table["client_lr"] = [c.training.client_lr for c in configs]
    table["local_epochs"] = [c.training.local_epochs for c in configs]
    table["beta"] = [c.method.get("beta") if c.method.name == "fedstale" else np.nan for c in configs]
    return table


def at_best_fedstale_beta(runs: pd.DataFrame, metric: str = "final_accuracy") -> pd.DataFrame:
    """FedStale's runs at the beta with the best mean (the paper's protocol), other roles as they are."""
    stale = runs[runs["role"] == "fedstale"]
    if stale.empty:
        return runs
    best_beta = stale.groupby("beta")[metric].mean().idxmax()
    return runs[(runs["role"] != "fedstale") | (runs["beta"] == best_beta)]


def _stats(values: pd.Series) -> dict:
    v = values.dropna()
    return {"mean": float(v.mean()) if len(v) else np.nan,
            "std": float(v.std(ddof=1)) if len(v) > 1 else np.nan, "n": int(len(v))}


def convention_table(runs: pd.DataFrame, metric: str = "final_accuracy") -> pd.DataFrame:
    """One row per (gamma, method) with the mean, std and n of `metric` under both conventions;
    FedStale at its best beta per gamma and convention."""
    rows = []
    for gamma, at_gamma in runs.groupby("gamma"):
        at_gamma = at_best_fedstale_beta(at_gamma, metric)
        for name, normalised, framework in CONVENTION_PAIRS:
            row = {"gamma": gamma, "method": name}
            for conv, key in (("normalised", normalised), ("framework", framework)):
                sel = at_gamma[at_gamma["role"] == key]
                stats = _stats(sel[metric])
                row.update({f"{conv}_{k}": v for k, v in stats.items()})
                row[f"{conv}_collapsed"] = int(sel["collapsed"].sum()) if len(sel) else 0
            rows.append(row)
    return pd.DataFrame(rows)


def paired_gains(runs: pd.DataFrame, metric: str = "final_accuracy") -> pd.DataFrame:
    """FedSteer's gain over the best baseline of each convention set (best by mean over seeds),
    paired by seed: per (gamma, convention, FedSteer ordering) the mean and std of the per-seed
    difference, its relative size, how many seeds FedSteer wins, the paired t-test's p, its
    Holm adjustment over every row of the table (one family) and the verdict it allows
    (`stats.tested_verdicts`: none from fewer than 5 seeds)."""
    sets = {"normalised": [r for r in TABLE1_ROLES if r not in NON_BASELINES],
            "framework": [r for r in FRAMEWORK_ROLES if r not in NON_BASELINES]}
    rows, diffs = [], []
    for gamma, at_gamma in runs.groupby("gamma"):
        at_gamma = at_best_fedstale_beta(at_gamma, metric)
        per_seed = at_gamma.pivot_table(index="seed", columns="role", values=metric, aggfunc="first")
        for conv, baselines in sets.items():
            present = [b for b in baselines if b in per_seed]
            if not present:
                continue
            best = per_seed[present].mean().idxmax()
            for steer in STEERS:
                if steer not in per_seed:
                    continue
                both = per_seed[[steer, best]].dropna()
                diff = both[steer] - both[best]
                diffs.append(diff.tolist())
                rows.append({"gamma": gamma, "convention": conv, "fedsteer": display_name(steer),
                             "best_baseline": display_name(best), "fedsteer_mean": float(both[steer].mean()),
                             "baseline_mean": float(both[best].mean()), "gain": float(diff.mean()),
                             "gain_std": float(diff.std(ddof=1)) if len(diff) > 1 else np.nan,
                             "relative_gain": float(diff.mean() / both[best].mean()),
                             "wins": int((diff > 0).sum()), "n": int(len(diff))})
    out = pd.DataFrame(rows)
    if rows:
        tests = tested_verdicts(diffs)
        out[["p", "p_holm", "verdict"]] = tests[["p", "p_holm", "verdict"]].values
    return out


_CONVENTION_NAMES = {"normalised": "today's (normalised)", "framework": "FedStale code base's"}


def _cell(mean: float, std: float, n: int, collapsed: int) -> str:
    if not n:
        return "—"
    text = f"{mean:.3f}" + ("" if np.isnan(std) else f" ± {std:.3f}")
    return text + (f" ({collapsed} of {n} collapsed)" if collapsed else "")


def convention_display(table: pd.DataFrame, dataset: str = "fmnist") -> pd.DataFrame:
    """`convention_table` for reading: mean ± std per convention (with the collapsed runs
    counted), the paper's number where its text quotes one, no index."""
    roles = {name: normalised for name, normalised, _ in CONVENTION_PAIRS}
    rows = []
    for _, r in table.iterrows():
        paper = paper_value_for(dataset, r["gamma"], "final_accuracy", roles[r["method"]])
        rows.append({"γ": f"{r['gamma']:g}", "method": r["method"],
                     _CONVENTION_NAMES["normalised"]: _cell(r["normalised_mean"], r["normalised_std"],
                                                            r["normalised_n"], r["normalised_collapsed"]),
                     _CONVENTION_NAMES["framework"]: _cell(r["framework_mean"], r["framework_std"],
                                                           r["framework_n"], r["framework_collapsed"]),
                     "paper": "" if np.isnan(paper) else f"{paper:.3f}"})
    return pd.DataFrame(rows)


def paired_gains_display(gains: pd.DataFrame, dataset: str = "fmnist") -> pd.DataFrame:
    """`paired_gains` for reading, with the paper's relative gain over its best baseline."""
    rows = []
    for _, r in gains.iterrows():
        paper = paper_value_for(dataset, r["gamma"], "gain_vs_best_baseline", "fedsteer")
        rows.append({"γ": f"{r['gamma']:g}", "conventions": _CONVENTION_NAMES[r["convention"]],
                     "FedSteer": r["fedsteer"], "best baseline": r["best_baseline"],
                     "gain (paired)": f"{r['gain']:+.3f} ± {r['gain_std']:.3f}" if r["n"] > 1 else f"{r['gain']:+.3f}",
                     "relative": f"{100 * r['relative_gain']:+.1f} %", "seeds won": f"{r['wins']} of {r['n']}",
                     "p (Holm)": "—" if pd.isna(r["p_holm"]) else f"{r['p_holm']:.3f}", "verdict": r["verdict"],
                     "paper": "" if np.isnan(paper) else f"{100 * paper:+.1f} %"})
    return pd.DataFrame(rows)


def describe_paired_gains(gains: pd.DataFrame, gamma: float, steer: str = "FedSteer (as written)") -> str:
    """One sentence per convention set: FedSteer's (`steer`) paired gain over that set's best
    baseline at `gamma`, with seeds won and the corrected test's verdict."""
    parts = []
    for _, r in gains[np.isclose(gains["gamma"], gamma) & (gains["fedsteer"] == steer)].iterrows():
        test = ("" if pd.isna(r["p_holm"]) else f", Holm-adjusted p = {r['p_holm']:.3f}")
        phrase = {"normalised": "today's normalised baselines", "framework": "the FedStale code base's baselines"}
        parts.append(f"with {phrase[r['convention']]}, {steer} ends "
                     f"{r['gain']:+.3f} ({100 * r['relative_gain']:+.1f} %) from the best of them, "
                     f"{r['best_baseline']} ({r['baseline_mean']:.3f}), winning {r['wins']} of {r['n']} seeds{test}: "
                     f"{r['verdict']}")
    return f"At γ = {gamma:g}, " + "; ".join(parts) + "." if parts else f"No paired runs at γ = {gamma:g}."


def regime_summary(runs: pd.DataFrame, metric: str = "final_accuracy") -> pd.DataFrame:
    """Per regime cell (client lr, local epochs) and role: mean, std and n of `metric`."""
    g = runs.groupby(["client_lr", "local_epochs", "role"])[metric]
    out = g.agg(mean="mean", n="count").reset_index()
    out["std"] = g.std(ddof=1).values
    return out


def regime_gains(runs: pd.DataFrame, steer: str = "fedsteer", metric: str = "final_accuracy") -> pd.DataFrame:
    """Per regime cell: FedSteer's (role `steer`) paired gain over the cell's best baseline (best
    by mean among the cell's non-FedSteer roles), its std over seeds and n."""
    rows = []
    for (lr, epochs), cell in runs.groupby(["client_lr", "local_epochs"]):
        per_seed = cell.pivot_table(index="seed", columns="role", values=metric, aggfunc="first")
        baselines = [r for r in per_seed if r not in NON_BASELINES]
        if steer not in per_seed or not baselines:
            continue
        best = per_seed[baselines].mean().idxmax()
        both = per_seed[[steer, best]].dropna()
        diff = both[steer] - both[best]
        rows.append({"client_lr": lr, "local_epochs": epochs, "best_baseline": display_name(best),
                     "gain": float(diff.mean()), "gain_std": float(diff.std(ddof=1)) if len(diff) > 1 else np.nan,
                     "relative_gain": float(diff.mean() / both[best].mean()), "n": int(len(diff))})
    return pd.DataFrame(rows)


def calibrated_cell(summary: pd.DataFrame) -> dict | None:
    """The rule of `config.CALIBRATION_TARGET` (`experiments.tuning.calibrated_cell`), applied
    to a `regime_summary`: the cell whose unbiased FedAvg has the mean closest to the paper's
    FedAvg. None when no cell has that method yet."""
    target = CALIBRATION_TARGET
    cell = tuning.calibrated_cell(summary[summary["role"] == target["method"]], target["paper_accuracy"])
    return None if cell is None else {**cell, "fedavg_unbiased": cell["mean"]}


def describe_calibrated_cell(summary: pd.DataFrame, final: dict | None, point_cached: int, point_total: int) -> str:
    """The calibrated cell in words: `final` (`experiments.groups.calibration_cell`) once every
    unbiased FedAvg run of the map is cached, else the rule applied to the map so far
    (`summary`, a `regime_summary`), marked provisional; the methods' means in that cell, and
    how many runs of the calibrated point (`groups.calibrated_grid`) are cached."""
    cell = final if final is not None else calibrated_cell(summary)
    if cell is None:
        return "No cell of the map has unbiased FedAvg runs yet."
    in_cell = summary[np.isclose(summary["client_lr"], cell["client_lr"]) & (summary["local_epochs"] == cell["local_epochs"])]
    means = ", ".join(f"{display_name(r)} {m:.3f}" for r, m in zip(in_cell["role"], in_cell["mean"]))
    seeds = f"{cell['n']} seed{'s' if cell['n'] != 1 else ''}"
    head = ("The rule picks" if final is not None else
            "Provisionally (not every unbiased FedAvg run of the map is in yet), the rule picks")
    text = (f"{head} client lr {cell['client_lr']:g}, E = {cell['local_epochs']}: unbiased FedAvg "
            f"{cell['mean']:.3f} over {seeds} (the paper: {cell['paper']:.3f}). In that cell: {means}.")
    if final is not None:
        text += (f" Table 1's methods and the FedStale code base's baselines at this cell, every seed and both γ: "
                 f"{point_cached} of {point_total} runs computed so far (`python -m fedsteer_lib sweep --what calibrated`).")
    return text
