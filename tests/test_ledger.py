"""The claims ledger (book/ledger.py): one definition of gain, one interval, one Holm family, and
the verdict words the family allows, checked by hand; then the committed ledger's invariants."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fedsteer_lib.book import ledger
from fedsteer_lib.book.claims import COLUMNS, Claim, OutOfRange, assemble, holm_levels
from fedsteer_lib.book.stats import ALPHA, MIN_UNITS, holm, mean_ci, t_critical


def test_gain_is_paired_by_seed_and_relative_to_the_baselines_mean():
    per_seed = pd.DataFrame({"fedsteer": [0.80, 0.90, 0.70], "fedavg": [0.70, 0.80, 0.90]}, index=[0, 1, 2])
    gains = ledger.gains_by_seed(per_seed, "fedsteer", "fedavg")
    assert gains.tolist() == pytest.approx([0.1 / 0.8, 0.1 / 0.8, -0.2 / 0.8])


def test_the_best_baseline_is_the_best_mean_among_table_1s_baselines():
    per_seed = pd.DataFrame({"fedsteer": [0.99, 0.99], "full": [0.98, 0.98], "fedavg": [0.7, 0.8],
                             "mifa": [0.76, 0.76], "fedprox": [0.5, 0.9]})
    assert ledger.best_baseline(per_seed) == "mifa"  # 0.76 > 0.75 = FedAvg's = FedProx's; FedSteer, full excluded


def test_theorem_2s_term_compares_only_pairs_with_every_methods_run():
    """Per (γ, seed), FedSteer over the smallest other method: a pair that lacks a method's run (a
    group still being computed) is left out, since the smallest of fewer methods favours FedSteer."""
    from fedsteer_lib.book.mechanism_claims import variance_ratios

    def at(gamma, seed, **values):
        return [{"method": m, "name": m, "refresh": 1 if m == "fedsteer" else None, "gamma": gamma,
                 "seed": seed, "value": v} for m, v in values.items()]

    means = pd.DataFrame(at(0.9, 0, fedsteer=2.0, fedvarp=4.0, mifa=1.0)  # complete: 2 / min(4, 1)
                         + at(0.9, 1, fedsteer=2.0, fedvarp=8.0)  # MIFA missing
                         + at(0.7, 0, fedsteer=3.0, fedvarp=6.0, mifa=12.0))
    smallest = variance_ratios(means, None)
    assert smallest[["gamma", "seed"]].values.tolist() == [[0.7, 0], [0.9, 0]]
    assert smallest["ratio"].tolist() == pytest.approx([0.5, 2.0])
    assert variance_ratios(means, "fedvarp")["ratio"].tolist() == pytest.approx([0.5, 0.5, 0.25])


def test_fedstale_counts_at_its_best_beta_per_gamma():
    runs = pd.DataFrame({"gamma": [0.9] * 4 + [0.7] * 4, "role": ["fedstale"] * 8, "seed": [0, 1] * 4,
                         "label": ["fedstale(beta=0.5)"] * 2 + ["fedstale"] * 2 + ["fedstale(beta=0.5)"] * 2
                         + ["fedstale"] * 2, "final_accuracy": [0.8, 0.8, 0.6, 0.6, 0.5, 0.5, 0.7, 0.7]})
    kept = ledger.at_best_beta(runs)
    assert set(zip(kept["gamma"], kept["label"])) == {(0.9, "fedstale(beta=0.5)"), (0.7, "fedstale")}


def _claim(values, **kw) -> Claim:
    return Claim(kw.pop("id", "c"), kw.pop("kind", "accuracy"), "a claim", "§x", "setting", "paper", "06", values, **kw)


def test_interval_and_test_by_hand():
    values = [0.01, 0.03, 0.02, 0.04, 0.05, 0.03, 0.02, 0.04]
    row = assemble([_claim(values, words=("ahead", "behind"))]).iloc[0]
    m, s = np.mean(values), np.std(values, ddof=1)
    half = t_critical(7) * s / math.sqrt(8)
    assert (row["estimate"], row["ci_low"], row["ci_high"]) == pytest.approx((m, m - half, m + half))
    assert row["n"] == 8 and row["p"] < 1e-3 and row["p_holm"] == pytest.approx(row["p"])  # a family of one
    assert (row["family_low"], row["family_high"]) == pytest.approx((row["ci_low"], row["ci_high"]))  # level ALPHA / 1
    assert row["verdict"] == "holds: ahead"


PAPER_WORDS = ("the paper's x lies below our interval", "the paper's x lies above our interval",
               "the paper's x cannot be ruled out")


@pytest.mark.parametrize("values, kw, verdict", [
    ([0.01, 0.03, 0.02, 0.04, 0.05, 0.03, 0.02, 0.04], {}, "holds: higher"),
    ([-0.01, -0.03, -0.02, -0.04, -0.05, -0.03, -0.02, -0.04], {}, "does not hold: lower"),
    ([0.1, -0.1, 0.05, -0.08, 0.02, -0.03, 0.09, -0.04], {}, "cannot be decided"),
    ([0.01, 0.03, 0.02], {}, "indicative only"),  # fewer than MIN_UNITS units: no verdict
    ([0.02, 0.03, 0.02, 0.04, 0.05, 0.03, 0.02, 0.04], {"target": 0.079}, "does not hold: lower"),  # "at least 7.9 %"
    ([-0.01, -0.03, -0.02, -0.04, -0.05, -0.03, -0.02, -0.04], {"direction": -1}, "holds: lower"),  # "below"
    ([0.02, 0.03, 0.02, 0.04, 0.05, 0.03, 0.02, 0.04], {"target": 0.088, "direction": 0, "words": PAPER_WORDS},
     PAPER_WORDS[1]),  # the paper's number, above ours
    ([0.1, -0.1, 0.05, -0.08, 0.02, -0.03, 0.09, -0.04], {"target": 0.02, "direction": 0, "words": PAPER_WORDS},
     PAPER_WORDS[2]),
    ([0.01, 0.03, 0.02, 0.04, 0.05, 0.03, 0.02, 0.04], {"direction": 0, "kind": "our check"}, "exploratory (no test)"),
])
def test_verdict_words(values, kw, verdict):
    assert assemble([_claim(values, **kw)]).iloc[0]["verdict"] == verdict


def test_one_holm_family_of_the_papers_claims_only():
    """A test that passes alone may not pass in the book's family: p is adjusted for every test of
    the paper's claims; the book's own checks and indicative rows are not in the family."""
    weak = [0.02, 0.01, 0.03, -0.005, 0.02, 0.015, 0.01, 0.0]
    alone = assemble([_claim(weak)]).iloc[0]
    noise = [_claim([0.1, -0.1, 0.05, -0.08, 0.02, -0.03, 0.09, -0.04], id=f"n{i}") for i in range(9)]
    few = _claim([0.5, 0.6], id="few")
    ours = _claim([0.3, 0.31, 0.32, 0.3, 0.29, 0.33, 0.3, 0.31], id="ours", kind="our check", direction=0)
    family = assemble([_claim(weak)] + noise + [few, ours])
    first = family.iloc[0]
    assert alone["verdict"] == "holds: higher" and alone["p"] < 0.05
    assert first["p_holm"] == pytest.approx(holm([first["p"], *family["p"].iloc[1:10]])[0])
    assert first["p_holm"] > alone["p_holm"] and first["verdict"] == "cannot be decided"
    assert math.isnan(family.iloc[-2]["p_holm"]) and family.iloc[-2]["verdict"] == "indicative only"
    assert math.isnan(family.iloc[-1]["p"]) and math.isnan(family.iloc[-1]["family_low"])  # our check: no test


def test_the_family_interval_agrees_with_every_holm_verdict():
    """Each tested row's family-level interval excludes its target exactly when Holm rejects it,
    including a row that Holm rejects but Bonferroni's ALPHA / m interval would not exclude."""
    rng = np.random.default_rng(0)
    claims = [_claim((rng.normal(mu, 0.03, 8)).tolist(), id=f"c{i}")
              for i, mu in enumerate([0.08, 0.05, 0.04, 0.035, 0.03, 0.0, -0.01, 0.02])]
    rows = assemble(claims)
    for _, r in rows.iterrows():
        outside = not r["family_low"] <= r["target"] <= r["family_high"]
        assert outside == (r["p_holm"] < ALPHA), r["id"]
    assert holm_levels([0.001, 0.02, 0.5]) == pytest.approx([ALPHA / 3, ALPHA / 2, ALPHA])
    assert holm_levels([0.001, 0.04, 0.5]) == pytest.approx([ALPHA / 3, ALPHA / 2, ALPHA / 2])  # stopped at step 2


