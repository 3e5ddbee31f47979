"""The measurements of chapters 4, 5 and 8 (fedsteer_lib.book.selection, server_memory, variance,
coordinates): J on Gram matrices, selection comparisons, the server-memory table, probe summaries
and coordinate-stability measures."""
import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from fedsteer_lib.book import coordinates, selection, server_memory, variance
from fedsteer_lib.book.methods import label_without_warmup
from fedsteer_lib.experiments.config import Diagnostics, FLSystem, RunConfig, Training, method
from fedsteer_lib.coreset import SwapTrace, exhaustive_best, greedy_swap, objective
from fedsteer_lib.simulator.engine import RunResult, prepare, run
from fedsteer_lib.experiments.results import save_run
from helpers import clustered


# --- chapter 4 ---------------------------------------------------------------------------------
def test_gram_factor_reproduces_the_gram_matrix_and_the_greedy_search():
    grads, weights = clustered(25, 8, 3, seed=0, noise=0.3)  # d < N: rank-deficient Gram matrix
    gram = grads @ grads.T
    factor = selection.gram_factor(gram)
    assert torch.allclose(factor @ factor.T, gram, atol=1e-9 * float(gram.abs().max()))
    t1, t2 = SwapTrace(), SwapTrace()
    a = greedy_swap(grads, 4, weights, 0.5, max_swaps=6, seed=3, trace=t1)
    b = greedy_swap(factor, 4, weights, 0.5, max_swaps=6, seed=3, trace=t2)
    assert a == b
    assert np.allclose(t1, t2, rtol=1e-9)
    with pytest.raises(ValueError, match="square"):
        selection.gram_factor(torch.zeros(3, 4))


def test_relative_objective_is_a_fraction_of_the_energy():
    grads, weights = clustered(6, 20, 2, seed=1, noise=0.3)
    gram = grads @ grads.T
    assert selection.total_energy(gram, weights) == pytest.approx(float((weights * (grads**2).sum(1)).sum()))
    # every client in the core, no regularisation: everything is reconstructed
    assert selection.relative_objective(gram, list(range(6)), weights, 0.0) == pytest.approx(0.0, abs=1e-9)
    rel = selection.relative_objective(gram, [0, 1], weights, 0.5)
    assert 0.0 < rel < 1.0
    assert rel == pytest.approx(objective(grads, [0, 1], weights, 0.5) / selection.total_energy(gram, weights), rel=1e-9)
    rand = selection.random_core_objectives(gram, weights, 2, 0.5, draws=5)
    assert rand.shape == (5,) and ((rand > 0) & (rand < 1)).all()


def test_swap_trace_table_counts_steps_across_cycles():
    table = selection.swap_trace_table([[4.0, 3.0, 2.5], [3.0, 2.0]], energies=[10.0, 5.0])
    assert table["cycle"].tolist() == [0, 0, 0, 1, 1]
    assert table["swap"].tolist() == [0, 1, 2, 0, 1]
    assert table["step"].tolist() == [0, 1, 2, 3, 4]
    assert table["relative_J"].tolist() == pytest.approx([0.4, 0.3, 0.25, 0.6, 0.4])


def test_selection_comparison_rules():
    grads, weights = clustered(30, 40, 5, seed=2, noise=0.3)
    gram = grads @ grads.T
    grams = [gram, gram * 1.1]
    df = selection.selection_comparison(grams, weights, 4, 0.5, draws=3, max_swaps=2, n_sub=30, seed=0)
    assert set(df["selection"]) == {"random", "greedy", "subsampled", "greedy (converged)"}
    wide = df.pivot_table(index="draw", columns="selection", values="J")
    # all 30 clients as candidates: the subsampled search is the full search
    assert np.allclose(wide["subsampled"], wide["greedy"])
    assert (wide["greedy"] < wide["random"]).all()
    assert (wide["greedy (converged)"] <= wide["greedy"] + 1e-12).all()
    assert (df.loc[df["selection"] == "greedy", "swaps"] <= 2 * 2).all()
    assert (df.loc[df["selection"] == "random", "swaps"] == 0).all()
    small = selection.selection_comparison(grams, weights, 4, 0.5, draws=3, max_swaps=2, n_sub=5, converged=False, seed=0)
    assert "greedy (converged)" not in set(small["selection"])
    assert np.allclose(small.query("selection == 'random'")["J"], wide["random"])  # same initial cores
    with pytest.raises(ValueError, match="core size"):
        selection.selection_comparison(grams, weights, 31, 0.5)


