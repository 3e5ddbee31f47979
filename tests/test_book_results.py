"""The result tables of fedsteer_lib.book (paper, stats, tables, claim_checks, prose, plan,
server_memory) on small hand-made tables: every number checked against a hand computation."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from fedsteer_lib.book import claim_checks, claim_verdicts, methods, paper, plan, prose, server_memory, stats, tables
from fedsteer_lib.experiments.config import method
from fedsteer_lib.experiments.results import METHOD_PARAMETERS, method_columns

# The methods of the hand-made tables below, by run label (`MethodSpec.label`).
SPECS = {m.label: m for m in [
    method("full"), method("fedsteer"), method("fedsteer", refresh_every=5), method("fedavg"),
    method("fedavg_unbiased"), method("fedvarp"), *[method("fedstale", beta=b) for b in (0.5, 0.6, 0.7, 0.8, 0.9)],
    method("mifa"), method("scaffold"), method("fedprox"), method("fedsteer", core_size=10),
    method("fedsteer", core_size=10, refresh_every=5), method("fedsteer", ordering="as_written"),
    method("fedsteer", subsample=20), method("fedvarp", warmup_cycles=5), method("mifa", warmup_cycles=5),
    method("fedsteer", core_size=20), method("fedsteer", core_size=5, warmup_cycles=2),
    method("fedsteer", warmup_cycles=2)]}


def method_cols(label: str) -> dict:
    """The method columns of a run (as `results.runs_table` has them) for one of the labels above."""
    spec = SPECS[label]
    return {"method": spec.name, "label": label, **method_columns(spec)}


def as_method(runs: pd.DataFrame, label: str, **changes) -> pd.DataFrame:
    """`runs` as runs of another method (its label and method columns), with `changes`."""
    return runs.assign(**method_cols(label), **changes)


# Hand-made final accuracies (dataset fmnist, two seeds, two gammas), keyed by run label.
ACC = {
    0.9: {"full": (0.80, 0.82), "fedsteer": (0.60, 0.62), "fedsteer(refresh_every=5)": (0.58, 0.56),
          "fedavg": (0.50, 0.54), "fedavg_unbiased": (0.40, 0.44), "fedvarp": (0.45, 0.47),
          "fedstale(beta=0.5)": (0.48, 0.50), "fedstale(beta=0.6)": (0.50, 0.52), "fedstale": (0.30, 0.32),
          "fedstale(beta=0.8)": (0.20, 0.22), "fedstale(beta=0.9)": (0.10, 0.12), "mifa": (0.35, 0.37),
          "scaffold": (0.11, 0.12), "fedprox": (0.09, float("nan"))},
    0.7: {"full": (0.85, 0.85), "fedsteer": (0.70, 0.72), "fedsteer(refresh_every=5)": (0.69, 0.69),
          "fedavg": (0.66, 0.68), "fedavg_unbiased": (0.60, 0.60), "fedvarp": (0.73, 0.75),
          "fedstale(beta=0.5)": (0.60, 0.60), "fedstale(beta=0.6)": (0.60, 0.60), "fedstale": (0.61, 0.61),
          "fedstale(beta=0.8)": (0.62, 0.62), "fedstale(beta=0.9)": (0.63, 0.63), "mifa": (0.60, 0.60),
          "scaffold": (0.60, 0.60), "fedprox": (0.60, 0.60)},
}


def make_runs(acc=ACC, dataset="fmnist") -> pd.DataFrame:
    rows = []
    for gamma, table in acc.items():
        for label, values in table.items():
            for seed, a in enumerate(values):
                rows.append({"dataset": dataset, **method_cols(label), "gamma": gamma, "seed": seed,
                             "final_accuracy": a, "collapsed": a != a, "server_memory_bytes": 0})
    return pd.DataFrame(rows)


def memory_runs(rows) -> pd.DataFrame:
    """A runs table with only the columns `server_memory.run_memory_table` reads: (label, bytes) pairs."""
    return pd.DataFrame([{**method_cols(label), "server_memory_bytes": b} for label, b in rows])


@pytest.fixture
def runs():
    return make_runs()


@pytest.fixture
def t1(runs):
    return tables.table1(runs)


# ------------------------------------------------------------------------------ the paper
def test_paper_records_are_consistent():
    keys = [p.key for p in paper.PAPER]
    assert len(keys) == len(set(keys))
    for p in paper.PAPER:
        assert p.text in p.quote, p.key
        number = float(p.text.rstrip("%"))
        assert math.isclose(p.value, number / 100 if p.text.endswith("%") else number), p.key
        assert p.role is None or p.role in methods.ROLES
    # the paper's own arithmetic: 0.554 vs 0.509 is +8.8 % relative
    gain = paper.paper_value("fmnist/0.9/fedsteer") / paper.paper_value("fmnist/0.9/fedavg") - 1
    assert round(gain, 3) == paper.paper_value("fmnist/0.9/gain_vs_fedavg")
    assert paper.paper_value("emnist/0.9/fedsteer_enforce5") == 0.620
    assert paper.paper_value("emnist/0.9/scaffold") == 0.048
    with pytest.raises(KeyError):
        paper.paper_value("no/such/key")


def test_every_quoted_accuracy_is_recorded():
    quoted = {"0.554", "0.509", "0.281", "0.309", "0.243", "0.314", "0.048", "0.051", "0.620", "0.622", "0.660"}
    recorded = {p.text for p in paper.PAPER if p.quantity == "final_accuracy"}
    assert quoted == recorded


def test_plain_removes_tex():
    s = paper.plain(r"On EMNIST (\(\gamma=0.9\)), size \(|\mathcal{X}| \le 30\) and Table" + "\u00a0" + "3")
    assert s == "On EMNIST (γ=0.9), size |X| ≤ 30 and Table 3"
    table = paper.paper_table()
    assert not table["sentence"].str.contains(r"\\\(|\\\)", regex=True).any()
    assert set(paper.paper_table(datasets=["emnist"])["data set"]) == {"emnist"}
    assert len(paper.paper_table(datasets=["cifar10"])) == 2


# ------------------------------------------------------------------------------ Table 1
def test_table1_means_std_and_best_beta(t1):
    row = t1[(t1["gamma"] == 0.9) & (t1["role"] == "fedsteer")].iloc[0]
    assert row["mean"] == pytest.approx(0.61)
    assert row["std"] == pytest.approx(np.std([0.60, 0.62], ddof=1))
    assert row["n"] == 2
    assert row["paper"] == 0.554 and row["diff"] == pytest.approx(0.61 - 0.554)
    stale9 = t1[(t1["gamma"] == 0.9) & (t1["role"] == "fedstale")].iloc[0]
    assert stale9["label"] == "fedstale(beta=0.6)" and stale9["mean"] == pytest.approx(0.51)
    assert bool(stale9["selected_by_test"]) and "test accuracy" in stale9["note"]
    stale7 = t1[(t1["gamma"] == 0.7) & (t1["role"] == "fedstale")].iloc[0]
    assert stale7["label"] == "fedstale(beta=0.9)"
    # one row per role and gamma, in ROLES order; no paper number at γ=0.7
    assert list(t1[t1["gamma"] == 0.9]["role"]) == list(methods.ROLES)
    assert t1[t1["gamma"] == 0.7]["paper"].isna().all()
    # FedProx at 0.9 has one finite seed of two and one collapse
    prox = t1[(t1["gamma"] == 0.9) & (t1["role"] == "fedprox")].iloc[0]
    assert prox["n"] == 1 and prox["collapsed"] == 1


def test_table1_single_seed_has_no_interval_and_reads_well():
    one = make_runs({0.9: {k: v[:1] for k, v in ACC[0.9].items()}})
    t = tables.table1(one)
    assert t["std"].isna().all() and t["ci"].isna().all()
    shown = tables.table1_reading(t).set_index("method")
    assert list(shown.columns) == ["γ = 0.9: ours (n = 1)", "γ = 0.9: paper"]
    assert shown.loc["FedSteer", "γ = 0.9: ours (n = 1)"] == "0.600"
    assert shown.loc["FedSteer", "γ = 0.9: paper"] == "0.554"
    assert shown.loc["FedVARP", "γ = 0.9: paper"] == "—"
    assert shown.loc["FedStale (best β)", "γ = 0.9: ours (n = 1)"] == "0.500 (β = 0.6)"
    assert list(shown.index)[:2] == ["Full participation", "FedSteer"]


def test_table1_reading_gives_the_95_interval_and_counts_collapsed_runs():
    from fedsteer_lib.book.stats import t_critical

    rows = [{"dataset": "fmnist", "gamma": 0.9, "seed": s, "label": "scaffold", "method": "scaffold",
             "final_accuracy": a, "collapsed": c} for s, (a, c) in enumerate([(0.1, True), (0.7, False), (0.8, False)])]
    runs = pd.DataFrame(rows)
    for k in METHOD_PARAMETERS:
        runs[k] = None
    t = tables.table1(runs)
    row = t.iloc[0]
    half = t_critical(2) * np.std([0.1, 0.7, 0.8], ddof=1) / np.sqrt(3)
    assert row["mean"] == pytest.approx(1.6 / 3) and row["collapsed"] == 1 and row["ci"] == pytest.approx(half)
    cell = tables.table1_reading(t).set_index("method").loc["SCAFFOLD", "γ = 0.9: ours (n = 3)"]
    assert cell == f"0.533 ± {half:.3f}; 1 of 3 collapsed"


def test_table1_rejects_two_labels_for_one_role(runs):
    extra = as_method(runs[runs["label"] == "fedsteer"], "fedsteer(warmup_cycles=2)")
    dup = pd.concat([runs, extra])
    with pytest.raises(ValueError, match="fedsteer"):
        tables.table1(dup)


def test_table1_ignores_variants_outside_table1(runs):
    variant = as_method(runs[runs["label"] == "fedsteer"], "fedsteer(ordering=as_written)", final_accuracy=0.99)
    t = tables.table1(pd.concat([runs, variant]))
    assert t[(t["gamma"] == 0.9) & (t["role"] == "fedsteer")]["mean"].iloc[0] == pytest.approx(0.61)


# ------------------------------------------------------------------------------ gains
def test_gains(t1):
    g = tables.gains(t1)
    r9 = g[(g["gamma"] == 0.9) & (g["role"] == "fedsteer")].iloc[0]
    assert r9["gain_vs_fedavg"] == pytest.approx(0.61 / 0.52 - 1)
    # best baseline at 0.9: FedAvg 0.52 (FedStale's best β gives 0.51, FedVARP 0.46)
    assert r9["best_baseline"] == "FedAvg"
    assert r9["paper_gain_vs_fedavg"] == 0.088 and bool(r9["headline"])
    r7 = g[(g["gamma"] == 0.7) & (g["role"] == "fedsteer")].iloc[0]
    assert r7["best_baseline"] == "FedVARP"  # full participation is not a baseline
    assert r7["gain_vs_best_baseline"] == pytest.approx(0.71 / 0.74 - 1)
    assert r7["paper_gain_vs_best_baseline"] == 0.078
    e5 = g[(g["gamma"] == 0.9) & (g["role"] == "fedsteer_enforce5")].iloc[0]
    assert not bool(e5["headline"]) and np.isnan(e5["paper_gain_vs_fedavg"])
    brief = prose.gains_in_brief(g)  # the top of chapter 6: the headline FedSteer, gamma 0.9 first
    assert brief.startswith(f"At γ = 0.9, FedSteer ends at 0.610: {100 * (0.61 / 0.52 - 1):+.1f} % over FedAvg (paper +8.8 %)")
    assert "; at γ = 0.7, FedSteer ends at 0.710: " in brief and "over the best baseline, FedVARP (paper +7.8 %)." in brief
    assert prose.gains_in_brief(g.iloc[0:0]) == "No FedSteer run in the table."


def test_collapse_counts(runs):
    c = stats.collapse_counts(runs)
    prox = c[(c["gamma"] == 0.9) & (c["label"] == "fedprox")].iloc[0]
    assert (prox["runs"], prox["non_finite"], prox["near_chance"]) == (2, 1, 2)  # 0.09 < 0.15 and NaN
    scaf = c[(c["gamma"] == 0.9) & (c["label"] == "scaffold")].iloc[0]
    assert scaf["near_chance"] == 2  # 0.11, 0.12 < 1.5 / 10
    assert c[(c["gamma"] == 0.7)]["near_chance"].sum() == 0
    assert stats.collapse_counts(runs, chance_factor=1.0).query("gamma == 0.9 and label == 'scaffold'")["near_chance"].iloc[0] == 0


# ------------------------------------------------------------------------------ vs the paper
def test_compare_with_paper(t1, runs):
    sub = tables.subsample_table(runs, as_method(runs[runs["label"] == "fedsteer"], "fedsteer(subsample=20)",
                                                 final_accuracy=lambda d: d["final_accuracy"] - 0.06))
    mem = server_memory.run_memory_table(memory_runs([("fedvarp", 1000), ("fedsteer(core_size=10)", 100),
                                                      ("fedsteer", 250)]))
    c = tables.compare_with_paper(t1, subsample=sub, memory=mem).set_index("key")
    assert c.loc["fmnist/0.9/fedsteer", "ours"] == pytest.approx(0.61)
    assert c.loc["fmnist/0.9/fedsteer", "ours − paper"] == pytest.approx(0.61 - 0.554)
    assert c.loc["fmnist/0.9/fedsteer", "status"] == "compared"
    assert c.loc["fmnist/0.7/gain_vs_best", "ours"] == pytest.approx(0.71 / 0.74 - 1)
    assert c.loc["emnist/0.9/fedsteer_enforce5", "status"].startswith("not run here")
    assert np.isnan(c.loc["emnist/0.9/fedsteer_enforce5", "ours"])
    assert c.loc["all/min_gain_vs_best", "ours"] == pytest.approx(min(0.61 / 0.52 - 1, 0.71 / 0.74 - 1))
    assert c.loc["all/subsample_drop", "ours"] == pytest.approx(np.mean([0.06 / 0.61, 0.06 / 0.71]))
    assert c.loc["all/memory_reduction", "ours"] == pytest.approx(10.0)
    assert "|X|=10" in c.loc["all/memory_reduction", "our setting"]
    assert len(c) == len(paper.PAPER)


def test_subsample_table_pairs_by_seed(runs):
    steer = runs[runs["label"] == "fedsteer"]
    sub = as_method(steer, "fedsteer(subsample=20)", final_accuracy=[0.5, 0.62, 0.7, 0.72])
    t = tables.subsample_table(runs, sub).set_index("gamma")
    assert t.loc[0.9, "drop (points)"] == pytest.approx(np.mean([0.10, 0.0]))
    assert t.loc[0.9, "drop (relative)"] == pytest.approx((0.61 - 0.56) / 0.61)
    assert t.loc[0.7, "drop (points)"] == pytest.approx(0.0)
    assert t.loc[0.9, "n"] == 2


def test_memory_table_ratio():
    m = server_memory.run_memory_table(memory_runs([("fedavg", 0), ("fedvarp", 4 * 2**20),
                                                    ("fedsteer(core_size=20)", 2**20)])).set_index("label")
    assert m.loc["fedsteer(core_size=20)", "fedvarp_over_this"] == pytest.approx(4.0)
    assert m.loc["fedsteer(core_size=20)", "core_size"] == 20
    assert np.isnan(m.loc["fedavg", "fedvarp_over_this"]) and np.isnan(m.loc["fedavg", "core_size"])
    assert m.loc["fedvarp", "MiB"] == pytest.approx(4.0)


# ------------------------------------------------------------------------------ ablations
def test_paired_comparison(runs):
    a = runs[runs["label"] == "fedsteer"]
    b = runs[runs["label"] == "fedsteer(refresh_every=5)"]
    p = stats.paired_comparison(a, b, "default", "enforce=5").set_index("gamma")
    assert p.loc[0.9, "difference"] == pytest.approx(np.mean([0.02, 0.06]))
    assert p.loc[0.9, "s.e."] == pytest.approx(np.std([0.02, 0.06], ddof=1) / math.sqrt(2))
    assert p.loc[0.9, "wins"] == "2/2"
    assert p.loc[0.9, "default"] == pytest.approx(0.61)
    assert p.loc[0.7, "difference"] == pytest.approx(0.02)
    # a seed missing on one side is not paired
    p1 = stats.paired_comparison(a[a["seed"] == 0], b, "default", "enforce=5")
    assert set(p1["n"]) == {1} and p1["s.e."].isna().all()


# ------------------------------------------------------------------------------ claims
def test_claims_checklist(t1, runs):
    sub = tables.subsample_table(runs, as_method(runs[runs["label"] == "fedsteer"], "fedsteer(subsample=20)",
                                                 final_accuracy=lambda d: d["final_accuracy"] - 0.2))
    c = claim_checks.claims_checklist(t1, subsample=sub)
    def get(claim, gamma=None):
        sel = c[(c["claim"] == claim) & c["data set"].isin(["fmnist", "all run here"])]
        if gamma is not None:
            sel = sel[np.isclose(sel["γ"], gamma)]
        assert len(sel) == 1, claim
        return sel.iloc[0]
    assert get("FedSteer beats FedAvg", 0.9)["holds"] is True
    assert get("FedSteer beats FedAvg", 0.9)["ours"] == stats.format_pct(0.61 / 0.52 - 1)
    assert get("FedAvg is the next-best method", 0.9)["holds"] is True
    assert get("FedSteer beats the best baseline", 0.7)["holds"] is False  # FedVARP 0.74 > 0.71
    assert get("gain over the next-best method is at least 7.9 % in every setting")["holds"] is False
    assert get("FedSteer second only to full participation", 0.9)["holds"] is True
    assert c[(c["claim"] == "FedSteer second only to full participation") & (c["data set"] == "cifar10")]["holds"].iloc[0] is None
    assert c[c["data set"] == "emnist"]["holds"].isna().all()
    # subsampled 0.41 at γ=0.9 is below the best baseline 0.52; 0.51 at γ=0.7 below 0.74
    beats = c[c["claim"] == "subsampled FedSteer still beats every baseline"]
    assert list(beats["holds"]) == [False, False]


def test_claims_checklist_emnist():
    acc = {0.9: {"fedavg": (0.31,), "fedvarp": (0.28,), "fedstale(beta=0.5)": (0.30,), "mifa": (0.33,),
                 "scaffold": (0.02,), "fedprox": (0.10,), "fedsteer(core_size=10)": (0.5,),
                 "fedsteer(core_size=10, refresh_every=5)": (0.62,), "full": (0.8,)}}
    c = claim_checks.claims_checklist(tables.table1(make_runs(acc, dataset="emnist")))
    holds = dict(zip(c["claim"], c["holds"]))
    assert holds["FedVARP on par with or worse than FedAvg"] is True
    assert holds["MIFA on par with or worse than FedAvg"] is False  # 0.33 > 0.31 + 0.01
    assert holds["SCAFFOLD collapses"] is True
    assert holds["FedProx collapses"] is False  # 0.10 > 1.5 / 47
    assert holds["FedSteer (enforce=5) nearly doubles the best baseline"] is True  # 0.62 / 0.31 = 2.0


def test_counted():
    assert [stats.counted(n, "seed") for n in (0, 1, 3)] == ["0 seeds", "1 seed", "3 seeds"]


def test_format_pct():
    assert stats.format_pct(0.088) == "+8.8 %"
    assert stats.format_pct(-0.0123) == "-1.2 %"
    assert stats.format_pct(0.025, signed=False) == "2.5 %"
    assert stats.format_pct(float("nan")) == "—"


# ------------------------------------------------------------------------------ configs
def test_configs_follow_the_book_seeds():
    from fedsteer_lib.book import setup

    book = setup("quick", "fmnist", seeds=(3, 4))
    main = plan.main_configs(book)
    assert {c.seed for c in main} == {3, 4} and len(main) == 14 * 2
    stale = plan.main_configs(book, roles=["fedstale"])
    assert len(stale) == 5 * 2 and {c.method.name for c in stale} == {"fedstale"}
    abl = plan.ablation_configs(book)
    assert {c.seed for c in abl["coreset_lambda"]} == {3}  # quick: ablation_seeds = 1
    assert {c.seed for c in abl["subsampled"]} == {3, 4}
    assert len(abl["fair_start"]) == 2 * 2
    default = plan.ablation_configs(setup("quick", "fmnist"))
    assert {c.seed for c in default["ordering"]} == {0}
    assert re.search("emnist", plan.SWEEP_COMMAND.format(dataset="emnist"))


def test_memory_names():
    m = server_memory.run_memory_table(memory_runs([("fedsteer(core_size=5, warmup_cycles=2)", 10)]))
    assert m["method"].iloc[0] == "FedSteer (|X|=5)"
    assert m["label"].iloc[0] == "fedsteer(core_size=5)"  # the label for reading (methods.clean_label)


def test_describe_comparison_and_claims(t1):
    from fedsteer_lib.experiments.config import PROFILES

    text = prose.describe_comparison(tables.compare_with_paper(t1), PROFILES["quick"])
    assert "**6** of the paper's 17 quoted numbers" in text  # 2 accuracies + 3 gains + the minimum gain
    assert "from +0.011 to +0.056" in text and "FedSteer at γ=0.9 (0.610 vs 0.554)" in text
    assert "smoke test" in text
    assert "smoke test" not in prose.describe_comparison(tables.compare_with_paper(t1), PROFILES["paper"])
    claims = claim_checks.claims_checklist(t1)
    summary = prose.describe_claims(claims)
    n_true = int((claims["holds"] == True).sum())  # noqa: E712
    assert f"**{n_true} hold**" in summary and f"Of {len(claims)} claim checks" in summary


def test_profile_note_calls_few_seeds_of_the_paper_setting_partial():
    from dataclasses import replace

    from fedsteer_lib.experiments.config import PROFILES

    paper = PROFILES["paper"]
    runs = pd.DataFrame({"rounds": [150, 150], "seed": [0, 0], "gamma": [0.7, 0.9]})
    text = prose.profile_note(replace(paper, seeds=(0,)), runs)
    assert "partial reproduction" in text and "1 of its 8 seeds" in text and "smoke test" not in text
    assert "smoke test" in prose.profile_note(PROFILES["quick"], runs.assign(rounds=10))
    full = pd.DataFrame({"rounds": [150] * 8, "seed": range(8), "gamma": [0.7] * 8})
    note = prose.profile_note(paper, full)
    assert "partial" not in note and "smoke test" not in note


def test_accuracy_level_note_compares_the_paper_with_every_tuning_setting():
    tuning = pd.DataFrame({"client_lr": [0.01, 0.1, 0.3, 0.1], "local_epochs": [1, 2, 2, 2],
                           "gamma": [0.9, 0.9, 0.9, 0.7], "val_accuracy_final": [0.74, 0.83, 0.44, 0.30],
                           "collapsed": [False, False, True, False]})
    text = prose.accuracy_level_note(tuning)
    assert "**0.509**" in text and "**0.740 and 0.830**" in text and "lr 0.01, E = 1" in text and "+0.231" in text
    assert "not a matter of these hyperparameters" in text  # the collapsed run and the other gamma are left out
    close = tuning.assign(val_accuracy_final=[0.52, 0.55, 0.44, 0.3])
    assert "within the range" in prose.accuracy_level_note(close)
    assert "not computed yet" in prose.accuracy_level_note(None)
    assert prose.accuracy_level_note(tuning, dataset="cifar10") == ""  # the paper quotes no FedAvg number there


def test_metric_table_and_describe_metrics(runs):
    # mean of the last rounds: everything as in ACC except FedSteer at 0.9, now below FedAvg
    last = runs.assign(mean_last_accuracy=runs["final_accuracy"])
    last.loc[(last["label"] == "fedsteer") & (last["gamma"] == 0.9), "mean_last_accuracy"] = 0.40
    table = tables.metric_table(last)
    assert list(table.columns) == [("γ=0.7", "final round"), ("γ=0.7", "mean of last rounds"),
                                   ("γ=0.9", "final round"), ("γ=0.9", "mean of last rounds")]
    assert table.index[0] == "Full participation" and table.loc["FedSteer", ("γ=0.9", "final round")] == pytest.approx(0.61)
    assert table.loc["FedSteer", ("γ=0.9", "mean of last rounds")] == pytest.approx(0.40)
    text = prose.describe_metrics(last)
    # γ=0.9: best baseline FedAvg 0.52 -> +17.3 % on the final round, (0.40 - 0.52) / 0.52 = -23.1 % on the last rounds
    assert "γ=0.9: FedSteer vs the best baseline +17.3 % on the final round, -23.1 %" in text
    assert "the sign flips with the metric" in text
    assert "γ=0.7" in text and text.count("same sign") == 1


def test_disagreement_checks_pair_the_suspects_with_the_best_baseline(runs):
    ordering = make_runs({0.9: {"fedsteer(ordering=as_written)": (0.64, 0.66)},
                          0.7: {"fedsteer(ordering=as_written)": (0.76, 0.80)}})
    fair = make_runs({0.9: {"fedvarp(warmup_cycles=5)": (0.47, 0.49), "mifa(warmup_cycles=5)": (0.35, 0.37)},
                      0.7: {"fedvarp(warmup_cycles=5)": (0.73, 0.75), "mifa(warmup_cycles=5)": (0.61, 0.61)}})
    checks = claim_checks.disagreement_checks(runs, ordering, fair).set_index(["gamma", "comparison"])
    assert len(checks) == 16
    # best baseline: FedAvg at 0.9 (0.52), FedVARP at 0.7 (0.74); paired by seed
    best9 = checks.loc[(0.9, "FedSteer (as written) vs best baseline")]
    assert best9["best baseline"] == "fedavg"
    assert math.isclose(best9["difference"], 0.13) and math.isclose(best9["relative gain"], 0.65 / 0.52 - 1)
    best7 = checks.loc[(0.7, "FedSteer (as written) vs best baseline")]
    assert best7["best baseline"] == "fedvarp" and math.isclose(best7["difference"], 0.04)
    assert best9["best baseline name"] == "FedAvg" and best7["best baseline name"] == "FedVARP"
    assert math.isclose(checks.loc[(0.9, "FedSteer (as written) vs FedSteer (unbiased)"), "difference"], 0.04)
    warm = checks.loc[(0.9, "FedVARP + warm-up vs FedVARP")]
    assert math.isclose(warm["difference"], 0.02) and warm["suspect"] == "warm-up information"
    assert pd.isna(warm["best baseline"])
    assert math.isclose(checks.loc[(0.9, "FedSteer (unbiased) vs MIFA + warm-up"), "difference"], 0.25)
    text = prose.describe_disagreement(claim_checks.disagreement_checks(runs, ordering, fair))
    assert "+25.0 % at γ=0.9 (paper +8.8 %)" in text and "(paper +7.8 %)" in text
    assert "**Estimator ordering**" in text and "**Warm-up information**" in text
    assert "(the best baseline here: FedAvg)" in text and "(the best baseline here: FedVARP)" in text
    only_main = claim_checks.disagreement_checks(runs, ordering.iloc[:0], fair.iloc[:0])  # ablations not run yet
    assert list(only_main["comparison"]) == ["FedSteer (unbiased) vs best baseline"] * 2
    assert "nothing to check" in prose.describe_disagreement(claim_checks.disagreement_checks(runs.iloc[:0], ordering, fair))


# ------------------------------------------------------------------------------ tested verdicts
def eight_seed_runs() -> pd.DataFrame:
    """Eight seeds: at γ=0.9 FedSteer clearly above FedAvg (≈ +16.7 %), FedAvg clearly above the
    rest, full participation clearly above FedSteer; at γ=0.7 FedSteer level with FedVARP."""
    rng = np.random.default_rng(0)
    jitter = lambda level: tuple(level + rng.normal(0, 0.01, 8))  # noqa: E731
    acc = {0.9: {"full": jitter(0.85), "fedsteer": jitter(0.70), "fedavg": jitter(0.60), "fedvarp": jitter(0.50),
                 "mifa": jitter(0.45)},
           0.7: {"full": jitter(0.85), "fedsteer": jitter(0.70), "fedavg": jitter(0.60), "fedvarp": jitter(0.70),
                 "mifa": jitter(0.45)}}
    return make_runs(acc)


def test_claim_verdicts_test_each_claim_paired_by_seed():
    runs = eight_seed_runs()
    t1 = tables.table1(runs)
    mem = server_memory.run_memory_table(memory_runs([("fedvarp", 1000), ("fedsteer(core_size=10)", 100)]))
    claims = claim_checks.claims_checklist(t1, memory=mem)
    v = claim_verdicts.claim_verdicts(claims, runs)
    word = lambda short, gamma=None: v[(v["short"] == short) & (  # noqa: E731
        v["γ"].isna() if gamma is None else np.isclose(v["γ"], gamma))]["verdict"].iloc[0]
    assert word("beats FedAvg", 0.9) == "holds"
    assert word("FedAvg is next-best", 0.9) == "holds"
    assert word("beats best baseline", 0.9) == "holds"
    assert word("beats best baseline", 0.7) == "cannot be decided here"  # level with FedVARP
    assert word("gain ≥ 7.9 % everywhere") == "does not hold"  # 0.70 < 1.079 × 0.70 at γ=0.7
    assert word("second only to full", 0.9) == "holds"
    assert word("≈ 10× less memory") == "holds"  # a measurement
    assert set(v.loc[v["data set"].isin(["emnist", "cifar10"]), "verdict"]) == {"cannot be decided here"}
    # ours: the per-seed relative gain of the claim's comparison, its std and n
    beats = v[(v["short"] == "beats FedAvg")].iloc[0]
    steer, avg = (runs[(runs["label"] == lab) & (runs["gamma"] == 0.9)].set_index("seed")["final_accuracy"]
                  for lab in ("fedsteer", "fedavg"))
    assert beats["rel_mean"] == pytest.approx((steer / avg - 1).mean())
    assert beats["rel_std"] == pytest.approx((steer / avg - 1).std(ddof=1)) and beats["n"] == 8
    # one family: the p-values are Holm-adjusted over every comparison of the checklist
    n_tests = sum(len(t) for t in v["tests"])
    raw = stats.paired_t_test((steer - avg).tolist())["p"]
    assert raw < beats["p_holm"] <= min(1.0, raw * n_tests)
    # two paired seeds: indicative only
    two = claim_verdicts.claim_verdicts(claim_checks.claims_checklist(tables.table1(make_runs())), make_runs())
    assert set(two.loc[two["tests"].map(len) > 0, "verdict"]) == {"indicative"}


def test_verdict_table_is_short_and_links_to_the_evidence():
    runs = eight_seed_runs()
    v = claim_verdicts.claim_verdicts(claim_checks.claims_checklist(tables.table1(runs)), runs)
    table = claim_verdicts.verdict_table(v, {"emnist/0.9/fedsteer_enforce5": "#emnist"}, "#claims")
    assert list(table.columns) == ["#", "claim", "setting", "paper", "ours (mean ± std, n)", "verdict", "evidence"]
    assert len(table) == len(v) and set(table["verdict"]) <= set(claim_verdicts.VERDICT_WORDS)
    assert table["claim"].str.len().max() <= 30 and table["ours (mean ± std, n)"].str.len().max() <= 24
    first = table.iloc[0]
    assert first["claim"] == "beats FedAvg" and first["setting"] == "F-MNIST, γ=0.9" and first["paper"] == "+8.8\u00a0%"
    assert first["ours (mean ± std, n)"].endswith("(n=8)") and first["evidence"] == '<a href="#claims">§</a>'
    assert '<a href="#emnist">' in table.loc[table["claim"] == "EMNIST claims", "evidence"].iloc[0]
    notes = claim_verdicts.claim_footnotes(v)
    assert notes.count("\n") == len(v) - 1 and "“On Fashion-MNIST (γ=0.9), FedSteer provides" in notes
    assert "FedSteer vs FedAvg (F-MNIST, γ=0.9): +" in notes and "Holm-adjusted p = " in notes
    tests = claim_verdicts.claim_tests_table(v)
    assert len(tests) == sum(len(t) for t in v["tests"]) and "FedSteer vs 1.079 × FedVARP" in set(tests["comparison"])
    counts = claim_verdicts.verdict_counts(v)
    assert sum(counts.values()) == len(v)
    assert claim_verdicts.verdict_summary(v).startswith(f"Of the {len(v)} claim checks, {counts['holds']} hold")


def test_quoted_number_seeds_pair_the_gains_by_seed(t1, runs):
    compare = tables.compare_with_paper(t1)
    q = claim_verdicts.quoted_number_seeds(compare, t1, tables.gains(t1), runs).set_index(["key", "seed"])
    assert q.loc[("fmnist/0.9/fedsteer", 1), "value"] == pytest.approx(0.62)
    assert q.loc[("fmnist/0.9/gain_vs_fedavg", 0), "value"] == pytest.approx(0.60 / 0.50 - 1)
    assert q.loc[("fmnist/0.7/gain_vs_best", 1), "value"] == pytest.approx(0.72 / 0.75 - 1)  # best: FedVARP
    assert q.loc[("all/min_gain_vs_best", 0), "value"] == pytest.approx(0.70 / 0.73 - 1)  # the minimum is at γ=0.7
    assert set(q["kind"]) == {"accuracy", "gain"} and (q["paper"] > 0).all()


def test_compare_display_is_short_and_readable(t1):
    runs = make_runs()
    t1c = tables.table1(runs.assign(collapsed=(runs["label"] == "fedavg") & (runs["seed"] == 1)))
    compare = tables.compare_with_paper(t1c)
    shown = tables.compare_display(compare)
    assert list(shown.columns) == ["#", "number", "setting", "paper", "ours", "ours − paper"]
    text = shown.to_string()
    for bad in ("nan", "None", "True", "False", "NaN"):
        assert bad not in text
    assert shown.set_index("#").loc["3", "paper"] == "+8.8\u00a0%"  # never split from its unit
    row = shown.set_index("#").loc["2"]  # FedAvg at γ=0.9
    assert row["number"] == "FedAvg accuracy" and row["ours"] == "0.520 (n=2, 1 collapsed)"
    assert shown.set_index("#").loc["7", "ours"] == "not run"
    sources = prose.describe_quoted_sources(compare)
    assert sources.count("\n") == len(compare) - 1 and sources.startswith("1. §4.2: “On Fashion-MNIST")


def test_chapter10_figures_fit_the_column():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedsteer_lib.book.figures import paper_comparison
    from fedsteer_lib.book.figures import server_memory as memory_figures

    runs = make_runs()
    t1 = tables.table1(runs)
    seeds = claim_verdicts.quoted_number_seeds(tables.compare_with_paper(t1), t1, tables.gains(t1), runs)
    mem = server_memory.run_memory_table(memory_runs([("fedavg", 0), ("fedvarp", 1000), ("fedsteer(core_size=10)", 100)]))
    for fig in (paper_comparison.plot_quoted_numbers(seeds), memory_figures.plot_memory_bars(mem)):
        assert fig.get_figwidth() <= 6.4
        sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip()]
        assert sizes and min(sizes) >= 9
        plt.close(fig)


# ------------------------------------------------------------------------------ chapter 6's figures
def make_curves(runs: pd.DataFrame, rounds: int = 20, eval_every: int = 5, eval_last: int = 4) -> pd.DataFrame:
    """History rows (`Book.curves`' columns) for every run of `runs`: evaluated every `eval_every`
    rounds and in each of the last `eval_last` rounds (those off the cadence at 0.0, a zigzag that
    must not be drawn); SCAFFOLD at γ=0.9 collapses, seed 0 at round 8 and seed 1 at round 12."""
    rows = []
    for r in runs.itertuples():
        stop = {0: 8, 1: 12}[r.seed] if (r.label == "scaffold" and r.gamma == 0.9) else None
        for t in sorted(set(range(0, rounds + 1, eval_every)) | set(range(rounds - eval_last + 1, rounds + 1))):
            if stop is not None and t >= stop:
                rows.append({"round": stop, "accuracy": 0.1, "loss": float("nan"), "collapsed": True})
                break
            on = t % eval_every == 0 or t == rounds
            rows.append({"round": t, "accuracy": 0.5 if on else 0.0, "loss": 1.0 if on else 9.0, "collapsed": None})
            rows[-1]["accuracy"] += 0.01 * r.seed
        for row in rows:
            row.setdefault("label", r.label)
            row.setdefault("gamma", r.gamma)
            row.setdefault("seed", r.seed)
            row.setdefault("rounds", rounds)
    return pd.DataFrame(rows)


def _texts_fit_the_column(fig) -> None:
    import matplotlib

    assert fig.get_figwidth() <= 6.4
    sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip()]
    assert sizes and min(sizes) >= 9


def test_cadence_curve_keeps_the_cadence_and_counts_collapsed_runs_as_table1():
    from fedsteer_lib.book.figures import accuracy

    runs = make_runs()
    curves = make_curves(runs)
    scaffold = curves[(curves["label"] == "scaffold") & (curves["gamma"] == 0.9)]
    mean, std, stops = accuracy.cadence_curve(scaffold, "accuracy", 5)
    assert list(mean.index) == [0, 5, 10, 15, 20]  # not rounds 17-19 (off the cadence) nor the collapse rounds
    assert mean.tolist() == pytest.approx([0.505, 0.505, (0.1 + 0.51) / 2, 0.1, 0.1])  # the diverged score carried on
    assert sorted(stops.tolist()) == [8, 12]
    loss, _, _ = accuracy.cadence_curve(scaffold, "loss", 5)
    assert loss.loc[[0, 5]].tolist() == [1.0, 1.0]
    assert loss.loc[[10, 15, 20]].isna().all()  # no finite loss once a seed has diverged
    fedavg_rows = curves[(curves["label"] == "fedavg") & (curves["gamma"] == 0.9)]
    fedavg, _, none = accuracy.cadence_curve(fedavg_rows, "accuracy", 5)
    assert fedavg.tolist() == pytest.approx([0.505] * 5) and none.empty


def test_chapter6_figures_fit_the_column_with_legends_per_panel():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedsteer_lib.book.figures import accuracy

    runs = make_runs()
    t1 = tables.table1(runs)
    curves = make_curves(runs)
    fig4 = accuracy.plot_accuracy_by_gamma(curves, t1, eval_every=5)
    fig6 = accuracy.plot_convergence(curves, t1, 0.9, eval_every=5)
    bars = accuracy.plot_table1_bars(t1, runs)
    for fig in (fig4, fig6, bars):
        _texts_fit_the_column(fig)
    by_title = {ax.get_title(): ax for ax in fig4.axes}
    for gamma, beta, best, collapse in ((0.7, 0.9, "FedVARP, best baseline", None),
                                        (0.9, 0.6, "FedAvg", "SCAFFOLD: collapsed (2 of 2 seeds)")):
        ax = by_title[f"γ = {gamma:g} (2 seeds)"]
        drawn = {line.get_label() for line in ax.get_lines()}
        assert f"FedStale (β={beta})" in drawn  # FedStale at this γ's Table 1 β
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend[:3] == ["Full participation", "FedSteer", "FedAvg"] and best in legend
        assert set(legend) - drawn <= {"other methods", "SCAFFOLD: collapsed (2 of 2 seeds)"}
        assert (collapse in legend) if collapse else not any("collapsed" in t for t in legend)
        for line in ax.get_lines():
            x = np.asarray(line.get_xdata())
            if len(x) > 1:  # a curve (not an x mark): the regular cadence up to the final round
                assert set(x) <= {0, 5, 10, 15, 20} and x.max() == 20
    marks = [line for line in by_title["γ = 0.9 (2 seeds)"].get_lines() if line.get_marker() == "x"]
    assert len(marks) == 1 and marks[0].get_xdata()[0] == pytest.approx(10.0)  # the mean collapse round
    assert len(fig6.axes) == 2 and all(ax.get_legend() is not None for ax in fig6.axes)
    dots = sum(len(c.get_offsets()) for ax in bars.axes for c in ax.collections if c.get_sizes()[0] == 10)
    assert dots == sum(len(runs[(runs["gamma"] == g) & (runs["label"] == lab)]["final_accuracy"].dropna())
                       for g, lab in zip(t1["gamma"], t1["label"]))  # one dot per seed
    for fig in (fig4, fig6, bars):
        plt.close(fig)
