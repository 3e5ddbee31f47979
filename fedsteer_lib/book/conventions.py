"""Baseline conventions: Table 1 under two conventions, FedSteer's gains paired by seed, and the
paper's claims checked per convention (the regime map and the paper-calibrated cell: `regimes`;
each method's own server step: `server_steps`).

Rows are found from each run's method parameters (`experiments.registry.role_of`), never from
its label. Every function takes the tidy runs table of `role_runs` (one row per run).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from IPython.display import Markdown

from ..experiments.config import DATASET_DEFAULTS, RunConfig
from ..experiments.registry import FRAMEWORK_ROLES, TABLE1_ROLES, display_name, role_of
from ..experiments.results import runs_table
from .paper import HEADLINE_FEDSTEER, paper_value_for
from .stats import counted, tested_verdicts
from .table_display import table_or_note

__all__ = ["CONVENTION_PAIRS", "role_runs", "at_best_fedstale_beta", "convention_table", "convention_display", "paired_gains",
           "withhold_verdicts", "paired_gains_display", "describe_paired_gains", "describe_gains_by_gamma", "BASELINE_SETS", "setting_claims", "setting_claims_display",
           "describe_setting_claims", "claims_by_setting", "describe_open_groups"]

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
# The baselines FedSteer is compared with under each convention set (the unbiased FedAvg belongs
# to both), and each set's FedAvg.
BASELINE_SETS: dict[str, tuple[str, ...]] = {
    "normalised": tuple(r for r in TABLE1_ROLES if r not in NON_BASELINES),
    "framework": tuple(r for r in FRAMEWORK_ROLES if r not in NON_BASELINES)}
FEDAVG_OF = {"normalised": "fedavg", "framework": "fedavg_unbiased"}


def role_runs(configs: Sequence[RunConfig], root) -> pd.DataFrame:
    """The runs table with each run's role (table row), client lr, local epochs and beta; a run
    that several groups share appears once."""
    configs = list({c.key(): c for c in configs}.values())
    table = runs_table(configs, root)
    if table.empty:
        return table.assign(role=[], client_lr=[], local_epochs=[], beta=[], server_lr=[])
    dd = {c.dataset: {k: v for k, v in DATASET_DEFAULTS[c.dataset].items() if k in ("core_size", "lam")} for c in configs}
    table["role"] = [role_of(c.method.name, dict(c.method.params), dd[c.dataset]) for c in configs]
    table["client_lr"] = [c.training.client_lr for c in configs]
    table["local_epochs"] = [c.training.local_epochs for c in configs]
    table["beta"] = [c.method.get("beta") if c.method.name == "fedstale" else np.nan for c in configs]
    table["server_lr"] = [c.training.server_lr for c in configs]
    return table


def at_best_fedstale_beta(runs: pd.DataFrame, metric: str = "final_accuracy") -> pd.DataFrame:
    """FedStale's runs at the beta with the best mean (the paper's protocol), other roles as they are."""
    stale = runs[runs["role"] == "fedstale"]
    if stale.empty:
        return runs
    best_beta = stale.groupby("beta")[metric].mean().idxmax()
    return runs[(runs["role"] != "fedstale") | (runs["beta"] == best_beta)]


def _role_name(role: str, runs: pd.DataFrame) -> str:
    """A role's display name; FedStale run at one beta only is named with that beta, not "best β"."""
    if role == "fedstale":
        betas = runs.loc[runs["role"] == "fedstale", "beta"].dropna().unique()
        if len(betas) == 1:
            return f"FedStale (β = {betas[0]:g})"
    return display_name(role)


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


_GAIN_COLUMNS = ["gamma", "convention", "fedsteer", "best_baseline", "fedsteer_mean", "baseline_mean", "gain", "gain_std",
                 "relative_gain", "wins", "n", "p", "p_holm", "verdict"]