def test_exhaustive_comparison_against_brute_force():
    grads, weights = clustered(20, 15, 4, seed=3, noise=0.3)
    gram = grads @ grads.T
    df = selection.exhaustive_comparison(gram, weights, n=8, k=2, lam=0.5, instances=6, seed=1)
    assert len(df) == 6
    for _, row in df.iterrows():
        ids = torch.tensor(row["clients"])
        w = weights[ids] / weights[ids].sum()
        _, j_opt = exhaustive_best(grads[ids], 2, w, 0.5)
        assert row["J_opt"] == pytest.approx(j_opt, rel=1e-9)
        assert row["J_greedy"] >= row["J_opt"] * (1 - 1e-9)
        assert row["J_random"] >= row["J_opt"] * (1 - 1e-9)
        assert row["hit"] == (row["gap"] <= 1e-9)
    big, big_w = clustered(30, 10, 3, seed=4, noise=0.3)
    with pytest.raises(ValueError, match="too many"):
        selection.exhaustive_comparison(big @ big.T, big_w, n=30, k=8)  # C(30, 8) > 200,000


@pytest.mark.parametrize("spec,k", [(method("fedsteer", core_size=3), 3), (method("fedsteer", core_size=7), 7),
                                    (method("fedvarp"), None), (method("fedstale"), None), (method("mifa"), None),
                                    (method("scaffold"), None), (method("fedavg"), None)])
def test_state_bytes_measured_on_meta_equal_real_tensors_and_the_formula(spec, k):
    n, d = 12, 50
    meta = server_memory.state_bytes(spec, n, d)
    assert meta == server_memory.state_bytes(spec, n, d, device="cpu")  # meta tensors: same shapes and dtypes
    assert meta == server_memory.memory_formula(spec.name, n, d, k)


def test_server_memory_table_checks_the_ten_times_claim():
    specs = [method("fedsteer", core_size=10), method("fedvarp"), method("scaffold")]
    table = server_memory.server_memory_table(specs, [100, 10_000], {"big": 1_600_000})
    assert len(table) == 6
    assert (table["bytes"] == table["formula_bytes"]).all()
    row = table.query("N == 100 and method == 'fedsteer'").iloc[0]
    assert 9.9 < 1 / row["fraction_of_fedvarp"] <= 10.0
    varp = table.query("method == 'fedvarp'").set_index("N")["bytes"]
    assert varp[10_000] == 100 * varp[100]  # O(N d)
    steer = table.query("method == 'fedsteer'").set_index("N")["bytes"]
    assert steer[10_000] < 1.02 * steer[100]  # O(N k + k d), dominated by k d
    assert row["label"] == "FedSteer (|X|=10)"
    with pytest.raises(ValueError, match="core size"):
        server_memory.memory_formula("fedsteer", 10, 10)


# --- chapter 5 ---------------------------------------------------------------------------------
def test_label_without_warmup_drops_only_the_warmup_length():
    assert label_without_warmup(method("fedsteer", refresh_every=5, warmup_cycles=2)) == "fedsteer(refresh_every=5)"
    assert label_without_warmup(method("fedsteer", warmup_cycles=2)) == "fedsteer"
    assert label_without_warmup(method("fedvarp", warmup_cycles=5)) == "fedvarp"
    assert label_without_warmup(method("fedstale", beta=0.5)) == "fedstale(beta=0.5)"
    assert label_without_warmup(method("fedavg")) == "fedavg"


