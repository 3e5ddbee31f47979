"""The partial-update variance term of Theorem 2 along training: the per-round probe summaries
(client = -1 rows of a diagnostics run's probes) of E||Delta_t - sum_i d_i g_i||^2, its variance
and bias parts and Theorem 1's closed form, and their time average per method.

Used by chapter 5 (the runs are `sweep.convergence_grid`'s). The per-client rows of the same
probes are `alignment.client_probe_table`'s.
"""
from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

from ..experiments.config import RunConfig
from .methods import label_without_warmup

__all__ = ["variance_probe_table", "variance_term_summary"]


def _nan(x: Any) -> float:
    return float("nan") if x is None else float(x)


def variance_probe_table(configs: Sequence[RunConfig], root) -> pd.DataFrame:
    """The per-round probe summaries (client = -1 rows of `extras["probes"]`) of finished runs
    with `Diagnostics(probe_every > 0)`: one row per (run, probe round).

    Columns: label (`methods.label_without_warmup`), method, gamma, seed, round, mc_variance
    (E||Delta - E Delta||^2 over participation draws), exact_variance (Theorem 1's closed form,
    NaN where Eq. 4's form does not apply), mse_to_mean (E||Delta - sum_i d_i g_i||^2: the
    quantity in Theorem 2's partial-update variance term), bias_sq (||E Delta - sum_i d_i g_i||^2),
    target_norm_sq (||sum_i d_i g_i||^2) and relative_mse = mse_to_mean / target_norm_sq.
    """
    from ..experiments.results import load_run

    rows = []
    for c in configs:
        payload = load_run(c, root)
        probes = payload["extras"].get("probes")
        if not probes:
            raise ValueError(f"run {c.key()} ({c.method.label}) has no probes; use Diagnostics(probe_every > 0)")
        for p in probes:
            if p["client"] != -1:
                continue
            target_sq = _nan(p["target_norm"]) ** 2
            mse = _nan(p["mse_to_mean"])
            rows.append({"label": label_without_warmup(c.method), "method": c.method.name, "gamma": c.system.gamma,
                         "seed": c.seed, "round": int(p["round"]), "mc_variance": _nan(p["mc_variance"]),
                         "exact_variance": _nan(p["exact_variance"]), "mse_to_mean": mse,
                         "bias_sq": _nan(p["bias_norm"]) ** 2, "target_norm_sq": target_sq,
                         "relative_mse": mse / target_sq if target_sq > 0 else float("nan"),
                         "collapsed": bool(payload["summary"]["collapsed"])})
    return pd.DataFrame(rows)


def variance_term_summary(table: pd.DataFrame, metric: str = "mse_to_mean") -> pd.DataFrame:
    """Time average (over the probe rounds, then over seeds) of `metric` per (gamma, label):
    the empirical (1/T) sum_t E||Delta_t - g_bar_t||^2 of Theorem 2's partial-update variance
    term 4 eta_s L (1/T) sum_t E||Delta_t - g_bar_t||^2. Adds the averages of the variance and
    the squared bias (mse = variance + bias^2), the ratio to the smallest average within each
    gamma, the rank (1 = smallest term) and the number of collapsed runs (a collapsed run is
    averaged over the probes it reached)."""
    table = table.assign(collapsed=table["collapsed"] if "collapsed" in table else False)
    per_run = table.groupby(["gamma", "label", "method", "seed"], as_index=False).agg(
        term=(metric, "mean"), mc_variance=("mc_variance", "mean"), bias_sq=("bias_sq", "mean"),
        exact_variance=("exact_variance", "mean"), probes=("round", "count"), collapsed=("collapsed", "max"))
    out = per_run.groupby(["gamma", "label", "method"], as_index=False).agg(
        term=("term", "mean"), mc_variance=("mc_variance", "mean"), bias_sq=("bias_sq", "mean"),
        exact_variance=("exact_variance", "mean"), probes=("probes", "mean"), seeds=("seed", "nunique"),
        collapsed_runs=("collapsed", "sum"))
    out["ratio_to_smallest"] = out["term"] / out.groupby("gamma")["term"].transform("min")
    out["rank"] = out.groupby("gamma")["term"].rank(method="min").astype(int)
    return out.sort_values(["gamma", "term"]).reset_index(drop=True)
