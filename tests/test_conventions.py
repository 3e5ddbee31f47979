"""The conventions table, paired gains, regime summaries and the calibration rule, by hand."""
import numpy as np
import pandas as pd
import pytest

from fedsteer_lib.book import conventions as conv
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
    summary = conv.regime_summary(runs)
    cell = summary[(summary["client_lr"] == 0.1) & (summary["role"] == "fedavg")].iloc[0]
    assert cell["mean"] == pytest.approx(0.80) and cell["n"] == 2
    gains = conv.regime_gains(runs).set_index(["client_lr", "local_epochs"])
    assert gains.loc[(0.1, 2), "gain"] == pytest.approx(-0.10)
    assert gains.loc[(0.03, 1), "best_baseline"] == "FedAvg"
    # |0.45 - 0.509| = 0.059 and |0.55 - 0.509| = 0.041: the lr 0.03 cell is closest to the paper
    assert conv.calibrated_cell(summary)["client_lr"] == 0.03
    assert conv.calibrated_cell(summary[summary["role"] != "fedavg_unbiased"]) is None
    provisional = conv.describe_calibrated_cell(summary, None, 0, 0)
    assert provisional.startswith("Provisionally") and "client lr 0.03, E = 1: unbiased FedAvg 0.550 over 2 seeds" in provisional
    assert "FedAvg 0.700" in provisional and "computed so far" not in provisional
    final = {"client_lr": 0.01, "local_epochs": 1, "mean": 0.45, "n": 3, "paper": 0.509}
    text = conv.describe_calibrated_cell(summary, final, 5, 272)
    assert text.startswith("The rule picks client lr 0.01, E = 1: unbiased FedAvg 0.450 over 3 seeds (the paper: 0.509)")
    assert "5 of 272 runs computed so far" in text
    assert conv.describe_calibrated_cell(summary[summary["role"] != "fedavg_unbiased"], None, 0, 0).startswith("No cell")
