"""The conventions table, paired gains, regime summaries and the calibration rule, by hand."""
import numpy as np
import pandas as pd
import pytest

from fedsteer_lib.book import conventions as conv
from fedsteer_lib.book import regimes
from fedsteer_lib.book import server_steps as steps
from fedsteer_lib.experiments.config import method
from fedsteer_lib.experiments.registry import role_of


def _runs(rows):
    return pd.DataFrame(rows, columns=["gamma", "seed", "role", "beta", "final_accuracy", "collapsed"])


def test_roles_come_from_parameters_not_labels():
    dd = {"core_size": 40, "lam": 0.5}
    assert role_of("fedprox", dict(method("fedprox").params)) == "fedprox"
    assert role_of("fedprox", dict(method("fedprox", weighting="unbiased").params)) == "fedprox_unbiased"
    assert role_of("mifa", dict(method("mifa", start="wait_all").params)) == "mifa_wait_all"
    assert role_of("mifa", dict(method("mifa", warmup_cycles=5).params)) is None  # the fair-start check
    assert role_of("fedstale", dict(method("fedstale", beta=0.9).params)) == "fedstale"
    steer = dict(method("fedsteer", ordering="as_written", warmup_cycles=2).params)
    assert role_of("fedsteer", steer, dd) == "fedsteer_as_written"
    assert role_of("fedsteer", dict(method("fedsteer", core_size=10).params), dd) is None  # not Table 1's |X|


def test_convention_table_pairs_the_rows_and_picks_fedstales_best_beta():
    runs = _runs([
        (0.9, 0, "fedavg", np.nan, 0.80, False), (0.9, 1, "fedavg", np.nan, 0.82, False),
        (0.9, 0, "fedavg_unbiased", np.nan, 0.50, False), (0.9, 1, "fedavg_unbiased", np.nan, 0.10, True),
        (0.9, 0, "fedstale", 0.5, 0.60, False), (0.9, 1, "fedstale", 0.5, 0.62, False),
        (0.9, 0, "fedstale", 0.9, 0.70, False), (0.9, 1, "fedstale", 0.9, 0.74, False)])
    t = conv.convention_table(runs).set_index("method")
    assert t.loc["FedAvg", "normalised_mean"] == pytest.approx(0.81)
    assert t.loc["FedAvg", "normalised_std"] == pytest.approx(np.std([0.80, 0.82], ddof=1))
    assert t.loc["FedAvg", "framework_mean"] == pytest.approx(0.30)
    assert t.loc["FedAvg", "framework_collapsed"] == 1 and t.loc["FedAvg", "framework_n"] == 2
    assert t.loc["FedStale (best β)", "framework_mean"] == pytest.approx(0.72)  # β = 0.9 beats 0.5
    assert t.loc["MIFA", "normalised_n"] == 0 and np.isnan(t.loc["MIFA", "normalised_mean"])


def test_paired_gains_by_seed_against_the_best_baseline_of_each_set():
    runs = _runs([
        (0.9, s, r, np.nan, a, False) for s, (steer, avg, unb, varp) in enumerate([(0.7, 0.6, 0.5, 0.4), (0.9, 0.7, 0.2, 0.6)])
        for r, a in (("fedsteer", steer), ("fedavg", avg), ("fedavg_unbiased", unb), ("fedvarp", varp))])
    g = conv.paired_gains(runs).set_index("convention")
    # normalised set: best mean is FedAvg (0.65); per-seed gains 0.1 and 0.2
    assert g.loc["normalised", "best_baseline"] == "FedAvg"
    assert g.loc["normalised", "gain"] == pytest.approx(0.15)
    assert g.loc["normalised", "gain_std"] == pytest.approx(np.std([0.1, 0.2], ddof=1))
    assert g.loc["normalised", "relative_gain"] == pytest.approx(0.15 / 0.65)
    assert g.loc["normalised", "wins"] == 2
    # the FedStale code base's set has no normalised FedAvg: best is FedVARP (0.5)
    assert g.loc["framework", "best_baseline"] == "FedVARP"
    assert g.loc["framework", "gain"] == pytest.approx(0.3)


