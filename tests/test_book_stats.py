"""The paired t-test, Holm's correction and the verdict rule, against printed tables and by hand;
paired comparisons as one family."""
import math

import numpy as np
import pandas as pd
import pytest

from fedsteer_lib.book import stats
from fedsteer_lib.experiments.config import method
from fedsteer_lib.experiments.results import method_columns


@pytest.mark.parametrize("t, df, p", [
    (12.706, 1, 0.05), (4.303, 2, 0.05), (2.776, 4, 0.05), (2.365, 7, 0.05), (3.499, 7, 0.01),
    (2.228, 10, 0.05), (1.0, 1, 0.5), (0.0, 5, 1.0)])  # two-sided critical values of Student's t tables
def test_t_p_values_match_the_printed_table(t, df, p):
    assert stats.t_two_sided_p(t, df) == pytest.approx(p, abs=2e-4)
    assert stats.t_two_sided_p(-t, df) == pytest.approx(p, abs=2e-4)


def test_t_p_value_tends_to_the_normal():
    assert stats.t_two_sided_p(1.959964, 100000) == pytest.approx(0.05, abs=1e-4)
    with pytest.raises(ValueError, match="df"):
        stats.t_two_sided_p(1.0, 0)


def test_paired_t_test_by_hand():
    d = [0.02, 0.04, 0.01, 0.03]
    out = stats.paired_t_test(d)
    se = np.std(d, ddof=1) / 2
    assert out["mean"] == pytest.approx(0.025) and out["se"] == pytest.approx(se)
    assert out["t"] == pytest.approx(0.025 / se)
    assert out["p"] == pytest.approx(stats.t_two_sided_p(0.025 / se, 3))
    assert math.isnan(stats.paired_t_test([0.1])["p"])


def test_holm_by_hand():
    adjusted = stats.holm([0.01, 0.04, 0.03, float("nan"), 0.005])
    assert adjusted[:3] == pytest.approx([0.03, 0.06, 0.06]) and adjusted[4] == pytest.approx(0.02)
    assert math.isnan(adjusted[3])


def test_verdict_words_need_five_seeds_and_the_corrected_test():
    strong = [0.05, 0.06, 0.04, 0.05, 0.07, 0.05]  # clearly positive, n = 6
    weak = [0.01, -0.02, 0.03, 0.00, -0.01, 0.02]
    few = [0.05, 0.06, 0.05]  # as clear, but only 3 seeds
    v = stats.tested_verdicts([strong, weak, few])
    assert list(v["verdict"]) == ["FedSteer higher", "no clear difference", "indicative (n = 3, no test)"]
    assert math.isnan(v.loc[2, "p_holm"])  # the indicative comparison does not enter the family
    assert v.loc[0, "p_holm"] == pytest.approx(min(1, 2 * v.loc[0, "p"]))  # a family of two
    assert stats.tested_verdicts([[-x for x in strong]])["verdict"][0] == "FedSteer lower"
    # an empty family: no rows, every column (its callers read them without a special case)
    assert stats.tested_verdicts([]).empty and list(stats.tested_verdicts([]).columns) == ["n", "mean", "se", "t", "p", "p_holm", "verdict"]


# ------------------------------------------------------------------ paired comparisons as one family
def _runs(label: str, accs: dict[float, tuple], **params) -> pd.DataFrame:
    """Runs of one method: per gamma, one final accuracy per seed 0, 1, ..."""
    spec = method(label, **params)
    return pd.DataFrame([{"dataset": "fmnist", "gamma": g, "seed": s, "final_accuracy": a, "collapsed": False,
                          "method": spec.name, "label": spec.label, **method_columns(spec)}
                         for g, values in accs.items() for s, a in enumerate(values)])


A6 = (0.80, 0.82, 0.81, 0.83, 0.80, 0.84)
B6 = (0.75, 0.76, 0.77, 0.77, 0.75, 0.78)  # a − b = 0.05, 0.06, 0.04, 0.06, 0.05, 0.06


def test_paired_comparison_pairs_by_seed_and_tests():
    a = _runs("fedsteer", {0.9: A6, 0.7: (0.5, 0.6)})
    b = _runs("fedavg", {0.9: B6, 0.7: (0.4, 0.3)})
    p = stats.paired_comparison(a, b, "A", "B").set_index("gamma")
    d = np.array(A6) - np.array(B6)
    assert p.loc[0.9, "difference"] == pytest.approx(0.32 / 6) and p.loc[0.9, "n"] == 6
    assert p.loc[0.9, "differences"] == pytest.approx(tuple(d))
    se = np.std(d, ddof=1) / math.sqrt(6)
    assert p.loc[0.9, "s.e."] == pytest.approx(se)
    assert p.loc[0.9, "p"] == pytest.approx(stats.t_two_sided_p((0.32 / 6) / se, 5))
    assert p.loc[0.9, "A"] == pytest.approx(np.mean(A6)) and p.loc[0.9, "std b"] == pytest.approx(np.std(B6, ddof=1))
    assert p.loc[0.9, "wins"] == "6/6" and p.loc[0.9, "pair"] == ("A", "B")
    assert p.loc[0.7, "differences"] == pytest.approx((0.1, 0.3)) and p.loc[0.7, "wins"] == "2/2"
    one = stats.paired_comparison(a[a["seed"] == 0], b, "A", "B")  # a seed missing on one side is not paired
    assert set(one["n"]) == {1} and one["p"].isna().all() and one["s.e."].isna().all()
    assert "verdict" not in p  # a verdict needs the family (family_verdicts)


def test_family_verdicts_holm_over_the_tested_rows_only():
    table = pd.DataFrame({"gamma": [0.9, 0.9, 0.7, 0.7], "comparison": ["A vs B", "C vs D", "E vs F", "G vs H"],
                          "n": [8, 8, 2, 8], "difference": [0.05, -0.04, 0.30, 0.01],
                          "p": [0.004, 0.02, 0.001, 0.30], "pair": [("A", "B"), ("C", "D"), ("E", "F"), ("G", "H")]})
    v = stats.family_verdicts(table)
    # the family is rows 0, 1, 3 (n >= 5): sorted 0.004, 0.02, 0.30 -> 0.012, 0.04, 0.30
    assert v.loc[0, "p_holm"] == pytest.approx(0.012) and v.loc[1, "p_holm"] == pytest.approx(0.04)
    assert v.loc[3, "p_holm"] == pytest.approx(0.30) and math.isnan(v.loc[2, "p_holm"])
    assert list(v["verdict"]) == ["A higher than B", "C lower than D", "indicative (n = 2, no test)",
                                  "no clear difference between G and H"]
    assert list(v["significant"]) == [True, True, False, False]
    # one more tested comparison in the family: 0.02 * 3 = 0.06 is no longer below 0.05
    bigger = stats.family_verdicts(pd.concat([table, table.iloc[[3]].assign(p=0.5)], ignore_index=True))
    assert bigger.loc[1, "p_holm"] == pytest.approx(0.06) and bigger.loc[1, "verdict"] == "no clear difference between C and D"


def test_family_verdicts_of_no_comparison():
    out = stats.family_verdicts(pd.DataFrame())
    assert out.empty and {"p_holm", "significant", "verdict"} <= set(out.columns)
