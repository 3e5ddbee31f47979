"""The Markdown sentences the chapters display instead of typing numbers: each is built from the
tables of `tables`, `stats` and `claim_checks`, so that the text always says what the numbers say.

Used by chapter 6 (profile note, gains, metrics, collapses, main findings), chapter 7 (profile
note) and chapter 10 (the comparison with the paper, the claims, the disagreement checks, the
accuracy level of the paper's FedAvg).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .claim_checks import SUSPECTS
from .paper import DATASET_NAMES, paper_value, paper_value_for
from .stats import counted, format_pct
from .tables import gains, table1

__all__ = ["profile_note", "smoke_test_note", "gains_in_brief", "describe_gains", "describe_metrics", "describe_collapses",
           "main_findings", "describe_comparison", "describe_claims", "describe_disagreement", "accuracy_level_note",
           "describe_quoted_sources"]


def profile_note(profile, runs: pd.DataFrame) -> str:
    """A Markdown sentence on how big the runs behind a chapter are, compared with the paper's
    setting (`config.PROFILES["paper"]`); quick-profile numbers are called a smoke test."""
    from ..experiments.config import PROFILES

    paper = PROFILES["paper"]
    rounds = sorted(set(runs["rounds"])) if not runs.empty else [profile.rounds]
    seeds = sorted(set(runs["seed"])) if not runs.empty else list(profile.seeds)
    gammas = sorted(set(runs["gamma"])) if not runs.empty else list(profile.gammas)
    text = (f"**Profile `{profile.name}`**: {len(runs)} runs, {', '.join(map(str, rounds))} rounds each "
            f"(paper: {paper.rounds}), {counted(len(seeds), 'seed')} (paper: {len(paper.seeds)}), "
            f"γ ∈ {{{', '.join(f'{g:g}' for g in gammas)}}} (paper: {{{', '.join(f'{g:g}' for g in paper.gammas)}}}).")
    if profile.name != "paper" or rounds != [paper.rounds]:
        text += (" **These numbers are a smoke test of the code path, not a reproduction**: too few rounds "
                 "and seeds to say anything about the paper's claims.")
    elif len(seeds) < len(paper.seeds):
        text += (f" **A partial reproduction**: the paper's setting, but only {len(seeds)} of its "
                 f"{len(paper.seeds)} seeds so far; a difference smaller than the seed-to-seed spread "
                 "cannot be read from it yet.")
    return text


def smoke_test_note(profile) -> str:
    """'' for the paper profile; otherwise a sentence saying the numbers are a smoke test."""
    if profile.name == "paper":
        return ""
    return (f"Profile `{profile.name}`: a smoke test of the code path; none of these numbers says whether the "
            "paper reproduces.")


def _quoted_pct(value: float, template: str, missing: str) -> str:
    """The paper's relative gain `value` as a percentage in `template`, or `missing` where its
    text quotes none (NaN)."""
    return template.format(format_pct(value)) if value == value else missing


def gains_in_brief(g: pd.DataFrame) -> str:
    """One sentence per γ (largest first) for the top of a page: the headline FedSteer's final
    accuracy and its relative gain over FedAvg and over the best baseline, the paper's beside each."""
    def paper(value: float) -> str:
        return _quoted_pct(value, "paper {}", "the paper quotes none")

    text = "; ".join(f"at γ = {r['gamma']:g}, {r['method']} ends at {r['fedsteer']:.3f}: "
                     f"{format_pct(r['gain_vs_fedavg'])} over FedAvg ({paper(r['paper_gain_vs_fedavg'])}) and "
                     f"{format_pct(r['gain_vs_best_baseline'])} over the best baseline, {r['best_baseline']} "
                     f"({paper(r['paper_gain_vs_best_baseline'])})"
                     for _, r in g[g["headline"]].sort_values("gamma", ascending=False).iterrows())
    return text[0].upper() + text[1:] + "." if text else "No FedSteer run in the table."


def describe_gains(g: pd.DataFrame) -> str:
    """Markdown bullets: each headline FedSteer gain vs FedAvg and vs the best baseline, next to
    the paper's where its text quotes one."""
    lines = []
    for _, r in g[g["headline"]].iterrows():
        paper_avg, paper_best = (_quoted_pct(r[c], " (paper: {})", " (the paper quotes no number here)")
                                 for c in ("paper_gain_vs_fedavg", "paper_gain_vs_best_baseline"))
        lines.append(f"- {DATASET_NAMES.get(r['dataset'], r['dataset'])}, γ={r['gamma']:g}: {r['method']} "
                     f"{r['fedsteer']:.3f} vs FedAvg {r['fedavg']:.3f}: **{format_pct(r['gain_vs_fedavg'])}**{paper_avg}; "
                     f"vs the best baseline, {r['best_baseline']} ({r['best_baseline_mean']:.3f}): "
                     f"**{format_pct(r['gain_vs_best_baseline'])}**{paper_best}.")
    return "\n".join(lines) if lines else "No FedSteer run in the table."


