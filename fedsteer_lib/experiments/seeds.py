"""The seeds a chapter or a sweep is asked for, checked where they are received.

Standard library only, so that `make book SEEDS=...` can check its value with the system
Python before it deletes any built chapter (`python3 -m fedsteer_lib check-seeds 0,1`).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from ..simulator.settings import SEED_LIMIT, ConfigError, is_int

__all__ = ["check_seeds", "seeds_from_text", "main"]


_LIST_FORM = 'pass a list with papermill\'s -y, e.g. -y "seeds: [0, 1]" (or make book SEEDS=0,1)'


def check_seeds(seeds: Any) -> tuple[int, ...]:
    """`seeds` as a tuple, or ConfigError naming what is wrong: not a list (a string, as
    papermill's `-p seeds "[0]"` gives), not integers in [0, 2**64) (booleans are not integers
    here; torch takes 64-bit seeds), a seed given twice (it would count twice in every mean), or
    no seed at all."""
    if isinstance(seeds, (str, bytes)):
        raise ConfigError(f"seeds must be a list of integers >= 0, got the text {seeds!r}: {_LIST_FORM}")
    try:
        values = list(seeds)
    except TypeError:
        raise ConfigError(f"seeds must be a list of integers >= 0, got {seeds!r}: {_LIST_FORM}") from None
    if not values:
        raise ConfigError("seeds must name at least one seed, got an empty list")
    bad = [v for v in values if not (is_int(v) and 0 <= v < SEED_LIMIT)]
    if bad:
        raise ConfigError(f"seeds must be integers in [0, 2**64), got {bad[0]!r} in {values!r}")
    twice = [v for v, n in Counter(values).items() if n > 1]
    if twice:
        raise ConfigError(f"seeds must not repeat (a repeated seed counts twice in every mean): "
                          f"{twice[0]} is given {values.count(twice[0])} times in {values!r}")
    return tuple(values)


def seeds_from_text(text: str) -> tuple[int, ...]:
    """`0,1,2` (the form of `make book SEEDS=...`) as checked seeds."""
    items = [t.strip() for t in text.split(",")]
    bad = [t for t in items if not t.isdigit()]
    if bad:
        raise ConfigError(f"SEEDS={text!r}: seeds must be integers >= 0 separated by commas (e.g. SEEDS=0,1), "
                          f"got {bad[0]!r}")
    return check_seeds(int(t) for t in items)


def main(argv: Iterable[str]) -> int:
    """`python -m fedsteer_lib check-seeds 0,1`: exit status 0 when the seeds are good, else 2 with
    the one-line reason on stderr."""
    import sys

    args = list(argv)
    try:
        seeds_from_text(args[0] if args else "")
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    return 0
