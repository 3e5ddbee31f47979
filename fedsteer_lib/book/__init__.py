"""The book's helpers: what several notebooks in `notebooks/` share besides the method and the
simulator. Nothing outside this package imports it.

| module | what |
| --- | --- |
| `context` | `setup` and `Book`: a notebook's profile, data set, seeds and results cache |
| `paper` | the paper's quoted numbers (`PAPER`, `plain`) |
| `methods` | a run's role and its name for reading (names and colours come from the registry) |
| `stats` | estimates over independent units on the right scale (t, log ratio, bootstrap), tests, Holm |
| `tables` | Table 1 (mean, interval, n per cell) and its reading |
| `claims`, `ledger`, `mechanism_claims` | the claims ledger: every claim of the paper the book tests, one row each, one Holm family |
| `table_display`, `notebook_glue` | numbers and tables for reading (one minus sign, no NaN/True); myst-nb's `glue` without its import cost |
| `snapshots` | what chapters 1-3 share: client groups, snapshots of real updates, their exact span coordinates, a rule's moments over participation draws |
| `server_memory`, `coordinates` | what the ledger and chapters 4 and 8 share: server state bytes, coordinate histories |
| `figures` | what several chapters draw with: method styles, the schematics' greys, sizes, direct labels (`style`) |

A computation only one chapter shows lives in that chapter's notebook. The build and rerun
tooling (`make book`'s generated tables, `make lab`'s reading copies) lives in `tools/`.
"""
from ..experiments.results import results_root
from .context import REPO_ROOT, Book, setup

__all__ = ["REPO_ROOT", "Book", "setup", "results_root"]
