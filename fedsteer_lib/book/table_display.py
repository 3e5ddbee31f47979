"""Tables and numbers for reading, one convention for the whole book: accuracies with three
decimals (0.840), relative gains and changes in percent with one decimal and a sign (+8.2 %),
p-values with three decimals or "p < 0.001", the uncertainty as a 95 % interval "[lo, hi]", "—"
for a missing value, "yes"/"no" for a truth value, and no index column. Display only: the values
a chapter computes and checks are untouched."""
from __future__ import annotations

import hashlib
import math
from numbers import Integral, Real
from typing import Any

import numpy as np
import pandas as pd
from pandas.io.formats.style import Styler

__all__ = ["readable_value", "readable_table", "fmt_acc", "fmt_num", "fmt_pct", "fmt_p",
           "fmt_interval", "MISSING", "MINUS"]

MISSING = "—"
MINUS = "−"  # U+2212: the one minus sign of every number the book prints
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def readable_value(value: Any, digits: int = 3) -> str:
    """One cell as text: None/NaN -> "—", a bool -> "yes"/"no", an integer as it is (thousands
    separated), a real number to `digits` significant digits in plain notation (an exact value without padding zeros: 0.9, not 0.900; a number below
    1e-3 in magnitude as a × 10ⁿ), anything else as `str`."""
    if value is None or (isinstance(value, Real) and not isinstance(value, Integral) and math.isnan(value)):
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, Integral):
        return f"{int(value):,}".replace("-", MINUS)
    if not isinstance(value, Real):
        return MISSING if value is pd.NA or value is pd.NaT else str(value)
    v = float(value)
    if v == 0 or math.isinf(v):
        return "0" if v == 0 else str(v)
    exponent = math.floor(math.log10(abs(v)))
    if exponent < -3:
        mantissa = f"{v / 10 ** exponent:.{digits - 1}f}"
        return f"{mantissa} × 10{str(exponent).translate(_SUPERSCRIPT)}".replace("-", MINUS)
    decimals = max(0, digits - 1 - exponent)
    text = f"{v:,.{decimals}f}"
    if decimals and abs(float(text.replace(",", "")) - v) <= 1e-6 * abs(v):  # an exact value (a setting such as 0.9): no padding zeros
        text = text.rstrip("0").rstrip(".")
    return text.replace("-", MINUS)


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, Real) and math.isnan(float(x)))


def fmt_acc(x: Any) -> str:
    """An accuracy (or any number in [0, 1] read as one): 0.84 -> "0.840"."""
    return MISSING if _missing(x) else f"{float(x):.3f}"


def fmt_num(x: Any, digits: int = 3) -> str:
    """Any other number (a cosine, a difference of cosines): `digits` decimals and a true minus
    sign, -0.0192 -> "−0.019"."""
    return MISSING if _missing(x) else f"{float(x):.{digits}f}".replace("-", MINUS)


def fmt_pct(x: Any, signed: bool = True) -> str:
    """A relative gain or change: 0.0823 -> "+8.2 %", -0.05 -> "−5.0 %" (a true minus sign);
    unsigned: "8.2 %"."""
    if _missing(x):
        return MISSING
    return (f"{100 * float(x):+.1f} %" if signed else f"{100 * float(x):.1f} %").replace("-", "−")


def fmt_p(p: Any, prefix: bool = True) -> str:
    """A p-value: "p = 0.034" / "p < 0.001" in prose; in a column headed p (`prefix=False`),
    "0.034" / "< 0.001"; "—" when there is no test."""
    if _missing(p):
        return MISSING
    text = "< 0.001" if p < 0.001 else f"{float(p):.3f}"
    return (f"p {text}" if text.startswith("<") else f"p = {text}") if prefix else text


def fmt_interval(lo: Any, hi: Any, pct: bool = True) -> str:
    """An interval: "[−3.4 %, +5.8 %]" (pct) or "[−0.031, 0.812]" (`fmt_num`); "—" when not defined."""
    if _missing(lo) or _missing(hi):
        return MISSING
    f = fmt_pct if pct else fmt_num
    return f"[{f(lo)}, {f(hi)}]"


def readable_table(table: pd.DataFrame, digits: int = 3, *, index: bool = False, uuid: str | None = None,
                   caption: str | None = None) -> Styler:
    """A Styler of `table` with every cell through `readable_value`, the index hidden (kept as
    columns first when `index`), a fixed `uuid` so that the HTML is the same on every run
    (nbval compares it), and `caption` above it ("Table 6.1. ...": the book numbers its tables
    by chapter)."""
    shown = table.reset_index() if index else table
    styler = shown.style.format(lambda v: readable_value(v, digits)).hide(axis="index")
    digest = hashlib.sha1("|".join(map(str, shown.columns)).encode()).hexdigest()[:10]
    styler = styler.set_uuid(uuid or f"t{digest}")
    return styler.set_caption(caption) if caption else styler


