"""The regime map (client lr x local epochs, issue 14 item 4) and the paper-calibrated cell
(item 5): per-cell means, FedSteer's paired gain over each cell's best baseline, and the
calibration rule applied to the map. Every function takes the tidy runs table of
`conventions.role_runs` (one row per run).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..experiments import tuning
from ..experiments.config import CALIBRATION_TARGET
from ..experiments.registry import display_name
from .conventions import NON_BASELINES
from .stats import counted

__all__ = ["regime_summary", "regime_gains", "describe_regime_gains", "calibrated_cell", "describe_calibrated_cell"]


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


def describe_regime_gains(gains: pd.DataFrame, steer: str, paper_gain: float) -> str:
    """The regime map's answer in words for one FedSteer ordering (`gains`: its `regime_gains`):
    in how many cells it ends above the cell's best baseline on average, its largest mean
    relative gain and where, and how many cells reach the paper's relative gain `paper_gain`;
    indicative (no test: the map has fewer seeds than a verdict needs)."""
    if gains.empty:
        return f"No cell of the map has {steer} and a baseline yet."
    best = gains.loc[gains["relative_gain"].idxmax()]
    above = int((gains["gain"] > 0).sum())
    reach = int((gains["relative_gain"] >= paper_gain).sum())
    return (f"{steer} ends above the cell's best baseline on average in {above} of {len(gains)} cells; its largest "
            f"mean gain is {best['gain']:+.3f} ({100 * best['relative_gain']:+.1f} % over {best['best_baseline']}) at "
            f"client lr {best['client_lr']:g}, E = {best['local_epochs']} ({counted(best['n'], 'seed')}), and "
            f"{counted(reach, 'cell')} reach{'es' if reach == 1 else ''} the paper's "
            f"{100 * paper_gain:+.1f} %.")


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
    seeds = counted(cell['n'], 'seed')
    head = ("The rule picks" if final is not None else
            "Provisionally (not every unbiased FedAvg run of the map is in yet), the rule picks")
    text = (f"{head} client lr {cell['client_lr']:g}, E = {cell['local_epochs']}: unbiased FedAvg "
            f"{cell['mean']:.3f} over {seeds} (the paper: {cell['paper']:.3f}). In that cell: {means}.")
    if final is not None and point_cached < point_total:
        text += (f" Table 1's methods and the FedStale code base's baselines at this cell, every seed and both γ: "
                 f"{point_cached} of {point_total} runs computed so far (`python -m fedsteer_lib sweep --what calibrated`).")
    elif final is not None:
        text += (f" Table 1's methods and the FedStale code base's baselines were run at this cell with every seed "
                 f"and γ: all {point_total} runs are in.")
    return text