def _fake_probe_run(root, spec, gamma, rows, collapsed=False):
    config = RunConfig(method=spec, system=FLSystem(gamma=gamma), training=Training(rounds=10),
                       diagnostics=Diagnostics(probe_every=5)).validate()
    probes = []
    for t, (mse, var, bias, exact) in rows.items():
        probes.append({"round": t, "client": -1, "mc_variance": var, "exact_variance": exact, "mse_to_mean": mse,
                       "bias_norm": math.sqrt(bias), "target_norm": 2.0})
        probes.append({"round": t, "client": 0, "staleness": 1, "cos_stale": 0.5, "cos_estimate": 0.9, "true_norm": 1.0})
    result = RunResult(config=config.to_dict(), history=[], summary={"collapsed": collapsed, "accuracy_before_collapse": 0.5 if collapsed else None}, extras={"probes": probes})
    save_run(result, config, root)
    return config


def test_probe_table_and_time_average(tmp_path):
    a = _fake_probe_run(tmp_path, method("fedvarp"), 0.9, {0: (4.0, 4.0, 0.0, 4.2), 5: (2.0, 2.0, 0.0, 1.8)})
    b = _fake_probe_run(tmp_path, method("fedsteer", warmup_cycles=2), 0.9,
                        {0: (1.0, 0.5, 0.5, float("nan")), 5: (2.0, 1.0, 1.0, float("nan"))})
    c = _fake_probe_run(tmp_path, method("fedavg"), 0.7, {0: (9.0, 9.0, 0.0, float("nan"))}, collapsed=True)
    table = variance.variance_probe_table([a, b, c], tmp_path)
    assert len(table) == 5  # only the client = -1 rows
    assert set(table["label"]) == {"fedvarp", "fedsteer", "fedavg"}  # warm-up length dropped
    assert table["exact_variance"].isna().sum() == 3  # stored as null, read back as NaN
    assert table["bias_sq"].tolist() == pytest.approx([0.0, 0.0, 0.5, 1.0, 0.0])
    assert table["relative_mse"].iloc[0] == pytest.approx(1.0)  # 4 / 2^2
    summary = variance.variance_term_summary(table).set_index(["gamma", "label"])
    assert summary.loc[(0.9, "fedvarp"), "term"] == pytest.approx(3.0)
    assert summary.loc[(0.9, "fedsteer"), "term"] == pytest.approx(1.5)
    assert summary.loc[(0.9, "fedsteer"), "rank"] == 1 and summary.loc[(0.9, "fedvarp"), "rank"] == 2
    assert summary.loc[(0.9, "fedvarp"), "ratio_to_smallest"] == pytest.approx(2.0)
    assert summary.loc[(0.7, "fedavg"), "rank"] == 1  # ranks are per gamma
    assert summary.loc[(0.7, "fedavg"), "collapsed_runs"] == 1
    no_probes = RunConfig(method=method("mifa"), training=Training(rounds=3)).validate()
    save_run(RunResult(config=no_probes.to_dict(), history=[], summary={"collapsed": False}, extras={}), no_probes, tmp_path)
    with pytest.raises(ValueError, match="no probes"):
        variance.variance_probe_table([no_probes], tmp_path)


# --- chapter 8 ---------------------------------------------------------------------------------
def test_refresh_rounds_follow_the_enforce_rule():
    participation = [[1], [1, 2], [], [1], [], [], [1], [1], [2]]
    assert coordinates.refresh_rounds(participation, 1, 5) == [0, 6]
    assert coordinates.refresh_rounds(participation, 1, 1) == [0, 1, 3, 6, 7]
    assert coordinates.refresh_rounds(participation, 2, 5) == [1, 8]
    assert coordinates.refresh_rounds(participation, 2, 8) == [1]
    assert coordinates.refresh_rounds(participation, 3, 5) == []
    with pytest.raises(ValueError):
        coordinates.refresh_rounds(participation, 1, 0)


def test_coordinate_changes_by_hand():
    h = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0], [0.0, 2.0]])
    df = coordinates.coordinate_changes(h, [0, 2, 3, 9])  # round 0 has no 'before'; 9 is past the record
    assert df["round"].tolist() == [2, 3]
    assert df["cosine"].tolist() == pytest.approx([0.0, 1.0])
    assert df["relative_change"].tolist() == pytest.approx([math.sqrt(5.0), 0.0])


def _payload(histories, participation, core=()):
    return {"extras": {"coords_history": {str(c): h.tolist() for c, h in histories.items()},
                       "participation": participation, "core": list(core)}}


