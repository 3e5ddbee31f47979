"""The paper's claims checked on our runs, and the paired checks of why FedSteer may lose here.

`claims_checklist` turns every claim of the paper's text (§1, §4.2, §8.2, §8.3, §8.4) into one
row per setting: the paper's value, ours, whether the claim holds on the means (None where its
data set was not run or the text states no threshold), a short name, the paper's sentence it
comes from (`source`, a key of `PAPER` or `PAPER_STATEMENTS`) and the seed-paired comparisons that
test it (`pairs`, read by `claim_verdicts`). `disagreement_checks` pairs, seed by seed, the
runs of two suspects for a disagreement with the paper (the estimator ordering and the warm-up
snapshot the stale-memory baselines lack) with the best baseline.

Used by chapter 10 (the claims checklist and "why we may disagree").
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .methods import BASELINES, ROLE_NAMES, by_role, method_specs, table_name
from .paper import CONTRIB_NOTE, HEADLINE_FEDSTEER, NUM_CLASSES, paper_value
from .stats import family_verdicts, format_pct, paired_comparison
from .tables import gains, table1

__all__ = ["claims_checklist", "SUSPECTS", "disagreement_checks"]


class _Checklist:
    """The rows of `claims_checklist` and the look-ups its claims share."""

    def __init__(self, t1: pd.DataFrame):
        self.t1 = t1
        self.g = gains(t1) if not t1.empty else pd.DataFrame()
        self.have = set(t1["dataset"]) if not t1.empty else set()
        self.rows: list[dict] = []

    def add(self, claim, dataset, gamma, paper, ours, holds, note="", *, short, source, pairs=()):
        """One row; `pairs` holds (dataset, gamma, a label, b label, factor) per comparison: the
        claim holds when a > factor × b, seed by seed on average (`claim_verdicts.claim_verdicts` tests it)."""
        self.rows.append({"claim": claim, "data set": dataset, "γ": gamma, "paper": paper, "ours": ours,
                          "holds": holds, "note": note, "short": short, "source": source, "pairs": tuple(pairs)})

    def head(self, dataset, gamma):
        """The headline FedSteer row of `gains` at (dataset, gamma), or None."""
        g = self.g
        if g.empty:
            return None
        h = g[(g["dataset"] == dataset) & np.isclose(g["gamma"], gamma) & g["headline"]]
        return h.iloc[0] if not h.empty else None

    def label(self, dataset, gamma, r):
        """The run label of Table 1's role `r` at (dataset, gamma), or None."""
        row = self.t1_row(dataset, gamma, r)
        return row["label"] if row is not None else None

    def t1_row(self, dataset, gamma, r):
        """Table 1's row of role `r` at (dataset, gamma), or None."""
        t1 = self.t1
        h = t1[(t1["dataset"] == dataset) & np.isclose(t1["gamma"], gamma) & (t1["role"] == r)] if self.have else t1
        return h.iloc[0] if not h.empty else None

    def baselines(self, dataset, gamma) -> pd.DataFrame:
        t1 = self.t1
        return t1[(t1["dataset"] == dataset) & np.isclose(t1["gamma"], gamma) & t1["role"].isin(BASELINES)]