@pytest.mark.parametrize("scale, values, bounds", [
    ("log_ratio", [0.05, 0.2, 3.0, 0.01, 1.5], (-1.0, np.inf)),  # a variance ratio, widely spread
    ("bootstrap", [0.99, 0.2, 0.97, 0.95, 0.1, 0.98], (-1.0, 1.0)),  # cosines near their bound
])
def test_intervals_stay_in_their_quantitys_range(scale, values, bounds):
    mean_half = mean_ci(np.log(values) if scale == "log_ratio" else values)
    row = assemble([_claim(values, scale=scale, bounds=bounds, percent=scale == "log_ratio")]).iloc[0]
    assert bounds[0] <= row["ci_low"] <= row["estimate"] <= row["ci_high"] <= bounds[1]
    if scale == "bootstrap":  # the t-interval of the same values would leave [-1, 1]
        assert mean_half[0] + mean_half[1] > 1
    with pytest.raises(OutOfRange):  # the wrong scale is refused, never clipped
        assemble([_claim([-0.9, -0.99, 0.9, -0.95, -0.9], bounds=(-1.0, np.inf))])


def test_exact_and_not_run_rows():
    rows = assemble([_claim((), kind="memory", exact=9.9, exact_holds=True),
                     _claim((), kind="memory", exact=2.5, exact_holds=None),
                     _claim((), kind="not run here")])
    assert rows["verdict"].tolist() == ["holds (computed exactly)", "computed exactly", "not run here"]
    assert rows["p_holm"].isna().all()


