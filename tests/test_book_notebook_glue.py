"""`book.notebook_glue.glue` writes exactly what `myst_nb.glue` writes (the book build reads it)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import myst_nb.ext.glue as myst_glue  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from fedsteer_lib.book import notebook_glue  # noqa: E402


def _captured(module, monkeypatch, name, value, display):
    calls = []
    monkeypatch.setattr(module, "ipy_display", lambda *args, **kwargs: calls.append((args, kwargs)))
    (myst_glue.glue if module is myst_glue else notebook_glue.glue)(name, value, display=display)
    return calls


@pytest.mark.parametrize("display", [False, True])
def test_glue_matches_myst_nb(monkeypatch, display):
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [1, 0])
    for value in ("a sentence", 26, pd.DataFrame({"a": [1, 2]}), fig):
        ours = _captured(notebook_glue, monkeypatch, "key", value, display)
        theirs = _captured(myst_glue, monkeypatch, "key", value, display)
        assert ours == theirs and len(ours) == 1
        (bundle,), kwargs = ours[0]
        assert all(k.startswith(notebook_glue.GLUE_PREFIX) != display for k in bundle)
        assert kwargs["metadata"]["scrapbook"]["name"] == "key" and kwargs["raw"] is True
    plt.close(fig)