def _fmnist_gains(c: _Checklist) -> None:
    """§4.2 and §1: FedSteer's gains on Fashion-MNIST, and at least 7.9 % in every setting."""
    for gamma, key in ((0.9, "fmnist/0.9/gain_vs_fedavg"),):
        h = c.head("fmnist", gamma)
        steer, avg = c.label("fmnist", gamma, "fedsteer"), c.label("fmnist", gamma, "fedavg")
        c.add("FedSteer beats FedAvg", "fmnist", gamma, format_pct(paper_value(key)),
              format_pct(h["gain_vs_fedavg"]) if h is not None else "not run",
              bool(h["gain_vs_fedavg"] > 0) if h is not None else None, short="beats FedAvg", source=key,
              pairs=[("fmnist", gamma, steer, avg, 1.0)] if h is not None and avg else ())
        others = c.baselines("fmnist", gamma)
        others = others[others["role"] != "fedavg"]
        rival = others.loc[others["mean"].idxmax(), "label"] if not others.empty else None
        c.add("FedAvg is the next-best method", "fmnist", gamma, "FedAvg",
              h["best_baseline"] if h is not None else "not run",
              bool(h["best_baseline"] == ROLE_NAMES["fedavg"]) if h is not None else None,
              short="FedAvg is next-best", source=key, pairs=[("fmnist", gamma, avg, rival, 1.0)] if avg and rival else ())
    for gamma, key in ((0.9, "fmnist/0.9/gain_vs_best"), (0.7, "fmnist/0.7/gain_vs_best")):
        h = c.head("fmnist", gamma)
        c.add("FedSteer beats the best baseline", "fmnist", gamma, format_pct(paper_value(key)),
              format_pct(h["gain_vs_best_baseline"]) + f" (vs {h['best_baseline']})" if h is not None else "not run",
              bool(h["gain_vs_best_baseline"] > 0) if h is not None else None, short="beats best baseline",
              source=key, pairs=[("fmnist", gamma, c.label("fmnist", gamma, "fedsteer"), h["best_baseline_label"], 1.0)]
              if h is not None else ())
    g = c.g
    if not g.empty and g["headline"].any():
        hh = g[g["headline"]]
        worst = hh.loc[hh["gain_vs_best_baseline"].idxmin()]
        least = paper_value("all/min_gain_vs_best")
        c.add("gain over the next-best method is at least 7.9 % in every setting", "all run here", np.nan,
              format_pct(least),
              f"{format_pct(worst['gain_vs_best_baseline'])} (min: {worst['dataset']}, γ={worst['gamma']:g})",
              bool(worst["gain_vs_best_baseline"] >= least), CONTRIB_NOTE,
              short=f"gain ≥ {format_pct(least, signed=False)} everywhere", source="all/min_gain_vs_best",
              pairs=[(r.dataset, r.gamma, c.label(r.dataset, r.gamma, r.role), r.best_baseline_label, 1 + least)
                     for r in hh.itertuples()])


def _second_only_to_full(c: _Checklist) -> None:
    """§8.4: at γ = 0.9 FedSteer beats every baseline and only full participation beats it."""
    for dataset in ("fmnist", "cifar10"):
        named = dict(short="second only to full", source="s84/second_only_to_full")
        if dataset not in c.have:
            c.add("FedSteer second only to full participation", dataset, 0.9, "yes", "not run", None, **named)
            continue
        steer, full = c.t1_row(dataset, 0.9, HEADLINE_FEDSTEER[dataset]), c.t1_row(dataset, 0.9, "full")
        base = c.baselines(dataset, 0.9)
        if steer is None or full is None or base.empty:
            c.add("FedSteer second only to full participation", dataset, 0.9, "yes", "not run", None, **named)
            continue
        ok = bool(steer["mean"] > base["mean"].max() and full["mean"] > steer["mean"])
        best = base.loc[base["mean"].idxmax(), "label"]
        c.add("FedSteer second only to full participation", dataset, 0.9, "yes",
              f"FedSteer {steer['mean']:.3f}, full {full['mean']:.3f}, best baseline {base['mean'].max():.3f}", ok,
              pairs=[(dataset, 0.9, steer["label"], best, 1.0), (dataset, 0.9, full["label"], steer["label"], 1.0)], **named)