def test_stability_summary_and_consistency_check():
    participation = [[5], [], [], [5, 7], [], [], [5], [7]]
    s5 = np.array([[1.0, 1.0]] * 6 + [[1.0, 0.8]] * 2)  # refreshed at 0 and 6
    s7 = np.array([[0.0, 0.0]] * 3 + [[-1.0, 1.0]] * 5)  # refreshed at 3 (before: zero vector)
    payload = _payload({5: s5, 7: s7}, participation, core=[7, 9])
    events = coordinates.coordinate_stability(payload, refresh_every=5)
    assert events[["client", "round"]].values.tolist() == [[5, 6], [7, 3]]
    assert events["in_core"].tolist() == [False, True]
    assert events["cosine"].iloc[0] == pytest.approx(1.8 / (math.sqrt(2) * math.sqrt(1.64)))
    assert math.isnan(events["cosine"].iloc[1])  # undefined against a zero vector
    assert coordinates.unexplained_changes(payload, 5) == 0
    summary = coordinates.stability_summary({"setting": payload}, refresh_every=5).iloc[0]
    assert summary["refreshes"] == 2 and summary["tracked_in_core"] == "7"
    assert summary["unexplained_changes"] == 0
    assert summary["first_last_cosine"] == pytest.approx(np.nanmedian([1.8 / (math.sqrt(2) * math.sqrt(1.64)), np.nan]))
    verdict = coordinates.stability_verdict(coordinates.stability_summary({"a": payload, "b": _payload({5: s5[:2]}, participation)}, 5)
                                   .set_index("setting"), min_cosine=0.9, max_change=0.5)
    assert verdict.loc["b", "stable"] is None  # no refresh observed
    assert verdict.loc["a", "stable"] is True  # cosine 0.994, change 0.14 (the zero-vector event is NaN, skipped)
    assert "-> stable" in verdict.loc["a", "message"]
    strict = coordinates.stability_verdict(coordinates.stability_summary({"a": payload}, 5).set_index("setting"), min_cosine=0.999,
                                  max_change=0.5)
    assert strict.loc["a", "stable"] is False and "NOT stable" in strict.loc["a", "message"]
    small_change = coordinates.stability_verdict(coordinates.stability_summary({"a": payload}, 5).set_index("setting"), min_cosine=0.9,
                                        max_change=0.1)
    assert small_change.loc["a", "stable"] is False
    broken = _payload({5: np.array([[1.0, 1.0]] * 4 + [[2.0, 1.0]] * 4), 7: s7}, participation)
    assert coordinates.unexplained_changes(broken, 5) == 1  # s_5 changed at round 4 without a refresh
    with pytest.raises(ValueError, match="track_coords"):
        coordinates.coords_histories({"extras": {}})


# --- against the real engine (small system on Fashion-MNIST) ------------------------------------
def _small_config(**kw):
    params = dict(core_size=5, warmup_cycles=2, max_swaps=3)
    params.update(kw)
    return RunConfig(method=method("fedsteer", **params), system=FLSystem(num_clients=20, gamma=0.7), seed=1,
                     training=Training(rounds=8, local_epochs=1, batch_size=32, client_lr=0.05, eval_every=8, eval_last=1))


@pytest.fixture(scope="module")
def small_sim():
    return prepare(_small_config())


def test_warmup_record_replays_the_engines_warmup(small_sim):
    config = _small_config().replace(training=Training(rounds=1, local_epochs=1, eval_every=1, eval_last=1))
    record = selection.warmup_record(small_sim, config)
    result = run(config, progress=False, sim=dataclasses.replace(small_sim, warmup=None))  # computed anew
    assert record.traces == result.extras["swap_trace"]
    assert record.cores[-1] == result.extras["core"]
    assert record.cycles == 2 and record.num_clients == 20 and record.k == 5
    for gram, trace, core in zip(record.grams, record.traces, record.cores):
        assert gram.shape == (20, 20) and torch.allclose(gram, gram.T)
        assert selection.relative_objective(gram, core, record.weights, record.lam) * selection.total_energy(gram, record.weights) \
            == pytest.approx(trace[-1], rel=1e-9)
    with pytest.raises(ValueError, match="fedsteer"):
        selection.warmup_record(small_sim, config.replace(method=method("fedvarp")))