def paired_gains(runs: pd.DataFrame, metric: str = "final_accuracy") -> pd.DataFrame:
    """FedSteer's gain over the best baseline of each convention set (best by mean over seeds),
    paired by seed: per (gamma, convention, FedSteer ordering) the mean and std of the per-seed
    difference, its relative size, how many seeds FedSteer wins, the paired t-test's p, its
    Holm adjustment over every row of the table (one family) and the verdict it allows
    (`stats.tested_verdicts`: none from fewer than 5 seeds)."""
    rows, diffs = [], []
    for gamma, every_beta in runs.groupby("gamma"):
        at_gamma = at_best_fedstale_beta(every_beta, metric)
        per_seed = at_gamma.pivot_table(index="seed", columns="role", values=metric, aggfunc="first")
        for conv, baselines in BASELINE_SETS.items():
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
                             "best_baseline": _role_name(best, every_beta), "fedsteer_mean": float(both[steer].mean()),
                             "baseline_mean": float(both[best].mean()), "gain": float(diff.mean()),
                             "gain_std": float(diff.std(ddof=1)) if len(diff) > 1 else np.nan,
                             "relative_gain": float(diff.mean() / both[best].mean()),
                             "wins": int((diff > 0).sum()), "n": int(len(diff))})
    out = pd.DataFrame(rows, columns=_GAIN_COLUMNS[:-3])
    tests = tested_verdicts(diffs)
    out[["p", "p_holm", "verdict"]] = tests[["p", "p_holm", "verdict"]].values
    return out


def withhold_verdicts(gains: pd.DataFrame, runs_missing: int) -> pd.DataFrame:
    """`gains` (a `paired_gains` table) as it may be shown while `runs_missing` runs of its group
    are not in: every verdict reads "none yet (N runs missing)" (the p-values stay)."""
    if not runs_missing:
        return gains
    return gains.assign(verdict=f"none yet ({counted(runs_missing, 'run')} missing)")


_CONVENTION_NAMES = {"normalised": "today's (normalised)", "framework": "FedStale code base's"}
_CONVENTION_PHRASES = {"normalised": "today's normalised baselines", "framework": "the FedStale code base's baselines"}


def _cell(mean: float, std: float, n: int, collapsed: int, of_seeds: int = 0) -> str:
    """"mean ± std", noting the collapsed runs and, when `of_seeds` is given and more than n,
    that only n of that many seeds are in yet."""
    if not n:
        return "—"
    text = f"{mean:.3f}" + ("" if np.isnan(std) else f" ± {std:.3f}")
    notes = ([f"{n} of {of_seeds} seeds"] if n < of_seeds else []) + ([f"{collapsed} of {n} collapsed"] if collapsed else [])
    return text + (f" ({'; '.join(notes)})" if notes else "")


def convention_display(table: pd.DataFrame, dataset: str = "fmnist") -> pd.DataFrame:
    """`convention_table` for reading: mean ± std per convention (with the collapsed runs
    counted), the paper's number where its text quotes one, no index; a method with no run
    under either convention has no row."""
    roles = {name: normalised for name, normalised, _ in CONVENTION_PAIRS}
    rows = []
    for _, r in table.iterrows():
        if not r["normalised_n"] and not r["framework_n"]:
            continue  # a method this grid does not run
        paper = paper_value_for(dataset, r["gamma"], "final_accuracy", roles[r["method"]])
        rows.append({"γ": f"{r['gamma']:g}", "method": r["method"],
                     _CONVENTION_NAMES["normalised"]: _cell(r["normalised_mean"], r["normalised_std"],
                                                            r["normalised_n"], r["normalised_collapsed"]),
                     _CONVENTION_NAMES["framework"]: _cell(r["framework_mean"], r["framework_std"],
                                                           r["framework_n"], r["framework_collapsed"]),
                     "paper": "" if np.isnan(paper) else f"{paper:.3f}"})
    return pd.DataFrame(rows)


def paired_gains_display(gains: pd.DataFrame, dataset: str = "fmnist") -> pd.DataFrame:
    """`paired_gains` (or `withhold_verdicts` of it) for reading, with the paper's relative gain
    over its best baseline."""
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


