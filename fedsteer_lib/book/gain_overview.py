"""FedSteer's paired gain in every setting of chapter 9 at a glance: one table, setting by gamma,
with one column per convention set and the paper's gain beside them. Built from the
`conventions.paired_gains` tables the chapter computes anyway.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from .conventions import _CONVENTION_NAMES
from .paper import paper_value_for

__all__ = ["gain_overview"]


def gain_overview(gains_by_setting: Mapping[str, pd.DataFrame], dataset: str = "fmnist",
                  steer: str = "FedSteer (as written)") -> pd.DataFrame:
    """One row per (setting, gamma), highest gamma first: FedSteer's (`steer`) relative gain over
    each convention set's best baseline, that baseline, seeds won and the verdict of the setting's
    own Holm family (`gains_by_setting`: setting in words -> its `paired_gains`, through
    `conventions.withhold_verdicts` while its runs are coming in), and the paper's relative gain
    over its best baseline. "—" where a setting has no such pair."""
    rows = []
    for setting, gains in gains_by_setting.items():
        mine = gains[gains["fedsteer"] == steer]
        for gamma in sorted(set(mine["gamma"]), reverse=True):
            paper = paper_value_for(dataset, gamma, "gain_vs_best_baseline", "fedsteer")
            row = {"setting": setting, "γ": f"{gamma:g}"}
            for conv, name in _CONVENTION_NAMES.items():
                r = mine[np.isclose(mine["gamma"], gamma) & (mine["convention"] == conv)]
                if r.empty:
                    row[name] = "—"
                    continue
                r = r.iloc[0]
                row[name] = (f"{100 * r['relative_gain']:+.1f} % over {r['best_baseline']} "
                             f"({r['wins']} of {r['n']} seeds; {r['verdict']})")
            row["paper"] = "—" if np.isnan(paper) else f"{100 * paper:+.1f} %"
            rows.append(row)
    return pd.DataFrame(rows)