def test_regime_summary_gains_and_the_calibrated_cell():
    rows = []
    for lr, epochs, unb, avg, steer in [(0.01, 1, 0.45, 0.60, 0.62), (0.1, 2, 0.70, 0.80, 0.70), (0.03, 1, 0.55, 0.7, 0.9)]:
        for seed, shift in ((0, -0.01), (1, 0.01)):
            for role, acc in (("fedavg_unbiased", unb), ("fedavg", avg), ("fedsteer", steer)):
                rows.append({"client_lr": lr, "local_epochs": epochs, "seed": seed, "role": role,
                             "final_accuracy": acc + shift})
    runs = pd.DataFrame(rows)
    summary = regimes.regime_summary(runs)
    cell = summary[(summary["client_lr"] == 0.1) & (summary["role"] == "fedavg")].iloc[0]
    assert cell["mean"] == pytest.approx(0.80) and cell["n"] == 2
    gains = regimes.regime_gains(runs).set_index(["client_lr", "local_epochs"])
    assert gains.loc[(0.1, 2), "gain"] == pytest.approx(-0.10)
    assert gains.loc[(0.03, 1), "best_baseline"] == "FedAvg"
    words = regimes.describe_regime_gains(regimes.regime_gains(runs), "FedSteer", 0.088)
    # cells: lr 0.01 +0.02 (+3.3 %), lr 0.1 -0.10, lr 0.03 +0.20 (+28.6 % over FedAvg's 0.70)
    assert words == ("FedSteer ends above the cell's best baseline on average in 2 of 3 cells; its largest mean gain is "
                     "+0.200 (+28.6 % over FedAvg) at client lr 0.03, E = 1 (2 seeds), and 1 cell reaches the paper's +8.8 %.")
    assert regimes.describe_regime_gains(regimes.regime_gains(runs.iloc[0:0]), "FedSteer", 0.088).startswith("No cell")
    # |0.45 - 0.509| = 0.059 and |0.55 - 0.509| = 0.041: the lr 0.03 cell is closest to the paper
    assert regimes.calibrated_cell(summary)["client_lr"] == 0.03
    assert regimes.calibrated_cell(summary[summary["role"] != "fedavg_unbiased"]) is None
    provisional = regimes.describe_calibrated_cell(summary, None, 0, 0)
    assert provisional.startswith("Provisionally") and "client lr 0.03, E = 1: unbiased FedAvg 0.550 over 2 seeds" in provisional
    assert "FedAvg 0.700" in provisional and "computed so far" not in provisional
    final = {"client_lr": 0.01, "local_epochs": 1, "mean": 0.45, "n": 3, "paper": 0.509}
    text = regimes.describe_calibrated_cell(summary, final, 5, 272)
    assert text.startswith("The rule picks client lr 0.01, E = 1: unbiased FedAvg 0.450 over 3 seeds (the paper: 0.509)")
    assert "5 of 272 runs computed so far" in text
    assert regimes.describe_calibrated_cell(summary, final, 272, 272).endswith("every seed and γ: all 272 runs are in.")
    assert regimes.describe_calibrated_cell(summary[summary["role"] != "fedavg_unbiased"], None, 0, 0).startswith("No cell")


def _claim_runs(rows):
    return pd.DataFrame([{"gamma": g, "seed": s, "role": r, "beta": np.nan, "final_accuracy": a, "collapsed": False}
                         for g, s, r, a in rows])


