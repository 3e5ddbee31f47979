"""myst-nb's `glue` for the notebooks, without its import cost.

`myst_nb.glue` lives in `myst_nb.ext.glue`, which imports nbformat; nbformat's jsonschema pulls
in rfc3987_syntax, which builds a Lark grammar when imported: about 2 s of every kernel that
glues anything (measured on this 2-core machine). This `glue` writes the same display output
(the variable's mime bundle, under the "application/papermill.record/" prefix when it is not
displayed, with the `scrapbook` metadata that `{glue:...}` reads when the book is built) with
IPython alone; tests/test_book_notebook_glue.py checks that it matches `myst_nb.glue` exactly.
"""
from __future__ import annotations

from typing import Any

import IPython
from IPython.display import display as ipy_display

__all__ = ["glue", "glued", "GLUE_PREFIX"]

GLUE_PREFIX = "application/papermill.record/"
_GLUED: dict[str, Any] = {}  # name -> the text/plain a {glue:text} role shows, in this kernel


def glue(name: str, variable: Any, display: bool = True) -> None:
    """Store how `variable` displays under `name` for `{glue:text}`, `{glue:figure}`, ... in the
    book's Markdown (and show it too unless display=False): `myst_nb.glue`'s output."""
    mimebundle, metadata = IPython.core.formatters.format_display_data(variable)
    _GLUED[name] = mimebundle.get("text/plain", "")
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = dict(name=name, mime_prefix=prefix)
    ipy_display({prefix + k: v for k, v in mimebundle.items()}, raw=True, metadata=metadata)


def glued(*items: tuple[str, str], heading: str = "") -> None:
    """For a reader of the notebook in JupyterLab, where `{glue:text}` roles show as their keys:
    the numbers the prose just above quotes, each after the words that lead to it in the prose.
    `items` are (words, glue name) pairs; the cell that calls this is tagged out of the book,
    whose pages show the numbers in the prose itself."""
    from IPython.display import Markdown

    def text(name: str) -> str:
        value = _GLUED.get(name, "(not computed in this kernel)")
        return value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else value

    lines = [f"{heading}:"] if heading else []
    ipy_display(Markdown("\n".join(lines + [f"- … {words} **{text(name)}**" for words, name in items])))
