"""How the book shows a method: its Table 1 row (role), its name, its place in the order and its
colour. Everything that maps a run to a row, a name or a colour lives here, in one module, so
that it can later be fed from a single method registry.

A run's method is read from its table's columns: `results.runs_table` and `results.history_table`
carry `method` and one column per method parameter (`results.METHOD_PARAMETERS`);
`method_specs` turns those columns back into `config.MethodSpec`s, and `role` / `clean_label` /
`table_name` work on specs. Nothing is parsed back from a label string. The `label` column
stays for display: `label_name`, `method_order`, `palette` and `method_display` turn label
strings into names, an order and colours (Table 1, Fig. 4-7, chapter 5's variance figures).

Roles
-----
A method's *role* is its row in Table 1 (`TABLE1_ROLES`): "fedsteer", "fedsteer_enforce5", "fedavg",
"fedstale", ...; `role(spec, dataset)` maps a method to it (warm-up length and the data set's
default |X| and lambda do not change the role; any other variant has none).
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pandas as pd
import seaborn as sns

from ..experiments.config import DATASET_DEFAULTS, METHOD_DEFAULTS, MethodSpec, method
from ..experiments.registry import METHODS as REGISTRY
from ..experiments.registry import TABLE1_ROLES, role_of
from ..experiments.registry import display_name as registered_name
from ..experiments.results import METHOD_PARAMETERS

__all__ = [
    "ROLE_NAMES", "label_name", "BASELINES", "FEDSTEER_ROLES", "role", "method_specs", "roles", "by_role", "clean_label", "label_without_warmup", "table_name", "method_order", "palette",
]

# Table 1's rows, their names and the method names all come from `experiments.registry`.
ROLE_NAMES: dict[str, str] = {r: registered_name(r) for r in TABLE1_ROLES}
FEDSTEER_ROLES: tuple[str, ...] = tuple(r for r in TABLE1_ROLES if r.startswith("fedsteer"))
BASELINES: tuple[str, ...] = tuple(r for r in TABLE1_ROLES if r not in FEDSTEER_ROLES and r != "full")

_NAMES = {name: info.display for name, info in REGISTRY.items()}
_ORDER = list(REGISTRY)  # the registry lists the methods in the book's order


# ------------------------------------------------------------------------------ a run's method
def _changed(spec: MethodSpec) -> set[str]:
    """The parameters of `spec` that differ from `config.METHOD_DEFAULTS`' defaults."""
    return {k for k, default in METHOD_DEFAULTS.get(spec.name, {}).items() if spec.get(k) != default}


def role(spec: MethodSpec, dataset: str | None = None) -> str | None:
    """The Table 1 row of a method (`experiments.registry.role_of`), or None for a variant that
    is not in Table 1. Warm-up length is ignored for FedSteer (the quick profile shortens it);
    for FedVARP and MIFA a warm-up is the fair-start variant (no role). With `dataset`,
    FedSteer's |X| and lambda must be that data set's defaults (`config.DATASET_DEFAULTS`)."""
    if spec.name == "fedsteer":
        dd = DATASET_DEFAULTS[dataset] if dataset is not None else {"core_size": spec.get("core_size"), "lam": spec.get("lam")}
        expected = {"core_size": dd["core_size"], "lam": dd["lam"]}
    else:
        expected = {}
    r = role_of(spec.name, dict(spec.params), expected)
    return r if r in TABLE1_ROLES else None


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


def by_role(runs: pd.DataFrame, r: str) -> pd.DataFrame:
    """The rows of a runs table whose method has Table 1 role `r` (all FedStale βs for "fedstale")."""
    if runs.empty:
        return runs
    return runs[roles(runs) == r]


def label_without_warmup(spec: MethodSpec) -> str:
    """The method's label without its warm-up length (which only the profile sets), e.g.
    fedsteer with refresh_every=5, warmup_cycles=2 -> 'fedsteer(refresh_every=5)'."""
    own = METHOD_DEFAULTS[spec.name]
    if "warmup_cycles" not in own:
        return spec.label
    params = tuple((k, own[k] if k == "warmup_cycles" else v) for k, v in spec.params)
    return MethodSpec(spec.name, params).label


def clean_label(spec: MethodSpec) -> str:
    """A label for reading: FedSteer without its warm-up length (the quick profile shortens the
    warm-up of every FedSteer run alike, so it names no variant), FedStale with its β even when
    it is the default; other labels unchanged (for FedVARP and MIFA a warm-up is the fair-start
    variant). fedsteer with lam=0.0, warmup_cycles=2 -> 'fedsteer(lam=0.0)', fedstale ->
    'fedstale(beta=0.7)'."""
    if spec.name == "fedstale":
        return f"fedstale(beta={spec.get('beta')})"
    if spec.name == "fedsteer":
        return label_without_warmup(spec)
    return spec.label


def table_name(spec: MethodSpec, dataset: str | None = None) -> str:
    """A method's name for reading: its Table 1 name where it has a role (FedStale with its β),
    else `label_name` of its `clean_label`."""
    r = role(spec, dataset)
    if r is None or r == "fedstale":
        return label_name(clean_label(spec))
    return ROLE_NAMES[r]


# ------------------------------------------------------------------------------ labels for display
def label_name(label: str) -> str:
    """'fedstale(beta=0.7)' -> 'FedStale (β=0.7)', 'fedsteer(refresh_every=5)' -> 'FedSteer (enforce=5)'."""
    name, _, rest = label.partition("(")
    pretty = _NAMES.get(name, name)
    if not rest:
        return pretty
    args = rest.rstrip(")").replace("beta=", "β=").replace("lam=", "λ=").replace("core_size=", "|X|=")
    args = args.replace("refresh_every=", "enforce=")
    return f"{pretty} ({args})"


def method_order(labels: Iterable[str]) -> list[str]:
    """Labels sorted in the book's fixed method order (then alphabetically)."""
    def key(label: str):
        name = label.partition("(")[0]
        return (_ORDER.index(name) if name in _ORDER else len(_ORDER), label)
    return sorted(set(labels), key=key)


def palette(labels: Iterable[str]) -> dict[str, tuple]:
    """A stable colour per label (FedSteer variants in reds, full participation in black)."""
    ordered = method_order(labels)
    steer = [lab for lab in ordered if lab.startswith("fedsteer")]
    others = [lab for lab in ordered if not lab.startswith("fedsteer") and not lab.startswith("full")]
    out = {lab: (0.0, 0.0, 0.0) for lab in ordered if lab.startswith("full")}
    out.update(zip(steer, sns.color_palette("Reds_r", n_colors=len(steer) + 1)))
    blues_greens = [c for c in sns.color_palette("colorblind", n_colors=10) if c[0] < 0.8 or c[1] > 0.5]
    out.update(zip(others, (blues_greens * (len(others) // len(blues_greens) + 1))))
    return out