def test_setting_claims_by_hand():
    # gamma = 0.9, six seeds: FedSteer ahead of FedAvg by 0.10 (+0.004 on odd seeds), of FedVARP by
    # 0.04 (+0.002), i.e. about 6.9 % of FedVARP's mean, below the paper's 8.8 %; FedVARP ahead of FedAvg
    # on every seed; gamma = 0.7: FedSteer and FedVARP within 0.003 (the paper quotes no FedAvg gain there).
    seeds = range(6)
    rows = [(0.9, s, "fedsteer", 0.60 + 0.01 * s + 0.004 * (s % 2)) for s in seeds]
    rows += [(0.9, s, "fedavg", 0.50 + 0.01 * s) for s in seeds]
    rows += [(0.9, s, "fedavg_unbiased", 0.40 + 0.001 * s) for s in seeds]
    rows += [(0.9, s, "fedvarp", 0.56 + 0.01 * s + 0.002 * (s % 2)) for s in seeds]
    rows += [(0.7, s, "fedsteer", 0.70 + 0.003 * (s % 2)) for s in seeds] + [(0.7, s, "fedvarp", 0.70) for s in seeds]
    claims = conv.setting_claims({"here": _claim_runs(rows), "two seeds": _claim_runs([r for r in rows if r[1] < 2])})
    here = claims[claims["setting"] == "here"].set_index(["convention", "gamma", "claim"])
    beats_avg = here.loc[("normalised", 0.9, "FedSteer beats FedAvg")]
    assert (beats_avg["a"], beats_avg["b"], beats_avg["n"], beats_avg["wins"]) == ("FedSteer", "FedAvg", 6, 6)
    assert beats_avg["rel_mean"] == pytest.approx(0.102 / 0.525)
    assert beats_avg["verdict"] == "holds" and beats_avg["paper"] == "+8.8 %"
    best = here.loc[("framework", 0.9, "FedSteer beats the best baseline")]
    assert best["b"] == "FedVARP" and best["verdict"] == "holds"
    assert best["rel_mean"] == pytest.approx(0.041 / 0.586)
    margin = here.loc[("framework", 0.9, "… by at least the paper's 8.8 %")]
    assert margin["wins"] == 0 and margin["verdict"] == "does not hold"
    assert here.loc[("normalised", 0.9, "FedAvg is the best baseline")]["verdict"] == "does not hold"
    # the framework set's FedAvg is the unbiased one
    assert here.loc[("framework", 0.9, "FedSteer beats FedAvg")]["b"] == "FedAvg (unbiased)"
    assert here.loc[("normalised", 0.7, "FedSteer beats the best baseline")]["verdict"] == "cannot be decided here"
    assert ("normalised", 0.7, "FedSteer beats FedAvg") not in here.index  # the paper quotes no such gain at 0.7
    # two seeds: shown, never a verdict
    assert set(claims.loc[claims["setting"] == "two seeds", "verdict"]) == {"indicative"}
    shown = conv.setting_claims_display(claims, "here")
    assert list(shown.columns) == ["γ", "claim", "paper", "today's (normalised)", "FedStale code base's"]
    row = shown[(shown["γ"] == "0.9") & (shown["claim"] == "FedSteer beats FedAvg")].iloc[0]
    assert row["today's (normalised)"] == "+19.4 ± 0.4 % (n = 6)<br><b>holds</b>"
    text = conv.describe_setting_claims(claims)
    assert text.startswith("here, against either way of writing the baselines, of 6 claim checks 2 hold "
                           "(FedSteer beats FedAvg at γ = 0.9; FedSteer beats the best baseline at γ = 0.9); ")
    flipped = claims.copy()  # where the two sets disagree, each is said on its own
    flipped.loc[(flipped["setting"] == "here") & (flipped["convention"] == "framework")
                & (flipped["claim"] == "FedSteer beats FedAvg"), "verdict"] = "cannot be decided here"
    split = conv.describe_setting_claims(flipped)
    assert split.startswith("here: against today's normalised baselines, of 6 claim checks 2 hold")
    assert "; against the FedStale code base's baselines, of 6 claim checks 1 holds (FedSteer beats the best baseline" in split
    # two seeds: every check indicative under both sets, said once
    assert text.endswith("two seeds, against either way of writing the baselines, of 6 claim checks 0 hold; "
                         "6 are only indicative (2 paired seeds).")
    assert conv.describe_setting_claims(claims.iloc[0:0]) == "No claim can be checked yet."


