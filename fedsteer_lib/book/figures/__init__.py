"""The book's figures, one module per kind of measurement (named after the `fedsteer_lib.book`
module whose tables they draw): `accuracy` (Fig. 4, 6, 7, Table 1 as bars), `paper_comparison`
(ours vs the paper, per seed), `server_memory` and `conventions`; `style` holds the colours they
share. A figure only one chapter draws is defined in that chapter's notebook.

Every function takes tidy tables (pandas) or tensors and draws on the matplotlib axes it is given
(or returns the Figure it drew). Figure modules import the table modules, never the reverse.
"""
from . import accuracy, style

__all__ = ["accuracy", "style"]