def describe_metrics(runs: pd.DataFrame) -> str:
    """Markdown bullets: FedSteer's relative gain over the best baseline per γ under both metrics
    of `metric_table`, and whether the sign is the same."""
    lines = []
    per_metric = {m: gains(table1(runs, m)) for m in ("final_accuracy", "mean_last_accuracy")}
    a, b = (g[g["headline"]].set_index(["dataset", "gamma"]) if not g.empty else g for g in per_metric.values())
    if a.empty or b.empty:
        return ""
    for key in a.index.intersection(b.index):
        fa, fb = a.loc[key, "gain_vs_best_baseline"], b.loc[key, "gain_vs_best_baseline"]
        same = (fa > 0) == (fb > 0)
        lines.append(f"- γ={key[1]:g}: FedSteer vs the best baseline {format_pct(fa)} on the final round, "
                     f"{format_pct(fb)} on the mean of the last rounds"
                     + (" — same sign." if same else " — **the sign flips with the metric**."))
    return "\n".join(lines)


def describe_collapses(counts: pd.DataFrame) -> str:
    """One Markdown sentence on `collapse_counts`: how many runs stopped on a non-finite update
    and how many ended near chance, and of which methods."""
    total = int(counts["runs"].sum())

    def which(col: str) -> str:
        hit = counts[counts[col] > 0]
        return ", ".join(f"{r.method} at γ={r.gamma:g} ({getattr(r, col)}/{r.runs})" for r in hit.itertuples())

    nf, nc = int(counts["non_finite"].sum()), int(counts["near_chance"].sum())
    return (f"Of {total} runs, **{nf}** stopped on a non-finite update" + (f": {which('non_finite')}" if nf else "")
            + f"; **{nc}** ended below 1.5 × chance accuracy" + (f": {which('near_chance')}" if nc else "") + ".")


def main_findings(t1: pd.DataFrame, g: pd.DataFrame, profile) -> str:
    """Markdown bullets summarising chapter 6 from its tables: the ranking per γ, the headline
    gains next to the paper's, and every difference to a number the paper quotes."""
    lines = []
    for gamma, grp in t1.groupby("gamma", sort=True):
        ranked = grp.sort_values("mean", ascending=False)
        lines.append(f"- γ={gamma:g}, ranking by mean final accuracy: "
                     + " > ".join(f"{m} {v:.3f}" for m, v in zip(ranked["method"], ranked["mean"])) + ".")
    lines.append(describe_gains(g))
    known = t1[t1["paper"].notna()]
    for r in known.itertuples():
        lines.append(f"- {r.method} at γ={r.gamma:g}: ours {r.mean:.3f}, paper {r.paper:.3f}, "
                     f"difference **{r.diff:+.3f}**.")
    note = smoke_test_note(profile)
    if note:
        lines.append(f"- {note}")
    return "\n".join(lines)


def describe_comparison(compare: pd.DataFrame, profile=None) -> str:
    """Markdown bullets on `compare_with_paper`: how many quoted numbers we could compare, the
    range of ours − paper for accuracies and the largest gap, and every gain next to the paper's."""
    done = compare[compare["status"] == "compared"]
    acc = done[done["quantity"] == "final_accuracy"]
    lines = [f"- **{len(done)}** of the paper's {len(compare)} quoted numbers have a counterpart in our runs; "
             f"{int(compare['status'].str.startswith('not run here').sum())} belong to data sets not run here."]
    if not acc.empty:
        worst = acc.loc[acc["ours − paper"].abs().idxmax()]
        lines.append(f"- Accuracies: ours − paper ranges from {acc['ours − paper'].min():+.3f} to "
                     f"{acc['ours − paper'].max():+.3f}; the largest gap is {worst['method']} at γ={worst['γ']:g} "
                     f"({worst['ours']:.3f} vs {worst['paper']:.3f}).")
    for _, r in done[done["quantity"].str.contains("gain")].iterrows():
        where = (f"{DATASET_NAMES.get(r['data set'], r['data set'])}, γ={r['γ']:g}" if r["γ"] == r["γ"]
                 else "every setting run here")
        what = r["quantity"].replace("_", " ").capitalize().replace("fedavg", "FedAvg")
        lines.append(f"- {what} ({where}): ours {format_pct(r['ours'])}, paper {format_pct(r['paper'])}.")
    if profile is not None and smoke_test_note(profile):
        lines.append(f"- {smoke_test_note(profile)}")
    return "\n".join(lines)