def test_claims_are_checked_only_in_settings_whose_runs_are_all_in():
    seeds = range(6)
    rows = [(0.9, s, "fedsteer", 0.60 + 0.01 * s + 0.004 * (s % 2)) for s in seeds]
    rows += [(0.9, s, "fedavg", 0.50 + 0.01 * s) for s in seeds] + [(0.9, s, "fedvarp", 0.56 + 0.01 * s) for s in seeds]
    runs = _claim_runs(rows)
    summary, shown = conv.claims_by_setting({"done": ("complete", runs, 0), "coming": ("partial", runs, 3),
                                             "unfixed": ("not fixed", runs, None)})
    # one family: only the complete setting is tested, so its p-values are those of it alone
    alone = conv.setting_claims({"complete": runs})
    assert summary == conv.describe_setting_claims(alone) and "partial" not in summary
    table = shown["done"]
    assert table.data.equals(conv.setting_claims_display(alone, "complete"))
    assert "row_heading" not in table.to_html()  # the index is hidden
    # the others say why, as Markdown (a plain string would show on the page as a quoted repr)
    assert shown["coming"]._repr_markdown_() == "Not yet: 3 runs of this setting are still being computed (see above)."
    assert conv.claims_by_setting({"one": ("x", runs, 1)})[1]["one"]._repr_markdown_().startswith("Not yet: 1 run of this setting is")
    assert shown["unfixed"]._repr_markdown_().startswith("Not yet: this setting is fixed only once")
    assert conv.claims_by_setting({"coming": ("partial", runs, 3)})[0] == "No claim can be checked yet."
    # a complete setting with nothing to pair: a sentence, not an empty table
    unpaired = conv.claims_by_setting({"bare": ("no FedSteer", runs[runs["role"] != "fedsteer"], 0)})[1]["bare"]
    assert unpaired._repr_markdown_().startswith("No claim can be checked in this setting")
    assert {"setting", "verdict", "p_holm"} <= set(conv.setting_claims({}).columns)
    # FedStale run at one beta only (the own-step setting) is named by it, not "best β"
    stale = pd.concat([runs, _claim_runs([(0.9, s, "fedstale", 0.70 + 0.01 * s) for s in seeds]).assign(beta=0.7)])
    best = conv.setting_claims({"one beta": stale}).set_index(["convention", "claim"]).loc[("framework", "FedSteer beats the best baseline")]
    assert best["b"] == "FedStale (β = 0.7)"


def test_server_step_table_chooses_only_complete_methods():
    runs = pd.DataFrame([{"role": r, "server_lr": lr, "gamma": g, "final_accuracy": a}
                         for r, lr, g, a in [("fedavg", 0.5, 0.7, 0.80), ("fedavg", 0.5, 0.9, 0.70),
                                             ("fedavg", 1.0, 0.7, 0.78), ("fedavg", 1.0, 0.9, 0.74),
                                             ("fedsteer", 1.0, 0.7, 0.81)]])
    runs["beta"] = np.nan
    stale = pd.DataFrame([{"role": "fedstale", "server_lr": lr, "gamma": g, "final_accuracy": 0.7, "beta": 0.7}
                          for lr in (0.5, 1.0) for g in (0.7, 0.9)])
    t = steps.server_step_table(pd.concat([runs, stale], ignore_index=True), (0.5, 1.0)).set_index("method")
    assert "FedStale (β = 0.7)" in t.index  # searched at one beta: named by it, not "best β"
    assert t.loc["FedAvg", "η_s = 0.5"] == "0.750" and t.loc["FedAvg", "η_s = 1"] == "0.760"
    assert t.loc["FedAvg", "chosen η_s"] == "1"  # 0.76 > 0.75
    assert t.loc["FedSteer", "η_s = 1"] == "—" and t.loc["FedSteer", "chosen η_s"] == "—"  # gamma 0.9 missing
    assert list(steps.server_step_table(runs.iloc[0:0], (0.5, 1.0)).columns) == ["method", "η_s = 0.5", "η_s = 1",
                                                                                  "chosen η_s"]


