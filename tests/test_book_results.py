"""The result tables of fedsteer_lib.book (paper, stats, tables) on small hand-made tables: every
number checked against a hand computation."""
from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

from fedsteer_lib.book import methods, paper, stats, tables
from fedsteer_lib.experiments.registry import TABLE1_ROLES
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


@pytest.fixture
def runs():
    return make_runs()


@pytest.fixture
def t1(runs):
    return tables.table1(runs)


def test_every_quoted_accuracy_is_recorded():
    quoted = {"0.554", "0.509", "0.281", "0.309", "0.243", "0.314", "0.048", "0.051", "0.620", "0.622", "0.660"}
    recorded = {p.text for p in paper.PAPER if p.quantity == "final_accuracy"}
    assert quoted == recorded


def test_plain_removes_tex():
    s = paper.plain(r"On EMNIST (\(\gamma=0.9\)), size \(|\mathcal{X}| \le 30\) and Table" + "\u00a0" + "3")
    assert s == "On EMNIST (γ=0.9), size |X| ≤ 30 and Table 3"
    assert all("\\(" not in paper.plain(p.quote) for p in paper.PAPER)


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
    assert list(t1[t1["gamma"] == 0.9]["role"]) == list(TABLE1_ROLES)
    assert t1[t1["gamma"] == 0.7]["paper"].isna().all()
    # FedProx at 0.9 has one finite seed of two and one collapse
    prox = t1[(t1["gamma"] == 0.9) & (t1["role"] == "fedprox")].iloc[0]
    assert prox["n"] == 1 and prox["collapsed"] == 1


def test_table1_single_seed_has_no_interval_and_reads_well():
    one = make_runs({0.9: {k: v[:1] for k, v in ACC[0.9].items()}})
    t = tables.table1(one)
    assert t["std"].isna().all() and t["ci_low"].isna().all() and t["ci_high"].isna().all()
    shown = tables.table1_reading(t).set_index("method")
    assert list(shown.columns) == ["γ = 0.9: ours (n = 1)", "γ = 0.9: paper"]
    assert shown.loc["FedSteer", "γ = 0.9: ours (n = 1)"] == "0.600"
    assert shown.loc["FedSteer", "γ = 0.9: paper"] == "0.554"
    assert shown.loc["FedVARP", "γ = 0.9: paper"] == "—"
    assert shown.loc["FedStale (best β)", "γ = 0.9: ours (n = 1)"] == "0.500 (β = 0.6)"
    assert list(shown.index)[:2] == ["Full participation", "FedSteer"]


def test_table1_reading_gives_a_bootstrap_interval_inside_0_1_and_counts_collapsed_runs():
    rows = [{"dataset": "fmnist", "gamma": 0.9, "seed": s, "label": "scaffold", "method": "scaffold",
             "final_accuracy": a, "collapsed": c} for s, (a, c) in enumerate([(0.1, True), (0.7, False), (0.8, False)])]
    runs = pd.DataFrame(rows)
    for k in METHOD_PARAMETERS:
        runs[k] = None
    t = tables.table1(runs)
    row = t.iloc[0]
    boot = stats.estimate([0.1, 0.7, 0.8], "bootstrap")
    assert row["mean"] == pytest.approx(1.6 / 3) and row["collapsed"] == 1
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((boot["ci_low"], boot["ci_high"]))
    assert 0.1 <= row["ci_low"] < row["mean"] < row["ci_high"] <= 0.8 + 1e-12  # the t-interval would reach below 0
    assert stats.mean_ci([0.1, 0.7, 0.8])[0] - stats.mean_ci([0.1, 0.7, 0.8])[1] < 0
    cell = tables.table1_reading(t).set_index("method").loc["SCAFFOLD", "γ = 0.9: ours (n = 3)"]
    assert cell == f"0.533 [{row['ci_low']:.3f}, {row['ci_high']:.3f}]; 1 of 3 collapsed"


def test_table1_rejects_two_labels_for_one_role(runs):
    extra = as_method(runs[runs["label"] == "fedsteer"], "fedsteer(warmup_cycles=2)")
    dup = pd.concat([runs, extra])
    with pytest.raises(ValueError, match="fedsteer"):
        tables.table1(dup)


def test_table1_ignores_variants_outside_table1(runs):
    variant = as_method(runs[runs["label"] == "fedsteer"], "fedsteer(ordering=as_written)", final_accuracy=0.99)
    t = tables.table1(pd.concat([runs, variant]))
    assert t[(t["gamma"] == 0.9) & (t["role"] == "fedsteer")]["mean"].iloc[0] == pytest.approx(0.61)


def test_fmt_pct_and_fmt_num_use_one_minus_sign():
    from fedsteer_lib.book.table_display import fmt_num, fmt_pct, readable_value

    assert fmt_pct(0.088) == "+8.8 %" and fmt_pct(-0.0123) == "−1.2 %" and fmt_pct(0.025, signed=False) == "2.5 %"
    assert fmt_pct(float("nan")) == "—" and fmt_num(-0.0192) == "−0.019"
    assert readable_value(-0.0088) == "−0.0088" and readable_value(-2.9e-4) == "−2.90 × 10⁻⁴"


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