def test_refresh_rule_matches_the_engines_coordinate_record(small_sim):
    config = _small_config(refresh_every=2).replace(diagnostics=Diagnostics(track_coords=tuple(range(20))))
    result = run(config, progress=False, sim=small_sim)
    payload = {"extras": result.extras}
    assert coordinates.unexplained_changes(payload, 2) == 0
    events = coordinates.coordinate_stability(payload, 2)
    assert len(events) > 0
    assert (events["relative_change"] > 0).all()  # every refresh with a 'before' changes s_i


# --- display: the book column's figures and readable tables ------------------------------------
def _texts_at_least(fig, size):
    from matplotlib.text import Text
    fig.canvas.draw()
    return all(t.get_fontsize() >= size for t in fig.findobj(Text) if t.get_text())


def test_readable_value_and_table():
    from fedsteer_lib.book.table_display import mean_std_text, readable_table, readable_value
    assert [readable_value(v) for v in (0.81275, 0.9, 3.2e-6, 12345.6, 7, True, False, None, float("nan"))] == [
        "0.813", "0.9", "3.20 × 10⁻⁶", "12,346", "7", "yes", "no", "—", "—"]
    assert readable_value(float(np.float32(0.04))) == "0.04" and readable_value(0.99996) == "1.000"
    assert mean_std_text(0.81275, 0.0123, 8) == "0.813 ± 0.0123 (n = 8)" and "± —" in mean_std_text(0.5, 0.0, 1)
    assert mean_std_text(0.81275, 0.0123, 8, with_n=False) == "0.813 ± 0.0123" and mean_std_text(float("nan"), 0.1, 3) == "—"
    table = pd.DataFrame({"a": [0.81275, np.nan], "b": [True, None]}, index=[10, 11])
    html = readable_table(table).to_html()
    assert html == readable_table(table).to_html()  # a fixed id: nbval compares it
    assert "0.813" in html and "—" in html and "yes" in html and ">10<" not in html and "nan" not in html


def test_fit_to_column_shrinks_and_raises_small_text():
    import matplotlib.pyplot as plt
    from fedsteer_lib.book.figures import style
    fig, ax = plt.subplots(figsize=(12, 4))
    ax.plot([0, 1], [0, 1], label="a")
    ax.legend(fontsize=6)
    ax.set_title("t", fontsize=7)
    style.fit_to_column(fig)
    assert fig.get_size_inches()[0] == pytest.approx(style.COLUMN_WIDTH)
    assert _texts_at_least(fig, style.MIN_FONT)
    plt.close(fig)


def test_colour_limits_ignore_outliers():
    from fedsteer_lib.book.figures.style import robust_limits, symmetric_limit
    values = np.concatenate([np.linspace(-1, 1, 500), [1e6]])
    lo, hi = robust_limits(values)
    assert -1 <= lo < 0 < hi <= 1
    assert symmetric_limit(values) <= 1 and symmetric_limit([0.0, np.nan]) == 1.0


def test_highlight_colours_are_shared_by_the_results_figures():
    from fedsteer_lib.book.figures import accuracy
    from fedsteer_lib.book.figures.style import CB, RED, highlight_colours
    colours = highlight_colours(["fedsteer", "fedsteer(refresh_every=5)", "fedavg", "mifa", "fedvarp"], best="fedvarp")
    assert list(colours) == ["fedsteer", "fedsteer(refresh_every=5)", "fedavg", "fedvarp"]  # mifa: muted
    assert colours["fedsteer"] == RED and colours["fedsteer(refresh_every=5)"] != RED
    assert colours["fedavg"] == CB[0] and colours["fedvarp"] == CB[2]
    t1 = pd.DataFrame({"role": ["fedsteer", "fedsteer_enforce5", "fedavg", "fedvarp", "mifa"],
                       "mean": [0.8, 0.79, 0.7, 0.75, 0.72]})
    # Table 1's figures colour FedSteer, FedAvg and the best baseline only, in the same colours as chapter 5's
    assert accuracy._role_colours(t1) == {"fedsteer": RED, "fedavg": CB[0], "fedvarp": CB[2]}


