"""The book's figures, one module per kind of measurement (named after the `fedsteer_lib.book`
module whose tables they draw): `accuracy` (Fig. 4-7, Table 1 as bars, Fig. 5), `comparisons`
(paired ablation differences), `paper_comparison` (ours vs the paper, per seed), `server_memory`, `conventions`, `variance` and `coordinates`; `style` holds the colours
they share.

Every function takes tidy tables (pandas) or tensors and draws on the matplotlib axes it is given
(or returns the Figure it drew). Figure modules import the table modules, never the reverse.
"""
from . import accuracy, comparisons, conventions, coordinates, paper_comparison, server_memory, style, variance

__all__ = ["accuracy", "comparisons", "conventions", "coordinates", "paper_comparison", "server_memory", "style", "variance"]