def describe_paired_gains(gains: pd.DataFrame, gamma: float, steer: str = "FedSteer (as written)",
                          dataset: str | None = None) -> str:
    """One sentence per convention set: FedSteer's (`steer`) paired gain over that set's best
    baseline at `gamma`, with seeds won and the corrected test's verdict, and (given `dataset`)
    the paper's relative gain beside ours."""
    parts = []
    paper = np.nan if dataset is None else paper_value_for(dataset, gamma, "gain_vs_best_baseline", "fedsteer")
    beside = "" if np.isnan(paper) else f"; the paper: {100 * paper:+.1f} %"
    for _, r in gains[np.isclose(gains["gamma"], gamma) & (gains["fedsteer"] == steer)].iterrows():
        p = r["p_holm"]
        test = "" if pd.isna(p) else (", Holm-adjusted p < 0.001" if p < 0.0005 else f", Holm-adjusted p = {p:.3f}")
        parts.append(f"with {_CONVENTION_PHRASES[r['convention']]}, {steer} ends "
                     f"{r['gain']:+.3f} ({100 * r['relative_gain']:+.1f} %{beside}) from the best of them, "
                     f"{r['best_baseline']} ({r['baseline_mean']:.3f}), winning {r['wins']} of {r['n']} seeds{test}: "
                     f"{r['verdict']}")
    return f"At γ = {gamma:g}, " + "; ".join(parts) + "." if parts else f"No paired runs at γ = {gamma:g}."


def describe_gains_by_gamma(gains: pd.DataFrame, dataset: str | None = None, runs_missing: int = 0,
                   steer: str = "FedSteer (as written)") -> str:
    """`describe_paired_gains` at every gamma of `gains` (a `paired_gains` table), the highest
    first; while `runs_missing` runs of its group are not in, a sentence saying so instead (no
    verdict from an incomplete group)."""
    if runs_missing:
        return f"Not yet: {counted(runs_missing, 'run')} of this group {'is' if runs_missing == 1 else 'are'} still being computed."
    if gains.empty:
        return "No paired runs yet."
    return " ".join(describe_paired_gains(gains, gamma, steer, dataset) for gamma in sorted(gains["gamma"].unique(), reverse=True))


# What the verdict of a paired test (`stats.tested_verdicts`, a = the claim's winner) says of a claim.
_CLAIM_WORDS = {"a higher": "holds", "a lower": "does not hold", "no clear difference": "cannot be decided here"}


def _claim_checks(per_seed: pd.DataFrame, conv: str, gamma: float, dataset: str) -> list[tuple]:
    """The paper's §4.2 accuracy claims at one gamma under one convention set, as comparisons
    (claim, a, b, factor, the paper's figure) where the claim says a > factor × b."""
    steer, avg = HEADLINE_FEDSTEER[dataset], FEDAVG_OF[conv]
    present = [b for b in BASELINE_SETS[conv] if b in per_seed]
    if steer not in per_seed or not present:
        return []
    best = per_seed[present].mean().idxmax()
    gain_best = paper_value_for(dataset, gamma, "gain_vs_best_baseline", "fedsteer")
    gain_avg = paper_value_for(dataset, gamma, "gain_vs_fedavg", "fedsteer")
    checks = []
    if gain_avg == gain_avg and avg in per_seed:
        checks.append(("FedSteer beats FedAvg", steer, avg, 1.0, f"{100 * gain_avg:+.1f} %"))
    if gain_best == gain_best:
        checks.append(("FedSteer beats the best baseline", steer, best, 1.0, f"{100 * gain_best:+.1f} %"))
        checks.append((f"… by at least the paper's {100 * gain_best:.1f} %", steer, best, 1 + gain_best,
                       f"{100 * gain_best:+.1f} %"))
    others = [b for b in present if b != avg]
    if gain_avg == gain_avg and gain_avg == gain_best and avg in per_seed and others:
        # the paper's FedAvg is its best baseline at this gamma (its two gains are the same figure)
        rival = per_seed[others].mean().idxmax()
        checks.append(("FedAvg is the best baseline", avg, rival, 1.0, "yes"))
    return checks


