"""The book's helpers: everything the notebooks in `notebooks/` use besides the method and the
simulator, split by what it does. Nothing outside this package imports it.

| module | what |
| --- | --- |
| `context` | `setup` and `Book`: a notebook's profile, data set, seeds and results cache |
| `paper` | the paper's quoted numbers and statements (`PAPER`, `paper_table`, `plain`) |
| `methods` | a run's Table 1 role, its name, order and colour (read from the method columns) |
| `stats` | means over seeds, paired comparisons and their verdicts, collapse counts |
| `tables` | Table 1, gains, FedStale's β, Table 3, every quoted number next to ours, choices |
| `claim_checks`, `claim_verdicts` | the paper's claims checked on our runs; their tested verdicts and the compact claims table |
| `table_display`, `notebook_glue` | tables for reading (no index, no NaN/True, three decimals); myst-nb's `glue` without its import cost |
| `executed_notebooks` | papermill's injected parameters cell removed from the page (Makefile) |
| `provenance` | where the committed results come from: runtime and environment per run group, the tidy CSV of every run |
| `prose` | the Markdown sentences built from the tables |
| `plan` | which runs each chapter loads; which of the paper profile's runs are cached |
| `snapshots` | what chapters 1-3 share: client groups, snapshots of real updates, their exact span coordinates, a rule's moments over participation draws |
| `server_memory`, `coordinates` | the measurements of chapters 4 and 8 (and 9's memory) |
| `conventions` | Table 1 under both baseline conventions, paired gains, the regime map and the calibrated cell |
| `figures` | the figures, one module per kind of measurement |

`from fedsteer_lib.book import setup, results_root` is what every notebook starts with; the figures
are `from fedsteer_lib.book import figures` (`figures.accuracy.plot_table1_bars`, ...).
"""
from ..experiments.results import results_root
from .context import REPO_ROOT, Book, setup

__all__ = ["REPO_ROOT", "Book", "setup", "results_root"]
