"""The book's helpers: everything the notebooks in `notebooks/` use besides the method and the
simulator, split by what it does. Nothing outside this package imports it.

| module | what |
| --- | --- |
| `context` | `setup` and `Book`: a notebook's profile, data set, seeds and results cache |
| `paper` | the paper's quoted numbers and statements (`PAPER`, `paper_table`, `plain`) |
| `methods` | a run's Table 1 role, its name and order (read from the method columns; colours from the registry) |
| `stats` | means over seeds with their t-intervals, t-tests, Holm's adjustment |
| `tables` | Table 1 (mean, interval, n per cell) and its reading, gains |
| `ledger`, `mechanism_claims` | the claims ledger: every claim the book tests, one row each, one Holm family |
| `table_display`, `notebook_glue` | tables for reading (no index, no NaN/True, three decimals); myst-nb's `glue` without its import cost |
| `snapshots` | what chapters 1-3 share: client groups, snapshots of real updates, their exact span coordinates, a rule's moments over participation draws |
| `server_memory`, `coordinates` | what the ledger and chapters 4 and 8 share: server state bytes, coordinate histories |
| `figures` | what several chapters draw: Table 1's bars and Fig. 5 (`accuracy`), the book's colours and sizes (`style`) |

A computation only one chapter shows lives in that chapter's notebook. The build and rerun
tooling (`make book`'s generated tables, `make lab`'s reading copies) lives in `tools/`.

`from fedsteer_lib.book import setup, results_root` is what every notebook starts with; the figures
are `from fedsteer_lib.book import figures` (`figures.accuracy`, `figures.style`).
"""
from ..experiments.results import results_root
from .context import REPO_ROOT, Book, setup

__all__ = ["REPO_ROOT", "Book", "setup", "results_root"]
