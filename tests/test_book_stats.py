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


# ------------------------------------------------------------------ paired comparisons as one family
def _runs(label: str, accs: dict[float, tuple], **params) -> pd.DataFrame:
    """Runs of one method: per gamma, one final accuracy per seed 0, 1, ..."""
    spec = method(label, **params)
    return pd.DataFrame([{"dataset": "fmnist", "gamma": g, "seed": s, "final_accuracy": a, "collapsed": False,
                          "method": spec.name, "label": spec.label, **method_columns(spec)}
                         for g, values in accs.items() for s, a in enumerate(values)])


A6 = (0.80, 0.82, 0.81, 0.83, 0.80, 0.84)
B6 = (0.75, 0.76, 0.77, 0.77, 0.75, 0.78)  # a − b = 0.05, 0.06, 0.04, 0.06, 0.05, 0.06


