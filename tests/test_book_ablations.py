"""The Fig. 5 rows of the claims ledger that chapter 7 shows (fedsteer_lib.book.ledger): the paper's
reading per core-set size, λ = 0.5 against λ = 0 paired by seed and pooled over γ."""
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from fedsteer_lib.book import ledger
from fedsteer_lib.experiments.config import method
from fedsteer_lib.experiments.results import method_columns


def _runs(accs: dict[float, tuple], **params) -> pd.DataFrame:
    """Runs of one method: per gamma, one final accuracy per seed 0, 1, ..."""
    spec = method("fedsteer", **params)
    return pd.DataFrame([{"dataset": "fmnist", "gamma": g, "seed": s, "final_accuracy": a, "method": spec.name,
                          "label": spec.label, **method_columns(spec)}
                         for g, values in accs.items() for s, a in enumerate(values)])


def test_fig5_rows_read_the_papers_direction_per_core_set_size():
    runs = pd.concat([
        _runs({0.9: (0.60, 0.62), 0.7: (0.80, 0.80)}, core_size=10, lam=0.5, refresh_every=5),
        _runs({0.9: (0.50, 0.51), 0.7: (0.70, 0.90)}, core_size=10, lam=0.0, refresh_every=5),
        _runs({0.9: (0.70, 0.71, 0.70)}, core_size=40, lam=0.5, refresh_every=5),
        _runs({0.9: (0.60, 0.60, 0.61)}, core_size=40, lam=0.0, refresh_every=5),
        _runs({0.9: (0.3,) * 2}, core_size=160, lam=0.5, refresh_every=5),
        _runs({0.9: (0.2,) * 2}, core_size=160, lam=0.0, refresh_every=5)])
    claims = {c.id: c for c in ledger.fig5_claims(SimpleNamespace(dataset="fmnist"), runs)}
    # |X| <= 30: lambda = 0.5 better; 40 <= |X| <= 80: lambda = 0 better; above 80 the paper gives no direction
    assert set(claims) == {"fig5-k10", "fig5-k40"}
    assert claims["fig5-k10"].direction == 1 and claims["fig5-k40"].direction == -1
    # units are (gamma, seed) pairs, each relative to lambda = 0's mean at that gamma
    assert claims["fig5-k10"].values == pytest.approx([0.10 / 0.80, -0.10 / 0.80, 0.10 / 0.505, 0.11 / 0.505])
    assert claims["fig5-k40"].values == pytest.approx(list(np.array([0.10, 0.11, 0.09]) / (1.81 / 3)))
    assert claims["fig5-k40"].unit == "(γ, seed) pairs"