def setting_claims(settings: Mapping[str, pd.DataFrame], dataset: str = "fmnist",
                   metric: str = "final_accuracy") -> pd.DataFrame:
    """The paper's accuracy claims of §4.2 (FedSteer beats FedAvg, beats the best baseline, by
    at least the paper's relative gain; FedAvg is the best baseline) checked in each setting
    (`settings`: name -> `role_runs` table) under each convention set (`BASELINE_SETS`; FedStale
    at its best beta), with the headline FedSteer (`paper.HEADLINE_FEDSTEER`). One row per
    (setting, convention, gamma, claim): a and b (display names), the paper's figure, the relative
    gain (the mean of the per-seed differences a − b over b's mean; its std likewise), n, seeds where a > factor × b, the paired t-test of
    a − factor × b with Holm's adjustment over every row (one family), and the claim's verdict:
    holds / does not hold / cannot be decided here, or indicative below 5 paired seeds."""
    rows, margins = [], []
    for setting, runs in settings.items():
        for gamma, at_gamma in runs.groupby("gamma"):
            per_seed = at_best_fedstale_beta(at_gamma, metric).pivot_table(
                index="seed", columns="role", values=metric, aggfunc="first")
            for conv in BASELINE_SETS:
                for claim, a, b, factor, paper in _claim_checks(per_seed, conv, gamma, dataset):
                    both = per_seed[[a, b]].dropna()
                    diff, margin = both[a] - both[b], both[a] - factor * both[b]
                    margins.append(margin.tolist())
                    rows.append({"setting": setting, "convention": conv, "gamma": float(gamma), "claim": claim,
                                 "a": _role_name(a, at_gamma), "b": _role_name(b, at_gamma), "paper": paper,
                                 "rel_mean": float(diff.mean() / both[b].mean()),
                                 "rel_std": float(diff.std(ddof=1) / both[b].mean()) if len(diff) > 1 else np.nan,
                                 "n": int(len(both)), "wins": int((margin > 0).sum())})
    out = pd.DataFrame(rows, columns=["setting", "convention", "gamma", "claim", "a", "b", "paper", "rel_mean", "rel_std",
                                      "n", "wins"])
    tests = tested_verdicts(margins, a="a")
    out["p_holm"] = tests["p_holm"].values
    out["verdict"] = [_CLAIM_WORDS.get(w, "indicative") for w in tests["verdict"]]
    return out


def setting_claims_display(claims: pd.DataFrame, setting: str) -> pd.DataFrame:
    """`setting_claims` of one setting for reading: one row per (gamma, claim) with the paper's
    figure and, per convention set, ours (relative gain, mean ± std and n) over the verdict."""
    rows = []
    at = claims[claims["setting"] == setting]
    for (gamma, claim), both in at.groupby(["gamma", "claim"], sort=False):
        row = {"γ": f"{gamma:g}", "claim": claim, "paper": both["paper"].iloc[0]}
        for conv, name in _CONVENTION_NAMES.items():
            r = both[both["convention"] == conv]
            if r.empty:
                row[name] = "—"
                continue
            r = r.iloc[0]
            spread = "" if np.isnan(r["rel_std"]) else f" ± {100 * r['rel_std']:.1f}"
            who = f"{r['a']} vs {r['b']}: " if claim.startswith("FedAvg") or "best" in claim else ""
            row[name] = (f"{who}{100 * r['rel_mean']:+.1f}{spread} % (n = {r['n']})<br>"
                         f"<b>{r['verdict']}</b>")
        rows.append(row)
    return pd.DataFrame(rows)