def test_mean_ci_matches_the_t_interval():
    assert mean_ci([1.0, 2.0, 3.0, 4.0]) == pytest.approx((2.5, t_critical(3) * math.sqrt(5 / 3) / 2, 4))
    assert math.isnan(mean_ci([1.0])[1]) and mean_ci([])[2] == 0


@pytest.fixture(scope="module")
def committed():
    import warnings

    from fedsteer_lib.book import setup

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ledger.build(setup("paper"))


def test_the_committed_ledger_is_one_consistent_family(committed):
    L = committed
    assert L["id"].is_unique and list(L.columns) == COLUMNS
    tested = L[L["p_holm"].notna()]
    assert set(tested["kind"]) <= {"accuracy", "mechanism", "ablation"}  # the paper's claims only
    assert (tested["n"] >= MIN_UNITS).all() and (tested["p_holm"] >= tested["p"] - 1e-12).all()
    assert tested["p_holm"].tolist() == pytest.approx(holm(tested["p"].tolist()))
    for _, r in tested.iterrows():
        assert (r["p_holm"] < ALPHA) == (not r["family_low"] <= r["target"] <= r["family_high"]), r["id"]
        if r["p_holm"] >= ALPHA:
            assert r["verdict"].endswith(("cannot be decided", "cannot be ruled out")), r["id"]
    assert (L.loc[L["kind"] == "our check", "verdict"] == "exploratory (no test)").all()
    accuracy = L[L["kind"] == "accuracy"]
    for reading in ("default", "literal"):  # both readings of Algorithm 2, every claim tested twice
        ids = set(accuracy.loc[accuracy["reading"] == reading, "id"])
        assert ids == {f"{k}-{reading}-{g}" for k, g in [("gain-best", "0.9"), ("paper-gain-best", "0.9"),
                                                          ("gain-fedavg", "0.9"), ("paper-gain-fedavg", "0.9"),
                                                          ("below-full", "0.9"), ("margin", "0.9"),
                                                          ("gain-best", "0.7"), ("paper-gain-best", "0.7"),
                                                          ("margin", "0.7")]}
    assert (accuracy["n"] == 8).all() and (accuracy["unit"] == "seeds").all()
    margins = accuracy[accuracy["id"].str.startswith("margin-")]  # a verdict on the margin names the margin
    assert margins["verdict"].str.contains("gain (above|below) \+7.9 %|cannot be decided").all(), margins["verdict"]
    assert (L.loc[L["kind"] == "not run here", "verdict"] == "not run here").all()
    assert set(L.loc[L["kind"] == "not run here", "setting"].str.split(",").str[0]) == {"EMNIST", "CIFAR-10"}
    for _, r in L[L["ci_low"].notna()].iterrows():  # no interval outside its quantity's range
        low = -1.0 if r["percent"] or r["scale"] in ("log_ratio", "bootstrap") else -np.inf
        assert r["ci_low"] >= low and (r["percent"] or r["scale"] != "bootstrap" or r["ci_high"] <= 2.0), r["id"]


def test_the_ledger_display_has_no_raw_names_or_nans(committed):
    html = ledger.display(committed).to_html()
    import re

    assert not re.findall(r"(?<![\w-])-\d", html)  # every negative number with a true minus sign
    for raw in ("nan", "None", "gain-best", "fedsteer_", "NaN"):
        assert raw not in html, raw