def describe_claims(claims: pd.DataFrame) -> str:
    """One Markdown sentence counting the checklist: holds / does not hold / not checkable here."""
    holds = claims["holds"]
    yes = int((holds == True).sum())  # noqa: E712 (holds is an object column of True / False / None)
    no = int((holds == False).sum())  # noqa: E712
    na = int(holds.isna().sum())
    failed = "; ".join(f"{c} ({d}, γ={g:g})" if g == g else f"{c} ({d})"
                       for c, d, g in zip(claims.loc[holds == False, "claim"], claims.loc[holds == False, "data set"],  # noqa: E712
                                          claims.loc[holds == False, "γ"]))
    return (f"Of {len(claims)} claim checks, **{yes} hold**, **{no} do not**" + (f" ({failed})" if no else "")
            + f", and **{na}** cannot be decided here (data set not run, or no threshold stated).")


def describe_disagreement(checks: pd.DataFrame) -> str:
    """Markdown: what the paired checks of `disagreement_checks` say, suspect by suspect, with the
    as-written ordering's gain over the best baseline next to the paper's headline gains."""
    if checks.empty:
        return "No runs of the ordering and fair-start ablations yet: nothing to check."
    lines = []
    for suspect, grp in checks.groupby("suspect", sort=False):
        lines.append(f"\n**{suspect.capitalize()}**: {SUSPECTS[suspect]}.\n")
        for _, r in grp.iterrows():
            best = f" (the best baseline here: {r['best baseline name']})" if "best baseline" in r["comparison"] else ""
            lines.append(f"- γ={r['gamma']:g}, {r['comparison']}: {r['verdict']}; relative gain {format_pct(r['relative gain'])}{best}.")
    literal = checks[checks["comparison"] == "FedSteer (as written) vs best baseline"]
    quoted = [(r, paper_value_for(r["dataset"], r["gamma"], "gain_vs_best_baseline", "fedsteer")) for _, r in literal.iterrows()]
    quoted = [(r, paper) for r, paper in quoted if paper == paper]
    if quoted:
        lines.append("\n**Next to the paper's headline:** FedSteer's gain over the best baseline with the literal "
                     "ordering is " + "; ".join(f"{format_pct(r['relative gain'])} at γ={r['gamma']:g} (paper "
                                                f"{format_pct(paper)})" for r, paper in quoted) + ".")
    return "\n".join(lines).strip()


def accuracy_level_note(tuning: pd.DataFrame | None, dataset: str = "fmnist", gamma: float = 0.9) -> str:
    """Markdown: could the paper's FedAvg accuracy level come from the training hyperparameters?
    Compares the paper's FedAvg number with the final validation accuracy of every non-collapsed
    setting of our FedAvg-only tuning grid (`tuning`, as from `tuning_evidence`)."""
    try:
        paper = paper_value(f"{dataset}/{gamma:g}/fedavg")
    except KeyError:
        return ""
    if tuning is None or tuning.empty:
        return f"The paper's FedAvg reaches {paper:.3f} at γ={gamma:g}; our tuning runs are not computed yet."
    rows = tuning[np.isclose(tuning["gamma"], gamma) & ~tuning["collapsed"].astype(bool)]
    if rows.empty:
        return f"The paper's FedAvg reaches {paper:.3f} at γ={gamma:g}; none of our tuning runs at this γ finished."
    low, high = rows["val_accuracy_final"].min(), rows["val_accuracy_final"].max()
    weakest = rows.loc[rows["val_accuracy_final"].idxmin()]
    text = (f"The paper's FedAvg reaches **{paper:.3f}** at γ={gamma:g}. Our FedAvg-only tuning grid (validation split, "
            f"{len(rows)} settings of client learning rate and local epochs that did not diverge) ends between "
            f"**{low:.3f} and {high:.3f}** at this γ; the weakest setting (lr {weakest['client_lr']:g}, "
            f"E = {int(weakest['local_epochs'])}) is still {low - paper:+.3f} from the paper's number. ")
    if low > paper + 0.05:
        text += ("So the paper's accuracy level is not a matter of these hyperparameters: its setting must differ "
                 "from ours in something the text does not pin down (its hyperparameter table is missing and it "
                 "does not give the models' widths), and we cannot tell what from the text. The comparison that survives such a difference is the *relative* one: FedSteer against the "
                 "baselines in the same setting.")
    else:
        text += "The paper's accuracy level is within the range our hyperparameter grid produces."
    return text


def describe_quoted_sources(compare: pd.DataFrame) -> str:
    """Markdown, one numbered item per row of `tables.compare_display`: the paper's sentence the
    number comes from (section), how ours was obtained, whether it is compared, and the note."""
    from .paper import PAPER

    notes = {p.key: p.note for p in PAPER}
    lines = []
    for k, (_, r) in enumerate(compare.iterrows(), start=1):
        how = f" Ours: {r['our setting']}." if r["our setting"] else ""
        note = notes.get(r["key"], "")
        lines.append(f"{k}. {r['section']}: “{r['sentence']}”{how} {r['status'].capitalize()}."
                     + (f" Note: {note}." if note else ""))
    return "\n".join(lines)