def describe_setting_claims(claims: pd.DataFrame) -> str:
    """Plain words, one sentence per setting: which claim checks hold, which do not, and how many
    cannot be decided or are only indicative (fewer than 5 seeds), once for both convention
    sets where they agree, else per set."""
    if claims.empty:
        return "No claim can be checked yet."

    def outcome(rows: pd.DataFrame) -> str:
        name = lambda r: (r.claim.replace("…", "FedSteer beats the best baseline")  # noqa: E731
                          + f" at γ = {r.gamma:g}")
        holds = [name(r) for r in rows.itertuples() if r.verdict == "holds"]
        fails = [name(r) for r in rows.itertuples() if r.verdict == "does not hold"]
        open_ = int((rows["verdict"] == "cannot be decided here").sum())
        weak = int((rows["verdict"] == "indicative").sum())
        parts = [f"{len(holds)} {'holds' if len(holds) == 1 else 'hold'}" + (f" ({'; '.join(holds)})" if holds else "")]
        if fails:
            parts.append(f"{len(fails)} {'does' if len(fails) == 1 else 'do'} not hold ({'; '.join(fails)})")
        if open_:
            parts.append(f"{open_} cannot be decided")
        if weak:
            most = int(rows["n"].max())
            parts.append(f"{weak} {'is' if weak == 1 else 'are'} only indicative "
                         f"({counted(most, 'paired seed')})")
        return f"of {len(rows)} claim checks " + "; ".join(parts)

    sentences = []
    for setting, at in claims.groupby("setting", sort=False):
        by_set = {conv: outcome(rows) for conv, rows in at.groupby("convention", sort=False)}
        if len(by_set) > 1 and len(set(by_set.values())) == 1:
            sentences.append(f"{setting}, against either way of writing the baselines, {next(iter(by_set.values()))}.")
        else:
            sentences.append(f"{setting}: " + "; ".join(f"against {_CONVENTION_PHRASES[conv]}, {text}"
                                                        for conv, text in by_set.items()) + ".")
    return " ".join(sentences)


def claims_by_setting(settings: Mapping[str, tuple[str, pd.DataFrame, int | None]],
                      dataset: str = "fmnist") -> tuple[str, dict[str, object]]:
    """`setting_claims` over the settings whose runs are all in (`settings`: glue name -> (the
    setting in words, its `role_runs` table, how many of its runs are not in; None: the setting
    itself is not fixed yet)), as one Holm family. Returns `describe_setting_claims` of them and,
    per glue name, what the page shows: the setting's `setting_claims_display` (index hidden), or
    Markdown saying why it is not checked yet (no verdict from a setting whose runs are coming in)."""
    complete = {title: runs for title, runs, missing_runs in settings.values() if missing_runs == 0}
    claims = setting_claims(complete, dataset)
    shown: dict[str, object] = {}
    for name, (title, _, missing_runs) in settings.items():
        if missing_runs == 0:
            shown[name] = table_or_note(setting_claims_display(claims, title),
                                        "No claim can be checked in this setting: none of its runs pair FedSteer "
                                        "with a baseline by seed.")
        elif missing_runs is None:
            shown[name] = Markdown("Not yet: this setting is fixed only once the runs that define it are all in (see above).")
        else:
            shown[name] = Markdown(f"Not yet: {counted(missing_runs, 'run')} of this setting "
                                   f"{'is' if missing_runs == 1 else 'are'} still being computed (see above).")
    return describe_setting_claims(claims), shown


def describe_open_groups(missing_runs: Mapping[str, int]) -> str:
    """One sentence on the run groups of this chapter that are not complete (`missing_runs`:
    group's name in words -> how many of its runs are not in), or that all of them are."""
    open_ = {name: n for name, n in missing_runs.items() if n}
    if not open_:
        return "Every run of this chapter's groups is in: nothing on this page is provisional."
    listed = "; ".join(f"{name}: {counted(n, 'run')}" for name, n in open_.items())
    return (f"Still being computed: {listed}. Their rows and cells show the runs that are in, "
            "and no verdict is drawn from a group that is not complete.")
