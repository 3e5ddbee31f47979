"""fedsteer_lib.book.methods: a run's Table 1 role, its labels for reading and its names, all read
from the method columns of the results tables (never parsed back from a label)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedsteer_lib.book import methods
from fedsteer_lib.experiments.registry import TABLE1_ROLES
from fedsteer_lib.experiments.config import METHOD_DEFAULTS, method, paper_methods
from fedsteer_lib.experiments.results import METHOD_PARAMETERS, method_columns


def _table(specs, dataset="fmnist") -> pd.DataFrame:
    """A runs table's method columns for `specs`, one row each."""
    return pd.DataFrame([{"dataset": dataset, "method": s.name, "label": s.label, **method_columns(s)} for s in specs])


@pytest.mark.parametrize("spec, dataset, expected", [
    (method("fedsteer"), "fmnist", "fedsteer"),
    (method("fedsteer", warmup_cycles=2), "fmnist", "fedsteer"),
    (method("fedsteer", refresh_every=5, warmup_cycles=2), "fmnist", "fedsteer_enforce5"),
    (method("fedsteer", core_size=10), "emnist", "fedsteer"),
    (method("fedsteer", core_size=10), "fmnist", None),
    (method("fedsteer", core_size=10, refresh_every=5), "emnist", "fedsteer_enforce5"),
    (method("fedsteer", ordering="as_written"), "fmnist", "fedsteer_as_written"),  # the literal reading
    (method("fedsteer", subsample=20), None, None),
    (method("fedstale", beta=0.6), "fmnist", "fedstale"),
    (method("fedvarp"), "fmnist", "fedvarp"),
    (method("fedvarp", warmup_cycles=5), "fmnist", None),
    (method("fedprox"), "fmnist", "fedprox"),
    (method("fedprox", mu=0.5), "fmnist", None),
    (method("full"), None, "full"),
])
def test_role(spec, dataset, expected):
    assert methods.role(spec, dataset) == expected
    if dataset is not None:  # the same from a runs table's columns
        assert methods.roles(_table([spec], dataset)).tolist() == [expected]


def test_paper_methods_cover_every_role():
    for dataset in ("fmnist", "emnist", "cifar10"):
        roles = [methods.role(m, dataset) for m in paper_methods(dataset)]
        assert set(roles) == set(TABLE1_ROLES)
        assert roles.count("fedstale") == 5
        assert methods.roles(_table(paper_methods(dataset), dataset)).tolist() == roles


def test_method_columns_and_specs_round_trip():
    assert list(METHOD_PARAMETERS) == list(dict.fromkeys(k for p in METHOD_DEFAULTS.values() for k in p))
    cols = method_columns(method("fedsteer", core_size=10, lam=0.0))
    assert cols["core_size"] == 10 and isinstance(cols["core_size"], int) and cols["lam"] == 0.0
    assert cols["refresh_every"] == 1  # the METHOD_DEFAULTS default
    assert cols["beta"] is None and cols["mu"] is None  # not parameters of fedsteer
    specs = [method("fedsteer", core_size=10, lam=0.0), method("fedsteer"), method("fedsteer", ordering="as_written"),
             method("fedstale", beta=0.5), method("fedavg"), method("fedprox", mu=0.5), method("mifa", start="wait_all")]
    table = _table(specs)
    back = methods.method_specs(table)
    assert list(back) == specs and [s.label for s in back] == list(table["label"])
    # a table whose integer columns were upcast to float next to missing values reads the same
    upcast = table.astype({"core_size": float, "refresh_every": float})
    assert upcast["core_size"].iloc[0] == 10.0 and np.isnan(upcast["core_size"].iloc[3])
    assert list(methods.method_specs(upcast)) == specs
    with pytest.raises(ValueError, match="method columns"):
        methods.method_specs(table.drop(columns="lam"))


# ----------------------------------------------------------------------------- book/methods.md
def _markdown_tables(text: str) -> dict[str, list[list[str]]]:
    """The pipe tables of a Markdown text, by their header row's second cell: body rows as cells."""
    tables: dict[str, list[list[str]]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("| ---") and \
                (i == 0 or not lines[i - 1].startswith("|")):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip().strip("|").split("|")]
                assert len(cells) == len(header), f"a row of the table {header} has {len(cells)} cells: {row}"
                rows.append(cells)
            tables[header[1]] = rows
    return tables


def test_methods_page_lists_every_registered_method_with_its_defaults():
    """book/methods.md has a row for every method of the registry (and FedSteer as written) in
    both of its tables, nothing else, lists exactly each method's parameters at their registry
    defaults (FedSteer's |X| and lambda are also Fashion-MNIST's) and cites a paper for each."""
    import re
    from pathlib import Path

    import yaml

    from fedsteer_lib.experiments.config import DATASET_DEFAULTS
    from fedsteer_lib.experiments.registry import METHODS as REGISTRY, ROLES

    page = Path(__file__).resolve().parents[1] / "book" / "methods.md"
    tables = _markdown_tables(page.read_text(encoding="utf8"))
    rules, params = tables["Aggregation $\\Delta_t$"], tables["Parameters (our defaults)"]
    expected = {info.display: (info.defaults, False) for info in REGISTRY.values()}
    as_written = ROLES["fedsteer_as_written"]
    expected[as_written.display] = (dict(as_written.fixed), True)
    assert sorted(r[0] for r in rules) == sorted(expected), "rows of the aggregation table"
    assert sorted(r[0] for r in params) == sorted(expected), "rows of the parameters table"
    steer = REGISTRY["fedsteer"].defaults
    assert {k: steer[k] for k in ("core_size", "lam")} == {k: DATASET_DEFAULTS["fmnist"][k] for k in ("core_size", "lam")}
    for name, cell, _paper in params:
        listed = {k: yaml.safe_load(v) for k, v in re.findall(r"\(`(\w+)`: ([^)]+)\)", cell)}
        want, _ = expected[name]
        assert listed == want, f"{name}: the page lists {listed}, the registry says {want}"
        if not want:
            assert cell == "none", f"{name} has no parameters; the page says {cell!r}"
        assert "{cite" in _paper, f"{name}: no citation in the Paper column"
