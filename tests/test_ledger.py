"""The claims ledger (book/ledger.py): one definition of gain, one interval, one Holm family, and
the verdict words the family allows, checked by hand; then the committed ledger's invariants."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fedsteer_lib.book import ledger
from fedsteer_lib.book.stats import holm, mean_ci, t_critical


def test_gain_is_paired_by_seed_and_relative_to_the_baselines_mean():
    per_seed = pd.DataFrame({"fedsteer": [0.80, 0.90, 0.70], "fedavg": [0.70, 0.80, 0.90]}, index=[0, 1, 2])
    gains = ledger.gains_by_seed(per_seed, "fedsteer", "fedavg")
    assert gains.tolist() == pytest.approx([0.1 / 0.8, 0.1 / 0.8, -0.2 / 0.8])


def test_the_best_baseline_is_the_best_mean_among_table_1s_baselines():
    per_seed = pd.DataFrame({"fedsteer": [0.99, 0.99], "full": [0.98, 0.98], "fedavg": [0.7, 0.8],
                             "mifa": [0.76, 0.76], "fedprox": [0.5, 0.9]})
    assert ledger.best_baseline(per_seed) == "mifa"  # 0.76 > 0.75 = FedAvg's = FedProx's; FedSteer, full excluded


def test_fedstale_counts_at_its_best_beta_per_gamma():
    runs = pd.DataFrame({"gamma": [0.9] * 4 + [0.7] * 4, "role": ["fedstale"] * 8, "seed": [0, 1] * 4,
                         "label": ["fedstale(beta=0.5)"] * 2 + ["fedstale"] * 2 + ["fedstale(beta=0.5)"] * 2
                         + ["fedstale"] * 2, "final_accuracy": [0.8, 0.8, 0.6, 0.6, 0.5, 0.5, 0.7, 0.7]})
    kept = ledger.at_best_beta(runs)
    assert set(zip(kept["gamma"], kept["label"])) == {(0.9, "fedstale(beta=0.5)"), (0.7, "fedstale")}


def _claim(values, **kw) -> ledger.Claim:
    return ledger.Claim(kw.pop("id", "c"), kw.pop("kind", "accuracy"), "a claim", "§x", "setting", "paper", "06",
                        values, **kw)


def test_interval_and_test_by_hand():
    values = [0.01, 0.03, 0.02, 0.04, 0.05, 0.03, 0.02, 0.04]
    row = ledger._assemble([_claim(values)]).iloc[0]
    m, s = np.mean(values), np.std(values, ddof=1)
    half = t_critical(7) * s / math.sqrt(8)
    assert (row["estimate"], row["ci_low"], row["ci_high"]) == pytest.approx((m, m - half, m + half))
    assert row["n"] == 8 and row["p"] < 1e-3 and row["p_holm"] == pytest.approx(row["p"])  # a family of one
    assert row["verdict"] == "holds"


@pytest.mark.parametrize("values, kw, verdict", [
    ([0.01, 0.03, 0.02, 0.04, 0.05, 0.03, 0.02, 0.04], {}, "holds"),
    ([-0.01, -0.03, -0.02, -0.04, -0.05, -0.03, -0.02, -0.04], {}, "does not hold"),
    ([0.1, -0.1, 0.05, -0.08, 0.02, -0.03, 0.09, -0.04], {}, "cannot be decided"),
    ([0.01, 0.03, 0.02], {}, "indicative only"),  # fewer than MIN_UNITS units: no verdict
    ([0.02, 0.03, 0.02, 0.04, 0.05, 0.03, 0.02, 0.04], {"target": 0.079}, "does not hold"),  # "at least 7.9 %"
    ([-0.01, -0.03, -0.02, -0.04, -0.05, -0.03, -0.02, -0.04], {"direction": -1}, "holds"),  # "below"
    ([0.01, 0.03, 0.02, 0.04, 0.05, 0.03, 0.02, 0.04], {"direction": 0, "kind": "our check"}, "higher"),
    ([0.1, -0.1, 0.05, -0.08, 0.02, -0.03, 0.09, -0.04], {"direction": 0, "kind": "our check"}, "no clear difference"),
])
def test_verdict_words(values, kw, verdict):
    assert ledger._assemble([_claim(values, **kw)]).iloc[0]["verdict"] == verdict


def test_one_holm_family_over_the_whole_ledger():
    """A test that passes alone may not pass in the book's family: p is adjusted for every test."""
    weak = [0.02, 0.01, 0.03, -0.005, 0.02, 0.015, 0.01, 0.0]
    alone = ledger._assemble([_claim(weak)]).iloc[0]
    noise = [_claim([0.1, -0.1, 0.05, -0.08, 0.02, -0.03, 0.09, -0.04], id=f"n{i}") for i in range(9)]
    few = _claim([0.5, 0.6], id="few")  # indicative rows do not enter the family
    family = ledger._assemble([_claim(weak)] + noise + [few])
    first = family.iloc[0]
    assert alone["verdict"] == "holds" and alone["p"] < 0.05
    assert first["p_holm"] == pytest.approx(holm([first["p"], *family["p"].iloc[1:10]])[0])
    assert first["p_holm"] > alone["p_holm"] and first["verdict"] == "cannot be decided"
    assert math.isnan(family.iloc[-1]["p_holm"]) and family.iloc[-1]["verdict"] == "indicative only"


def test_exact_and_not_run_rows():
    rows = ledger._assemble([_claim((), kind="memory", exact=9.9, exact_holds=True),
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
    assert L["id"].is_unique and list(L.columns) == ledger.COLUMNS
    tested = L[L["p_holm"].notna()]
    assert (tested["n"] >= ledger.MIN_UNITS).all() and (tested["p_holm"] >= tested["p"] - 1e-12).all()
    assert tested["p_holm"].tolist() == pytest.approx(holm(tested["p"].tolist()))
    for _, r in tested.iterrows():
        side = r["estimate"] > r["target"]
        if r["p_holm"] >= ledger.ALPHA:
            assert r["verdict"] in ("cannot be decided", "no clear difference"), r["id"]
        elif r["kind"] == "our check":
            assert r["verdict"] == ("higher" if side else "lower"), r["id"]
        else:
            claimed = side == (r["id"] not in ("below-full-0.9", "variance-thm1", "variance-term-thm2"))
            assert r["verdict"] == ("holds" if claimed else "does not hold"), r["id"]
    accuracy = L[L["kind"] == "accuracy"]
    assert set(accuracy["id"]) == {"gain-fedavg-0.9", "below-full-0.9", "gain-best-0.9", "margin-0.9", "gain-best-0.7",
                                   "margin-0.7"}
    assert (accuracy["n"] == 8).all() and (accuracy["unit"] == "seeds").all()
    assert (L.loc[L["kind"] == "not run here", "verdict"] == "not run here").all()
    assert set(L.loc[L["kind"] == "not run here", "setting"].str.split(",").str[0]) == {"EMNIST", "CIFAR-10"}
    for mechanism in ("alignment", "variance-thm1", "variance-term-thm2", "coordinates-stable"):
        assert ledger.row(L, mechanism)["verdict"] == "indicative only"  # fewer than 5 independent runs


def test_the_ledger_display_has_no_raw_names_or_nans(committed):
    html = ledger.display(committed).to_html()
    for raw in ("nan", "None", "gain-best", "fedsteer_", "NaN"):
        assert raw not in html, raw
