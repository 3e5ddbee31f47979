"""The measurements of chapter 4 (fedsteer_lib.book.server_memory), method labels and the book's
readable tables and figure sizes. (Chapter 8's library code is tested in test_book_coordinates.py;
chapters 5 and 8 check their own analysis code in hidden cells, run by nbval.)"""

import pandas as pd
import pytest

from fedsteer_lib.book import server_memory
from fedsteer_lib.book.methods import label_without_warmup
from fedsteer_lib.experiments.config import method


# --- server memory (the ledger, chapters 4 and 10) -------------------------------------------
@pytest.mark.parametrize("spec,k", [(method("fedsteer", core_size=3), 3), (method("fedsteer", core_size=7), 7),
                                    (method("fedvarp"), None), (method("fedstale"), None), (method("mifa"), None),
                                    (method("scaffold"), None), (method("fedavg"), None)])
def test_state_bytes_measured_on_meta_equal_real_tensors_and_the_formula(spec, k):
    n, d = 12, 50
    meta = server_memory.state_bytes(spec, n, d)
    assert meta == server_memory.state_bytes(spec, n, d, device="cpu")  # meta tensors: same shapes and dtypes
    assert meta == server_memory.memory_formula(spec.name, n, d, k)


def test_memory_formula_scales_as_section_8_2_says():
    """FedVARP's state grows as N d, FedSteer's as N k + k d (chapter 4 draws it against N, the
    ledger's memory rows read it)."""
    d = 1_600_000
    varp = {n: server_memory.state_bytes(method("fedvarp"), n, d) for n in (100, 10_000)}
    steer = {n: server_memory.state_bytes(method("fedsteer", core_size=10), n, d) for n in (100, 10_000)}
    assert varp[10_000] == 100 * varp[100]  # O(N d)
    assert steer[10_000] < 1.02 * steer[100]  # O(N k + k d), dominated by k d
    assert 9.9 < varp[100] / steer[100] <= 10.0  # the paper's "around 10 times" at N = 100, |X| = 10
    with pytest.raises(ValueError, match="core size"):
        server_memory.memory_formula("fedsteer", 10, 10)


# --- method labels ---------------------------------------------------------------------------
def test_label_without_warmup_drops_only_the_warmup_length():
    assert label_without_warmup(method("fedsteer", refresh_every=5, warmup_cycles=2)) == "fedsteer(refresh_every=5)"
    assert label_without_warmup(method("fedsteer", warmup_cycles=2)) == "fedsteer"
    assert label_without_warmup(method("fedvarp", warmup_cycles=5)) == "fedvarp"
    assert label_without_warmup(method("fedstale", beta=0.5)) == "fedstale(beta=0.5)"
    assert label_without_warmup(method("fedavg")) == "fedavg"


# --- display: the book column's figures and readable tables ------------------------------------
def _texts_at_least(fig, size):
    from matplotlib.text import Text
    fig.canvas.draw()
    return all(t.get_fontsize() >= size for t in fig.findobj(Text) if t.get_text())


def test_fit_to_column_shrinks_and_raises_small_text():
    import matplotlib.pyplot as plt
    from fedsteer_lib.book.figures import style
    fig, ax = plt.subplots(figsize=(12, 4))
    ax.plot([0, 1], [0, 1], label="a")
    ax.legend(fontsize=6)
    ax.set_title("t", fontsize=7)
    style.fit_to_column(fig)
    assert fig.get_size_inches()[0] == pytest.approx(style.COLUMN_WIDTH)
    assert _texts_at_least(fig, style.MIN_FONT)
    plt.close(fig)


def test_highlight_colours_are_shared_by_the_results_figures():
    from fedsteer_lib.book.figures import accuracy
    from fedsteer_lib.book.figures.style import CB, RED, highlight_colours
    colours = highlight_colours(["fedsteer", "fedsteer(refresh_every=5)", "fedavg", "mifa", "fedvarp"], best="fedvarp")
    assert list(colours) == ["fedsteer", "fedsteer(refresh_every=5)", "fedavg", "fedvarp"]  # mifa: muted
    assert colours["fedsteer"] == RED and colours["fedsteer(refresh_every=5)"] != RED
    assert colours["fedavg"] == CB[0] and colours["fedvarp"] == CB[2]
    t1 = pd.DataFrame({"role": ["fedsteer", "fedsteer_enforce5", "fedavg", "fedvarp", "mifa"],
                       "mean": [0.8, 0.79, 0.7, 0.75, 0.72]})
    # Table 1's figures colour FedSteer, FedAvg and the best baseline only, in the same colours as chapter 5's
    assert accuracy._role_colours(t1) == {"fedsteer": RED, "fedavg": CB[0], "fedvarp": CB[2]}


