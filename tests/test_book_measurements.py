"""A chapter's own measurements are results like runs (book/measurements.py): stored, keyed by
their inputs and code, computed only when missing, read back as they were written, verified on
request, and a stored file never runs code."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from fedsteer_lib.book.measurements import RECOMPUTE_ENV, MeasurementChanged, measure


@pytest.fixture
def book(tmp_path):
    return SimpleNamespace(root=tmp_path, device="cpu")


def values():
    return {"frame": pd.DataFrame({"a": [1.0, float("nan")], "b": ["x", "y"]}), "t": torch.arange(4.0).reshape(2, 2),
            "arr": np.array([1, 2], dtype=np.int64), "pair": (0.1, 2)}


def test_a_measurement_is_computed_once_and_read_back_as_written(book):
    calls = []

    def compute():
        calls.append(1)
        return values()

    first = measure(book, "m", compute, inputs={"seed": 1}, code=[values])
    again = measure(book, "m", compute, inputs={"seed": 1}, code=[values])
    assert len(calls) == 1
    assert again["pair"] == (0.1, 2) and torch.equal(again["t"], values()["t"]) and again["arr"].dtype == np.int64
    assert first["frame"].equals(again["frame"]) and again["frame"]["a"].isna().iloc[1]
    measure(book, "m", compute, inputs={"seed": 2}, code=[values])  # other inputs: another measurement
    assert len(calls) == 2 and len(list((book.root / "measurements" / "m").glob("*.json"))) == 2


def test_recomputing_compares_with_the_stored_value(book, monkeypatch):
    measure(book, "m", values, inputs={"seed": 1})
    monkeypatch.setenv(RECOMPUTE_ENV, "1")
    measure(book, "m", values, inputs={"seed": 1})  # the same bits: no complaint
    path = next((book.root / "measurements" / "m").glob("*.json"))
    data = json.loads(path.read_text())
    data["value"]["pair"]["__tuple__"][0] = 0.2
    path.write_text(json.dumps(data))
    with pytest.raises(MeasurementChanged, match=r"value\.pair"):
        measure(book, "m", values, inputs={"seed": 1})


def test_a_stored_file_is_data_only(book):
    path = book.root / "measurements" / "m"
    measure(book, "m", values, inputs={})
    stored = next(path.glob("*.json"))
    stored.write_text("cos\nsystem\n(S'touch /tmp/pwned'\ntR.")  # a pickle: never unpickled
    with pytest.raises(ValueError, match="not a stored measurement"):
        measure(book, "m", values, inputs={})