def _emnist(c: _Checklist) -> None:
    """§4.2 on EMNIST at γ = 0.9: stale-memory methods no better than FedAvg, SCAFFOLD and
    FedProx collapse, FedSteer (enforce=5) nearly doubles the best baseline."""
    if "emnist" not in c.have:
        c.add("EMNIST claims (stale methods ≤ FedAvg, SCAFFOLD/FedProx collapse, FedSteer × 2)", "emnist", 0.9,
              "§4.2", "not run", None, "run the EMNIST sweep to check", short="EMNIST claims",
              source="emnist/0.9/fedsteer_enforce5")
        return
    avg = c.t1_row("emnist", 0.9, "fedavg")
    for r in ("fedvarp", "fedstale", "mifa"):
        x = c.t1_row("emnist", 0.9, r)
        ok = bool(x["mean"] <= avg["mean"] + 0.01) if x is not None and avg is not None else None
        c.add(f"{ROLE_NAMES[r]} on par with or worse than FedAvg", "emnist", 0.9,
              f"{paper_value(f'emnist/0.9/{r}'):.3f} vs {paper_value('emnist/0.9/fedavg'):.3f}",
              f"{x['mean']:.3f} vs {avg['mean']:.3f}" if x is not None and avg is not None else "not run", ok,
              "'on par': within 0.01", short=f"{ROLE_NAMES[r]} ≤ FedAvg", source=f"emnist/0.9/{r}")
    for r in ("scaffold", "fedprox"):
        x = c.t1_row("emnist", 0.9, r)
        ok = bool(x["mean"] < 1.5 / NUM_CLASSES["emnist"]) if x is not None else None
        c.add(f"{ROLE_NAMES[r]} collapses", "emnist", 0.9, f"{paper_value(f'emnist/0.9/{r}'):.3f}",
              f"{x['mean']:.3f}" if x is not None else "not run", ok, "collapse: below 1.5 × chance (1/47)",
              short=f"{ROLE_NAMES[r]} collapses", source=f"emnist/0.9/{r}")
    h = c.head("emnist", 0.9)
    h_label = c.label("emnist", 0.9, HEADLINE_FEDSTEER["emnist"])
    c.add("FedSteer (enforce=5) nearly doubles the best baseline", "emnist", 0.9,
          f"× {paper_value('emnist/0.9/fedsteer_enforce5') / paper_value('emnist/0.9/fedavg'):.2f}",
          f"× {1 + h['gain_vs_best_baseline']:.2f}" if h is not None else "not run",
          bool(1 + h["gain_vs_best_baseline"] >= 1.8) if h is not None else None, "'nearly doubling': ≥ × 1.8",
          short="× 2 the best baseline", source="emnist/0.9/fedsteer_enforce5",
          pairs=[("emnist", 0.9, h_label, h["best_baseline_label"], 1.8)] if h is not None and h_label else ())


def _subsampling(c: _Checklist, subsample: pd.DataFrame | None, sub_labels: dict) -> None:
    """§8.3, Table 3: subsampling costs about 2.5 % and still beats every baseline. `sub_labels`
    maps (dataset, gamma) to the subsampled runs' label (for the seed-paired test)."""
    if subsample is None or subsample.empty:
        return
    drop = float(subsample["drop (relative)"].mean())
    c.add("subsampling costs about 2.5 % accuracy", "+".join(sorted(set(subsample["dataset"]))), np.nan,
          format_pct(paper_value("all/subsample_drop"), signed=False), format_pct(drop, signed=False),
          None, f"relative drop; absolute {subsample['drop (points)'].mean():+.3f}; 'about' sets no threshold",
          short="subsampling costs ≈ 2.5 %", source="all/subsample_drop")
    for _, s in subsample.iterrows():
        base = c.baselines(s["dataset"], s["gamma"])
        if base.empty:
            continue
        sub = sub_labels.get((s["dataset"], float(s["gamma"])))
        c.add("subsampled FedSteer still beats every baseline", s["dataset"], s["gamma"], "yes",
              f"{s['subsampled']:.3f} vs best baseline {base['mean'].max():.3f}",
              bool(s["subsampled"] > base["mean"].max()), short="subsampled beats baselines",
              source="s83/sub_beats_baselines",
              pairs=[(s["dataset"], s["gamma"], sub, base.loc[base["mean"].idxmax(), "label"], 1.0)] if sub else ())


def _memory(c: _Checklist, memory: pd.DataFrame | None) -> None:
    """§8.2: about 10 times less server memory at |X| = 10, N = 100."""
    if memory is None or memory.empty or not memory["core_size"].notna().any():
        return
    steer = memory[memory["core_size"].notna()]
    idx = (steer["core_size"] - 10).abs().idxmin()
    ratio, k = float(steer.loc[idx, "fedvarp_over_this"]), int(steer.loc[idx, "core_size"])
    c.add("FedSteer needs about 10× less server memory (|X|=10, N=100)", "measured", np.nan, "≈ 10×",
          f"{ratio:.1f}× at |X|={k}", bool(ratio >= 5) if k == 10 else None,
          "'around 10 times': ≥ 5× at |X| = 10" if k == 10 else "not measured at |X| = 10",
          short="≈ 10× less memory", source="all/memory_reduction")


