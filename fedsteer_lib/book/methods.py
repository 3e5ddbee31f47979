"""How the book reads a run's method: its Table 1 row (role) and its name for reading.

A run's method is read from its table's columns: `results.runs_table` and `results.history_table`
carry `method` and one column per method parameter (`results.METHOD_PARAMETERS`);
`method_specs` turns those columns back into `config.MethodSpec`s, and `role` / `method_name`
work on specs. Names, colours and the order come from `experiments.registry`, nowhere else.

A method's *role* is its named row in the book's tables (`registry.ROLES`: Table 1's
"fedsteer", "fedsteer_enforce5", "fedavg", "fedstale", ..., and the literal reading
"fedsteer_as_written" and the FedStale code base's conventions); `role(spec, dataset)` maps a
method to it (warm-up length and the data set's default |X| and lambda do not change the role;
any other variant has none).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ..experiments.config import DATASET_DEFAULTS, METHOD_DEFAULTS, MethodSpec, method
from ..experiments.registry import METHODS, role_of
from ..experiments.registry import display_name as registered_name
from ..experiments.results import METHOD_PARAMETERS

__all__ = ["role", "method_specs", "roles", "method_name"]

_GREEK = (("beta=", "β="), ("lam=", "λ="), ("core_size=", "|X|="), ("refresh_every=", "enforce="))


# ------------------------------------------------------------------------------ a run's method
def role(spec: MethodSpec, dataset: str | None = None) -> str | None:
    """The named row of a method (`experiments.registry.role_of`), or None for a variant that
    has none. Warm-up length is ignored for FedSteer (the quick profile shortens it);
    for FedVARP and MIFA a warm-up is the fair-start variant (no role). With `dataset`,
    FedSteer's |X| and lambda must be that data set's defaults (`config.DATASET_DEFAULTS`)."""
    if spec.name == "fedsteer":
        dd = DATASET_DEFAULTS[dataset] if dataset is not None else {"core_size": spec.get("core_size"), "lam": spec.get("lam")}
        expected = {"core_size": dd["core_size"], "lam": dd["lam"]}
    else:
        expected = {}
    return role_of(spec.name, dict(spec.params), expected)


def _value(default: Any, value: Any) -> Any:
    """A table cell as the config held it: NaN/None -> None, numpy scalars -> Python, a float
    standing for an integer parameter (a column upcast next to missing values) -> int."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _spec(name: str, values: tuple) -> MethodSpec:
    own = METHOD_DEFAULTS[name]
    params = {k: _value(own[k], v) for k, v in zip(METHOD_PARAMETERS, values) if k in own}
    return method(name, **{k: v for k, v in params.items() if v is not None})


def method_specs(table: pd.DataFrame) -> pd.Series:
    """The `MethodSpec` of every row of a runs or history table, from its `method` column and its
    method parameter columns (`results.METHOD_PARAMETERS`; a missing value is the default)."""
    cols = ["method", *METHOD_PARAMETERS]
    lacking = [c for c in cols if c not in table.columns]
    if lacking:
        raise ValueError(f"the table lacks the method columns {lacking}; make it with results.runs_table "
                         "or results.history_table")
    cache: dict[tuple, MethodSpec] = {}
    out = []
    for name, *values in table[cols].itertuples(index=False, name=None):
        key = (name, *(None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values))
        if key not in cache:
            cache[key] = _spec(name, tuple(values))
        out.append(cache[key])
    return pd.Series(out, index=table.index, dtype=object)


def roles(table: pd.DataFrame) -> pd.Series:
    """`role` of every row of a runs table (each row's own data set)."""
    if table.empty:
        return pd.Series([], index=table.index, dtype=object)
    return pd.Series([role(s, ds) for s, ds in zip(method_specs(table), table["dataset"])], index=table.index,
                     dtype=object)


def method_name(spec: MethodSpec, dataset: str | None = None) -> str:
    """A method's name for reading: its Table 1 role's display name where it has one (FedStale
    with its β), else the registry's display name with the parameters that differ from the
    defaults ('FedSteer (λ=0.0, |X|=10)'). FedSteer's warm-up length, which only the profile
    sets, names no variant."""
    r = role(spec, dataset)
    if r == "fedstale":
        return f"{METHODS['fedstale'].display} (β={spec.get('beta'):g})"
    if r is not None:
        return registered_name(r)
    own = METHOD_DEFAULTS[spec.name]
    changed = [(k, v) for k, v in spec.params if own.get(k) != v and not (spec.name == "fedsteer" and k == "warmup_cycles")]
    if not changed:
        return METHODS[spec.name].display
    args = ", ".join(f"{k}={v}" for k, v in changed)
    for old, new in _GREEK:
        args = args.replace(old, new)
    return f"{METHODS[spec.name].display} ({args})"
