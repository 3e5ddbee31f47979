"""The measurements of chapters 4, 5 and 8 (fedsteer_lib.book.server_memory, variance,
coordinates): J on Gram matrices, selection comparisons, the server-memory table, probe summaries
and coordinate-stability measures."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from fedsteer_lib.book import coordinates, server_memory, variance
from fedsteer_lib.book.methods import label_without_warmup
from fedsteer_lib.experiments.config import Diagnostics, FLSystem, RunConfig, Training, method
from fedsteer_lib.simulator.engine import RunResult, prepare, run
from fedsteer_lib.experiments.results import save_run


# --- server memory (the ledger, chapters 4 and 10) -------------------------------------------
@pytest.mark.parametrize("spec,k", [(method("fedsteer", core_size=3), 3), (method("fedsteer", core_size=7), 7),
                                    (method("fedvarp"), None), (method("fedstale"), None), (method("mifa"), None),
                                    (method("scaffold"), None), (method("fedavg"), None)])
def test_state_bytes_measured_on_meta_equal_real_tensors_and_the_formula(spec, k):
    n, d = 12, 50
    meta = server_memory.state_bytes(spec, n, d)
    assert meta == server_memory.state_bytes(spec, n, d, device="cpu")  # meta tensors: same shapes and dtypes
    assert meta == server_memory.memory_formula(spec.name, n, d, k)


def test_memory_formula_scales_as_section_8_2_says():
    """FedVARP's state grows as N d, FedSteer's as N k + k d (chapter 4 draws it against N, the
    ledger's memory rows read it)."""
    d = 1_600_000
    varp = {n: server_memory.state_bytes(method("fedvarp"), n, d) for n in (100, 10_000)}
    steer = {n: server_memory.state_bytes(method("fedsteer", core_size=10), n, d) for n in (100, 10_000)}
    assert varp[10_000] == 100 * varp[100]  # O(N d)
    assert steer[10_000] < 1.02 * steer[100]  # O(N k + k d), dominated by k d
    assert 9.9 < varp[100] / steer[100] <= 10.0  # the paper's "around 10 times" at N = 100, |X| = 10
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


