"""What the server knows of each node, by slot (the client index i of the method's state)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NodeTable"]

_COLUMNS = ("ids", "examples", "declared", "joined", "rounds", "sampled", "replied")


@dataclass
class NodeTable:
    """ids: the Flower node id of each slot; examples: its latest `num-examples` (0 before its
    first reply); declared: its latest `participation-prob` (None: none reported); joined: the
    server round it was first seen; rounds: training rounds since it joined; sampled / replied:
    training rounds in which it was sampled / replied usefully."""

    ids: list[int] = field(default_factory=list)
    examples: list[float] = field(default_factory=list)
    declared: list[float | None] = field(default_factory=list)
    joined: list[int] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)
    replied: list[int] = field(default_factory=list)
    index: dict[int, int] = field(default_factory=dict)  # node id -> slot

    def __len__(self) -> int:
        return len(self.ids)

    def slot(self, node_id: int) -> int | None:
        return self.index.get(node_id)

    def add(self, node_id: int, server_round: int) -> int:
        for name, value in zip(_COLUMNS, (node_id, 0.0, None, server_round, 0, 0, 0)):
            getattr(self, name).append(value)
        self.index[node_id] = len(self.ids) - 1
        return len(self.ids) - 1

    def observed_rate(self, slot: int) -> float | None:
        """Successful training replies / training rounds since the node joined (None before its first)."""
        return self.replied[slot] / self.rounds[slot] if self.replied[slot] else None

    # --- in a checkpoint ------------------------------------------------------------------------
    def to_plain(self) -> dict[str, list[Any]]:
        return {name: list(getattr(self, name)) for name in _COLUMNS}

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> NodeTable:
        """The table of `to_plain`'s dict; ValueError when a column is missing, of another
        length or holds values of the wrong kind."""
        if not isinstance(plain, dict) or set(plain) != set(_COLUMNS):
            raise ValueError(f"the node table's columns are {sorted(plain) if isinstance(plain, dict) else plain!r}, "
                             f"expected {sorted(_COLUMNS)}")
        columns = [plain[name] for name in _COLUMNS]
        if not all(isinstance(c, list) and len(c) == len(columns[0]) for c in columns):
            raise ValueError("the node table's columns are not lists of one length")

        def count(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        def number(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0

        ok = (all(isinstance(v, int) and not isinstance(v, bool) for v in plain["ids"])
              and len(set(plain["ids"])) == len(plain["ids"])
              and all(number(v) for v in plain["examples"])
              and all(v is None or number(v) for v in plain["declared"])
              and all(count(v) for name in ("joined", "rounds", "sampled", "replied") for v in plain[name]))
        if not ok:
            raise ValueError("the node table holds values of the wrong kind (or repeated node ids)")
        table = cls(*[list(c) for c in columns])
        table.index = {node: slot for slot, node in enumerate(table.ids)}
        return table