def test_coordinate_heatmaps_fit_the_column_and_scale_each_panel():
    import matplotlib.pyplot as plt
    from fedsteer_lib.book.figures import coordinates as coord_figs
    from fedsteer_lib.book.figures.style import COLUMN_WIDTH, MIN_FONT
    rng = np.random.default_rng(0)
    small, large = rng.normal(size=(20, 5)) * 1e-3, rng.normal(size=(20, 5)) * 1e3
    fig = coord_figs.plot_coordinate_heatmaps({"a": {1: small, 2: large}}, marks={"a": {1: [0, 5]}})
    assert fig.get_size_inches()[0] <= COLUMN_WIDTH and _texts_at_least(fig, MIN_FONT)
    shown = [ax.images[0].get_array() for ax in fig.axes if ax.images]
    assert all(np.abs(a).max() > 0.9 for a in shown)  # the small panel is not flat next to the large one
    plt.close(fig)


def test_selection_summary_reads_the_medians_per_core_size():
    grads, weights = clustered(30, 40, 5, seed=2, noise=0.3)
    gram = grads @ grads.T
    df = pd.concat([selection.selection_comparison([gram], weights, k, 0.5, draws=3, max_swaps=2, n_sub=10,
                                                   converged=(k == 3), seed=0) for k in (3, 6)], ignore_index=True)
    summary = selection.selection_summary(df).set_index("k")
    med = df.groupby(["k", "selection"])["relative_J"].median()
    for k in (3, 6):
        g, r, s = med[(k, "greedy")], med[(k, "random")], med[(k, "subsampled")]
        assert summary.loc[k, "greedy"] == g and summary.loc[k, "greedy_reduction_pct"] == pytest.approx(100 * (1 - g / r))
        assert summary.loc[k, "subsampled_keeps_pct"] == pytest.approx(100 * (r - s) / (r - g))
        assert summary.loc[k, "draws"] == 3
    assert summary.loc[3, "greedy (converged)"] == med[(3, "greedy (converged)")]
    assert math.isnan(summary.loc[6, "greedy (converged)"]) and math.isnan(summary.loc[6, "budget_leaves_pct"])


def test_variance_verdicts_state_a_difference_only_beyond_the_seed_spread():
    from fedsteer_lib.book.aggregation import variance_verdicts
    table = pd.DataFrame({"FedSteer vs unbiased FedAvg": [-0.02, 2.0, 2.1, 0.13, 2.0],  # a wide spread around +1.2
                          "FedSteer vs FedVARP": [-0.40, -0.57, -0.45, -0.34, -0.48]})
    out = variance_verdicts(table).set_index("other")
    assert out.loc["unbiased FedAvg", "verdict"] == "within run-to-run variation of"
    assert out.loc["FedVARP", "verdict"] == "lower than" and out.loc["FedVARP", "p_holm"] < 0.05
    assert out.loc["FedVARP", "text"].startswith("lower than FedVARP's (FedSteer / FedVARP − 1 = -0.448 ± ")
    few = variance_verdicts(table.head(2)).set_index("other")
    assert few.loc["FedVARP", "verdict"].startswith("not tested against") and math.isnan(few.loc["FedVARP", "p_holm"])


def test_variance_by_seed_is_theorem_1_at_each_seeds_state():
    from fedsteer_lib import projection
    from fedsteer_lib.book import aggregation, snapshots
    configs = [_small_config(core_size=4).replace(seed=s) for s in (1, 2)]
    first = snapshots.trajectory(prepare(configs[0]), configs[0].training, configs[0].method, 2, 1)
    table = aggregation.variance_by_seed(configs, 2, known={1: first}).set_index("seed")
    est = first.strategy.estimates(first.state, first.ctx)
    assert table.loc[1, "FedSteer"] == pytest.approx(projection.update_variance(first.true, est, first.ctx.weights, first.ctx.probs))
    assert table.loc[1, "FedVARP"] == pytest.approx(projection.update_variance(first.true, first.memory, first.ctx.weights,
                                                                              first.ctx.probs))
    assert np.allclose(table["FedSteer vs FedVARP"], table["FedSteer"] / table["FedVARP"] - 1)
    assert table.loc[2, "unbiased FedAvg"] != table.loc[1, "unbiased FedAvg"]  # another seed, another state