def test_own_step_runs_take_each_method_at_its_chosen_step():
    from fedsteer_lib.experiments.config import method

    choices = {method("fedavg_unbiased"): 0.25, method("fedsteer", core_size=40, lam=0.5): 1.0,
               method("fedstale", beta=0.7): 1.0}
    frozen = pd.DataFrame([(role, beta, 1.0, gamma, seed, acc, False)
                           for gamma in (0.7, 0.9) for seed in (0, 1)
                           for role, beta, acc in (("fedavg_unbiased", np.nan, 0.50), ("fedsteer", np.nan, 0.70),
                                                   ("fedstale", 0.7, 0.60), ("fedstale", 0.9, 0.65))],
                          columns=["role", "beta", "server_lr", "gamma", "seed", "final_accuracy", "collapsed"])
    reruns = pd.DataFrame([("fedavg_unbiased", np.nan, 0.25, gamma, seed, 0.80 + 0.01 * seed, seed == 1)
                           for gamma in (0.7, 0.9) for seed in (0, 1)], columns=frozen.columns)
    at_one, own = steps.own_step_runs(frozen, reruns, choices, "fmnist")
    assert sorted(at_one.groupby("role")["final_accuracy"].mean().round(3).items()) == [
        ("fedavg_unbiased", 0.5), ("fedstale", 0.6), ("fedsteer", 0.7)]  # FedStale at beta 0.7 only
    assert sorted(own.groupby("role")["final_accuracy"].mean().round(3).items()) == [
        ("fedavg_unbiased", 0.805), ("fedstale", 0.6), ("fedsteer", 0.7)]
    table = steps.own_step_display(at_one, own, choices, "fmnist").set_index(["γ", "method"])
    row = table.loc[("0.9", "FedAvg (unbiased)")]
    assert row["its η_s"] == "0.25" and row["at η_s = 1"] == "0.500 ± 0.000"
    assert row["at its η_s"] == "0.805 ± 0.007 (1 of 2 collapsed)"
    # on the test split: FedAvg (unbiased) 0.805 at its step against 0.500 at the frozen one, at both gammas
    assert steps.describe_step_effects(at_one, own, choices, "fmnist") == (
        "At γ = 0.9, of the 1 method given another step, 1 ends higher (by 0.305) at it than at η_s = 1. "
        "At γ = 0.7, of the 1 method given another step, 1 ends higher (by 0.305) at it than at η_s = 1.")
    worse = own.assign(final_accuracy=np.where(np.isclose(own["gamma"], 0.7), 0.45, own["final_accuracy"]))
    assert steps.describe_step_effects(at_one, worse, choices, "fmnist").endswith(
        "At γ = 0.7, of the 1 method given another step, 1 ends lower (by 0.050) at it than at η_s = 1.")
    # while the reruns come in, a cell says how many of the seeds it holds
    _, partial = steps.own_step_runs(frozen, reruns[reruns["seed"] == 1], choices, "fmnist")
    row = steps.own_step_display(at_one, partial, choices, "fmnist").set_index(["γ", "method"]).loc[("0.9", "FedAvg (unbiased)")]
    assert row["at its η_s"] == "0.810 (1 of 2 seeds; 1 of 1 collapsed)" and row["at η_s = 1"] == "0.500 ± 0.000"
    gains = conv.paired_gains(own).set_index(["gamma", "convention", "fedsteer"])
    assert gains.loc[(0.9, "framework", "FedSteer"), "best_baseline"] == "FedAvg (unbiased)"
    assert gains.loc[(0.9, "framework", "FedSteer"), "gain"] == pytest.approx(-0.105)
    # a group still being computed gets its p-values shown but no verdict
    shown = conv.paired_gains_display(conv.paired_gains(own), "fmnist")
    assert "none yet" not in " ".join(shown["verdict"])
    waiting = conv.paired_gains_display(conv.withhold_verdicts(conv.paired_gains(own), 3), "fmnist")
    assert set(waiting["verdict"]) == {"none yet (3 runs missing)"} and list(waiting["p (Holm)"]) == list(shown["p (Holm)"])
    # before the search is complete: nothing, and the sentence says so
    empty_one, empty_own = steps.own_step_runs(frozen, reruns.iloc[0:0], None, "fmnist")
    assert empty_one.empty and empty_own.empty and steps.own_step_display(empty_one, empty_own, None).empty
    assert steps.describe_own_steps(None, 0).startswith("The search is not complete")
    assert steps.describe_step_effects(empty_one, empty_own, None) == "No method given another step has its runs in yet."
    text = steps.describe_own_steps(choices, 16, "fmnist")
    assert text.startswith("Of the 3 methods searched, 2 keep η_s = 1 (FedSteer, FedStale (β = 0.7)); "
                           "FedAvg (unbiased) gets η_s = 0.25. That method is rerun at its own step")
    assert "16 of its runs are still being computed" in text
    one = {spec: lr for spec, lr in choices.items() if lr != 1.0}  # a search of one method (the quick profile's)
    assert steps.describe_own_steps(one, 0, "fmnist").startswith("Of the 1 method searched, 0 keep η_s = 1; FedAvg (unbiased)")
    assert steps.describe_own_steps(choices, 0, "fmnist").endswith("every seed and γ of Table 1.")


