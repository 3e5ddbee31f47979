"""The paper's claims and quoted numbers on our runs, seed by seed: the tested verdict of every
row of `claim_checks.claims_checklist`, the compact verdict table chapter 10 opens with, the
paper's sentences behind it, and the per-seed values behind every quoted number we compare.

A claim holds when each of its comparisons (`pairs`: a > factor × b) is significantly positive,
seed by seed: the paired t-test of `stats.tested_verdicts`, Holm-adjusted over every comparison
of the checklist (one family), with at least `stats.MIN_SEEDS_FOR_VERDICT` paired seeds. Fewer
seeds give "indicative"; a test that separates nothing gives "cannot be decided here".

Used by chapter 10 (the verdict table, its footnotes, the figure of our numbers against the paper's).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .methods import method_specs, table_name
from .paper import PAPER, PAPER_STATEMENTS, plain
from .stats import MIN_SEEDS_FOR_VERDICT, counted, format_pct, tested_verdicts
from .tables import NBSP, SHORT_DATASET_NAMES

__all__ = ["VERDICT_WORDS", "pair_margins", "claim_verdicts", "verdict_table", "claim_footnotes", "claim_tests_table",
           "verdict_counts", "verdict_summary", "disagreement_display", "quoted_number_seeds"]

VERDICT_WORDS = ("holds", "does not hold", "cannot be decided here", "indicative")
_SOURCES = {**{p.key: (p.section, p.quote) for p in PAPER}, **{s.key: (s.section, s.quote) for s in PAPER_STATEMENTS}}


def pair_margins(runs: pd.DataFrame, dataset: str, gamma: float, a: str, b: str, factor: float = 1.0,
                 metric: str = "final_accuracy") -> pd.DataFrame:
    """Runs of labels `a` and `b` at (dataset, gamma), paired by seed: a, b, the margin
    a − factor × b (> 0 where the claim holds on that seed) and the relative gain a / b − 1."""
    at = runs[(runs["dataset"] == dataset) & np.isclose(runs["gamma"], gamma)]
    pick = lambda lab: at[at["label"] == lab].set_index("seed")[metric]  # noqa: E731
    both = pd.concat({"a": pick(a), "b": pick(b)}, axis=1, join="inner").dropna()
    return both.assign(margin=both["a"] - factor * both["b"], relative=both["a"] / both["b"] - 1)


def _setting(dataset: str, gamma: float) -> str:
    where = "+".join(SHORT_DATASET_NAMES.get(d, d) for d in str(dataset).split("+"))
    return f"{where}, γ={gamma:g}" if gamma == gamma else where


def _row_verdict(row: pd.Series, words: list[str]) -> tuple[str, str]:
    """(verdict word, why) of one checklist row from the tested words of its pairs."""
    if not words:
        if row["holds"] is None or row["holds"] != row["holds"]:
            why = "its setting is not run here" if row["ours"] == "not run" else "the paper states no threshold"
            return "cannot be decided here", why
        if row["data set"] == "measured":
            return ("holds" if row["holds"] else "does not hold"), "a measurement with no seed-to-seed spread"
        return "indicative", "compared on the means only (no paired runs)"
    if any(w.startswith("indicative") for w in words):
        return "indicative", f"fewer than {MIN_SEEDS_FOR_VERDICT} paired seeds"
    if all(w == "a higher" for w in words):
        return "holds", "every comparison is significantly positive (Holm-adjusted p < 0.05)"
    if any(w == "a lower" for w in words):
        return "does not hold", "a comparison is significantly negative (Holm-adjusted p < 0.05)"
    return "cannot be decided here", "the paired test separates no difference from noise"


def _summary(margin: tuple, test: pd.Series, name: dict) -> dict:
    """One comparison of a claim for reading: who against whom, where, and what the test says."""
    a, b, factor, dataset, gamma, m = margin
    return {"a": name.get((dataset, a), a), "b": name.get((dataset, b), b), "factor": factor, "dataset": dataset,
            "gamma": gamma, "n": len(m), "rel_mean": float(m["relative"].mean()),
            "rel_std": float(m["relative"].std(ddof=1)) if len(m) > 1 else np.nan,
            "wins": int((m["margin"] > 0).sum()), "p_holm": float(test["p_holm"]), "word": test["verdict"]}


def claim_verdicts(claims: pd.DataFrame, runs: pd.DataFrame, metric: str = "final_accuracy") -> pd.DataFrame:
    """`claims` (`claims_checklist`) with the tested verdict of each row: `verdict` (one of
    `VERDICT_WORDS`), `why`, and for the binding comparison (the smallest mean margin relative to
    b) the per-seed relative gain `rel_mean`, `rel_std`, `n` and its Holm-adjusted `p_holm`;
    `tests` lists every comparison of the row as a dict (a, b, factor, dataset, gamma, n, rel_mean,
    rel_std, wins, p_holm, word), a and b by their names for reading (`methods.table_name`).
    `runs` holds every run the pairs name (Table 1's and the subsampled ones)."""
    margins, owner = [], []
    for i, row in claims.iterrows():
        for dataset, gamma, a, b, factor in row["pairs"]:
            m = pair_margins(runs, dataset, gamma, a, b, factor, metric) if a and b else pd.DataFrame()
            if not m.empty:
                margins.append((a, b, factor, dataset, gamma, m))
                owner.append(i)
    tests = tested_verdicts([m["margin"].tolist() for *_, m in margins], a="a")
    first = runs.drop_duplicates(["dataset", "label"])
    name = {(ds, lab): table_name(s, ds) for ds, lab, s in zip(first["dataset"], first["label"], method_specs(first))}
    out = []
    for i, row in claims.iterrows():
        mine = [j for j, o in enumerate(owner) if o == i]
        verdict, why = _row_verdict(row, [tests.loc[j, "verdict"] for j in mine])
        summary = [_summary(margins[j], tests.loc[j], name) for j in mine]
        bind = min(mine, key=lambda j: float((margins[j][-1]["margin"] / margins[j][-1]["b"]).mean())) if mine else None
        rel = margins[bind][-1]["relative"] if bind is not None else pd.Series(dtype=float)
        out.append({**row.to_dict(), "verdict": verdict, "why": why, "n": len(rel),
                    "rel_mean": float(rel.mean()) if len(rel) else np.nan,
                    "rel_std": float(rel.std(ddof=1)) if len(rel) > 1 else np.nan,
                    "p_holm": float(tests.loc[bind, "p_holm"]) if bind is not None else np.nan, "tests": summary})
    return pd.DataFrame(out)


def _ours(r: pd.Series) -> str:
    if r["n"]:
        spread = f" ± {100 * r['rel_std']:.1f}" if r["rel_std"] == r["rel_std"] else ""
        return f"{100 * r['rel_mean']:+.1f}{spread} % (n={r['n']})"
    return str(r["ours"]).split(" (")[0]


def verdict_table(verdicts: pd.DataFrame, links: dict[str, str], default_link: str) -> pd.DataFrame:
    """`claim_verdicts` for reading, one short row per claim: number (the footnote's), claim,
    setting, the paper's figure, ours (per-seed relative gain mean ± std and n, or the measured
    value), verdict, and an HTML link to the evidence (`links[source]`, else `default_link`); a
    number never split from its '%' (`tables.NBSP`)."""
    rows = []
    for k, (_, r) in enumerate(verdicts.iterrows(), start=1):
        href = links.get(r["source"], default_link)
        rows.append({"#": str(k), "claim": r["short"], "setting": _setting(r["data set"], r["γ"]),
                     "paper": r["paper"].replace(" %", NBSP + "%"), "ours (mean ± std, n)": _ours(r).replace(" %", NBSP + "%"),
                     "verdict": r["verdict"], "evidence": f'<a href="{href}">§</a>'})
    return pd.DataFrame(rows)


def _comparison(t: dict) -> str:
    times = "" if t["factor"] == 1 else f"{t['factor']:g} × "
    return f"{t['a']} vs {times}{t['b']}"


def _pair_text(t: dict) -> str:
    test = f"Holm-adjusted p = {t['p_holm']:.3f}" if t["p_holm"] == t["p_holm"] else "untested"
    return (f"{_comparison(t)} ({_setting(t['dataset'], t['gamma'])}): {format_pct(t['rel_mean'])} over "
            f"{counted(t['n'], 'seed')}, {test}")


def claim_footnotes(verdicts: pd.DataFrame) -> str:
    """Markdown, one numbered item per row of `verdict_table`: the claim in full, the paper's
    sentence (section), each paired comparison with its mean relative gain, seeds and
    Holm-adjusted p, why the verdict is what it is, and the row's note."""
    lines = []
    for k, (_, r) in enumerate(verdicts.iterrows(), start=1):
        section, quote = _SOURCES.get(r["source"], ("", ""))
        tests = "; ".join(_pair_text(t) for t in r["tests"])
        text = (f"{k}. **{r['claim']}** ({_setting(r['data set'], r['γ'])}). {section}: “{plain(quote)}” "
                + (f"Ours: {tests}. " if tests else f"Ours: {r['ours']}. ")
                + f"**{r['verdict'].capitalize()}**: {r['why']}."
                + (f" {r['note'][0].upper()}{r['note'][1:]}." if r["note"] else ""))
        lines.append(text)
    return "\n".join(lines)


def claim_tests_table(verdicts: pd.DataFrame) -> pd.DataFrame:
    """Every paired comparison behind the verdicts, for reading: the claim's number (as in
    `verdict_table`), the comparison (a vs factor × b), setting, a's relative gain over
    b per seed (mean ± std), seeds where a > factor × b, the Holm-adjusted p and the test's word."""
    rows = []
    for k, (_, r) in enumerate(verdicts.iterrows(), start=1):
        for t in r["tests"]:
            spread = f" ± {100 * t['rel_std']:.1f}" if t["rel_std"] == t["rel_std"] else ""
            rows.append({"#": str(k), "comparison": _comparison(t), "setting": _setting(t["dataset"], t["gamma"]),
                         "a / b − 1": f"{100 * t['rel_mean']:+.1f}{spread} %", "seeds won": f"{t['wins']} of {t['n']}",
                         "p (Holm)": f"{t['p_holm']:.3f}" if t["p_holm"] == t["p_holm"] else "—",
                         "test": t["word"].replace("a higher", "a > factor × b").replace("a lower", "a < factor × b")})
    return pd.DataFrame(rows)


def verdict_counts(verdicts: pd.DataFrame) -> dict[str, int]:
    """How many claims get each word of `VERDICT_WORDS` (zeros included)."""
    return {w: int((verdicts["verdict"] == w).sum()) for w in VERDICT_WORDS}


def verdict_summary(verdicts: pd.DataFrame) -> str:
    """One plain sentence: how many of the checked claims get each verdict word."""
    counts = verdict_counts(verdicts)
    parts = [f"{n} {'holds' if n == 1 else 'hold'}" if w == "holds" else
             f"{n} {'does' if n == 1 else 'do'} not hold" if w == "does not hold" else
             f"{n} cannot be decided here" if w == "cannot be decided here" else
             f"{n} {'is' if n == 1 else 'are'} only indicative" for w, n in counts.items()]
    return f"Of the {len(verdicts)} claim checks, " + ", ".join(parts[:-1]) + f" and {parts[-1]}."


def disagreement_display(checks: pd.DataFrame) -> pd.DataFrame:
    """`claim_checks.disagreement_checks` for reading: γ, the comparison, seeds, the paired
    difference ± its standard error, seeds won and the relative gain (no index)."""
    if checks.empty:
        return pd.DataFrame()
    se = checks["s.e."].map(lambda v: f" ± {v:.3f}" if v == v else "")
    return pd.DataFrame({"γ": checks["gamma"].map(lambda g: f"{g:g}"), "comparison": checks["comparison"],
                         "n": checks["n"].astype(str),
                         "difference ± s.e.": [f"{d:+.3f}{e}" for d, e in zip(checks["difference"], se)],
                         "seeds won": checks["wins"], "relative": checks["relative gain"].map(format_pct)})


def quoted_number_seeds(compare: pd.DataFrame, t1: pd.DataFrame, gains: pd.DataFrame, runs: pd.DataFrame,
                        metric: str = "final_accuracy") -> pd.DataFrame:
    """Per-seed values behind every compared accuracy and gain of `tables.compare_with_paper`
    (`runs` holds Table 1's runs): one row per (key, seed) with `value` (an accuracy, or a
    relative gain a / b − 1 paired by seed), `kind` ("accuracy" / "gain"), `what` (a short name)
    and the paper's number. The minimum gain takes the seeds of the setting where it is reached."""
    rec = {p.key: p for p in PAPER}
    label = {(d, round(float(g), 6), r): lab for d, g, r, lab in zip(t1["dataset"], t1["gamma"], t1["role"], t1["label"])}
    head = gains[gains["headline"]] if not gains.empty else gains
    rows = []
    for _, c in compare[compare["status"] == "compared"].iterrows():
        p = rec[c["key"]]
        if p.quantity == "min_gain_vs_best_baseline" and not head.empty:
            w = head.loc[head["gain_vs_best_baseline"].idxmin()]
            ds, g, b = w["dataset"], w["gamma"], w["best_baseline_label"]
            a = label.get((ds, round(float(g), 6), w["role"]))
        elif p.quantity in ("gain_vs_fedavg", "gain_vs_best_baseline"):
            ds, g, a = p.dataset, p.gamma, label.get((p.dataset, p.gamma, p.role))
            hit = head[(head["dataset"] == ds) & np.isclose(head["gamma"], g)]
            b = label.get((ds, g, "fedavg")) if p.quantity == "gain_vs_fedavg" else (
                hit["best_baseline_label"].iloc[0] if not hit.empty else None)
        elif p.quantity == "final_accuracy":
            ds, g, a, b = p.dataset, p.gamma, label.get((p.dataset, p.gamma, p.role)), None
        else:
            continue
        what = (c["method"] + f", γ={g:g}") if p.quantity == "final_accuracy" else (
            {"gain_vs_fedavg": "vs FedAvg", "gain_vs_best_baseline": "vs best baseline",
             "min_gain_vs_best_baseline": "min vs best"}[p.quantity] + f", γ={g:g}")
        if b is None:
            at = runs[(runs["dataset"] == ds) & np.isclose(runs["gamma"], g) & (runs["label"] == a)]
            values = at.set_index("seed")[metric].dropna()
        else:
            values = pair_margins(runs, ds, g, a, b, 1.0, metric)["relative"]
        rows += [{"key": p.key, "kind": "accuracy" if b is None else "gain", "what": what, "seed": s,
                  "value": float(v), "paper": p.value} for s, v in values.items()]
    return pd.DataFrame(rows, columns=["key", "kind", "what", "seed", "value", "paper"])
