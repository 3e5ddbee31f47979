"""The coordinates s_i at a refresh (fedsteer_lib.book.coordinates: the claims ledger's
"coordinates-stable" row and chapter 8): the refresh rule, the change of s_i at a refresh, by hand
and against the engine's own record. Chapter 8's summary table and figures are checked in its
hidden cells, run by nbval."""
import math

import numpy as np
import pytest

from fedsteer_lib.book import coordinates
from fedsteer_lib.experiments.config import Diagnostics, FLSystem, RunConfig, Training, method
from fedsteer_lib.simulator.engine import run


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


def test_coordinate_stability_per_refresh():
    participation = [[5], [], [], [5, 7], [], [], [5], [7]]
    s5 = np.array([[1.0, 1.0]] * 6 + [[1.0, 0.8]] * 2)  # refreshed at 0 and 6
    s7 = np.array([[0.0, 0.0]] * 3 + [[-1.0, 1.0]] * 5)  # refreshed at 3 (before: zero vector)
    events = coordinates.coordinate_stability(_payload({5: s5, 7: s7}, participation, core=[7, 9]), refresh_every=5)
    assert events[["client", "round"]].values.tolist() == [[5, 6], [7, 3]]
    assert events["in_core"].tolist() == [False, True]
    assert events["cosine"].iloc[0] == pytest.approx(1.8 / (math.sqrt(2) * math.sqrt(1.64)))
    assert events["relative_change"].iloc[0] == pytest.approx(0.2 / math.sqrt(2))
    assert math.isnan(events["cosine"].iloc[1])  # undefined against a zero vector
    assert math.isnan(coordinates.cosine(np.zeros(2), np.ones(2)))
    assert coordinates.cosine(s5[0], 2 * s5[0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="track_coords"):
        coordinates.coords_histories({"extras": {}})


def test_refresh_rule_matches_the_engines_coordinate_record():
    config = RunConfig(method=method("fedsteer", core_size=5, warmup_cycles=2, max_swaps=3, refresh_every=2),
                       system=FLSystem(num_clients=20, gamma=0.7, validation_size=1000), seed=1,
                       training=Training(rounds=8, local_epochs=1, batch_size=32, client_lr=0.05, eval_every=8,
                                         eval_last=1),
                       diagnostics=Diagnostics(track_coords=tuple(range(20))))
    payload = {"extras": run(config, progress=False).extras}
    participation = payload["extras"]["participation"]
    for client, h in coordinates.coords_histories(payload).items():  # s_i changes at refresh rounds only
        allowed = set(coordinates.refresh_rounds(participation[: h.shape[0]], client, 2))
        assert all(np.array_equal(h[t], h[t - 1]) or t in allowed for t in range(1, h.shape[0])), client
    events = coordinates.coordinate_stability(payload, 2)
    assert len(events) > 0
    assert (events["relative_change"] > 0).all()  # every refresh with a 'before' changes s_i