def test_open_groups_sentence():
    assert conv.describe_open_groups({"a": 0, "b": 0}).startswith("Every run of this chapter's groups is in")
    text = conv.describe_open_groups({"the map": 3, "the search": 0, "the reruns": 1})
    assert text.startswith("Still being computed: the map: 3 runs; the reruns: 1 run.")


def test_gains_in_words_with_the_papers_figure_and_no_verdict_while_runs_are_missing():
    runs = _runs([
        (g, s, r, np.nan, a + (0.01 * s if r == "fedsteer" else 0), False) for g in (0.7, 0.9) for s in range(6)
        for r, a in (("fedsteer", 0.80), ("fedavg", 0.70), ("fedvarp", 0.60))])
    gains = conv.paired_gains(runs)
    text = conv.describe_gains_by_gamma(gains, "fmnist", steer="FedSteer")
    assert text.index("At γ = 0.9") < text.index("At γ = 0.7")  # the highest gamma first
    # 6 seeds, FedSteer 0.825 on average against FedAvg's 0.70: +0.125, +17.9 %, the paper's +8.8 % beside it
    assert ("with today's normalised baselines, FedSteer ends +0.125 (+17.9 %; the paper: +8.8 %) from the best of them, "
            "FedAvg (0.700), winning 6 of 6 seeds, Holm-adjusted p < 0.001: FedSteer higher") in text
    assert "(+17.9 %; the paper: +7.8 %)" in text  # gamma = 0.7
    assert "the paper" not in conv.describe_gains_by_gamma(gains, steer="FedSteer")  # no data set, no paper figure
    assert conv.describe_gains_by_gamma(gains, "fmnist", runs_missing=3) == "Not yet: 3 runs of this group are still being computed."
    assert conv.describe_gains_by_gamma(gains.iloc[0:0]) == "No paired runs yet."


def test_gain_overview_puts_every_setting_side_by_side():
    from fedsteer_lib.book.gain_overview import gain_overview

    runs = _runs([
        (g, s, r, np.nan, a + (0.01 * s if r == "fedsteer" else 0), False) for g in (0.7, 0.9) for s in range(6)
        for r, a in (("fedsteer", 0.80), ("fedavg", 0.70), ("fedvarp", 0.60))])
    gains = conv.paired_gains(runs)
    table = gain_overview({"done": gains, "coming": conv.withhold_verdicts(gains, 4), "nothing": gains.iloc[0:0]},
                          "fmnist", steer="FedSteer")
    assert list(table.columns) == ["setting", "γ", "today's (normalised)", "FedStale code base's", "paper"]
    assert list(zip(table["setting"], table["γ"])) == [("done", "0.9"), ("done", "0.7"), ("coming", "0.9"), ("coming", "0.7")]
    first = table.iloc[0]
    assert first["today's (normalised)"] == "+17.9 % over FedAvg (6 of 6 seeds; FedSteer higher)"
    assert first["FedStale code base's"].startswith("+37.5 % over FedVARP (6 of 6 seeds;") and first["paper"] == "+8.8 %"
    assert table.iloc[2]["today's (normalised)"] == "+17.9 % over FedAvg (6 of 6 seeds; none yet (4 runs missing))"
    assert gain_overview({"none": gains.iloc[0:0]}).empty
    # nothing to pair: the table still has its columns, so every reader of it works unchanged
    nothing = conv.paired_gains(runs.iloc[0:0])
    assert nothing.empty and {"gamma", "fedsteer", "verdict", "p_holm"} <= set(nothing.columns)
    assert gain_overview({"none": nothing}).empty and conv.paired_gains_display(nothing).empty