def claims_checklist(t1: pd.DataFrame, subsample: pd.DataFrame | None = None,
                     memory: pd.DataFrame | None = None, sub_runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """The paper's claims, checked on our runs. One row per (claim, setting): the paper's
    value, ours, and `holds` on the means (True / False; None where the claim's data set was not
    run or no threshold is stated), with `short`, `source` and `pairs` (see `_Checklist.add`).
    Percentages are relative gains (fractions). `subsample` is `tables.subsample_table`, `memory`
    `server_memory.run_memory_table`, `sub_runs` the subsampled runs (their labels enter `pairs`)."""
    c = _Checklist(t1)
    sub_labels = {}
    if sub_runs is not None and not sub_runs.empty:
        sub = sub_runs[[s.name == "fedsteer" and s.get("subsample") != 0 for s in method_specs(sub_runs)]]
        sub_labels = {(ds, float(g)): lab for ds, g, lab in zip(sub["dataset"], sub["gamma"], sub["label"])}
    _fmnist_gains(c)
    _second_only_to_full(c)
    _emnist(c)
    _subsampling(c, subsample, sub_labels)
    _memory(c, memory)
    return pd.DataFrame(c.rows)


SUSPECTS = {
    "estimator ordering": "the order in which Eq. 4 uses this round's updates (§2.2 read literally vs our unbiased default)",
    "warm-up information": "the warm-up snapshot of every client's update that FedSteer gets and the stale-memory baselines do not",
}


def disagreement_checks(main: pd.DataFrame, ordering: pd.DataFrame, fair_start: pd.DataFrame) -> pd.DataFrame:
    """Paired (by seed) checks of two suspects for FedSteer losing to the baselines here.

    `main` holds the Table 1 grid, `ordering` the as-written FedSteer runs and `fair_start` the
    FedVARP / MIFA runs given the warm-up snapshot (chapter 7's groups). The best baseline is
    chosen per (dataset, gamma) by mean test accuracy, as `gains` does (and the paper reports).
    One row per comparison and gamma, with the columns of `paired_comparison` and the Holm-adjusted
    p and verdict of `family_verdicts` (every check here one family) plus `suspect`,
    `best baseline` (its run label) and `best baseline name` (its name for reading).
    """
    t1 = table1(main)
    if t1.empty:
        return pd.DataFrame()
    best = gains(t1).drop_duplicates(["dataset", "gamma"]).set_index(["dataset", "gamma"])["best_baseline_label"]
    steer, avg = by_role(main, "fedsteer"), by_role(main, "fedavg")
    best_runs = main[[best.get((ds, float(g))) == lab for ds, g, lab in zip(main["dataset"], main["gamma"], main["label"])]]
    checks = [("estimator ordering", ordering, steer, "FedSteer (as written)", "FedSteer (unbiased)"),
              ("estimator ordering", ordering, avg, "FedSteer (as written)", "FedAvg"),
              ("estimator ordering", ordering, best_runs, "FedSteer (as written)", "best baseline"),
              ("estimator ordering", steer, best_runs, "FedSteer (unbiased)", "best baseline")]
    for m in ("fedvarp", "mifa"):
        warm, cold = fair_start[fair_start["method"] == m], main[main["label"] == m]
        checks += [("warm-up information", warm, cold, f"{ROLE_NAMES[m]} + warm-up", ROLE_NAMES[m]),
                   ("warm-up information", steer, warm, "FedSteer (unbiased)", f"{ROLE_NAMES[m]} + warm-up")]
    out = []
    for suspect, a, b, a_name, b_name in checks:
        if a.empty or b.empty:
            continue
        cmp = paired_comparison(a, b, a_name, b_name).rename(columns={a_name: "a", b_name: "b"})
        cmp.insert(2, "suspect", suspect)
        out.append(cmp)
    if not out:
        return pd.DataFrame()
    table = family_verdicts(pd.concat(out, ignore_index=True))
    table["best baseline"] = [best.get((ds, g)) if "best baseline" in c else None
                              for ds, g, c in zip(table["dataset"], table["gamma"], table["comparison"])]
    first = main.drop_duplicates(["dataset", "label"])
    name_of = {(ds, lab): table_name(s, ds) for ds, lab, s in zip(first["dataset"], first["label"], method_specs(first))}
    table["best baseline name"] = [name_of.get((ds, lab)) if lab is not None else None
                                   for ds, lab in zip(table["dataset"], table["best baseline"])]
    table["relative gain"] = table["a"] / table["b"] - 1
    return table
