"""The measurements of chapter 4 (fedsteer_lib.book.server_memory), method labels and the book's
readable tables and figure sizes. (Chapter 8's library code is tested in test_book_coordinates.py;
chapters 5 and 8 check their own analysis code in hidden cells, run by nbval.)"""

import pandas as pd
import pytest

from fedsteer_lib.book import server_memory
from fedsteer_lib.book.methods import method_name
from fedsteer_lib.experiments.config import method


# --- server memory (the ledger, chapters 4 and 10) -------------------------------------------
@pytest.mark.parametrize("spec,k", [(method("fedsteer", core_size=3), 3), (method("fedsteer", core_size=7), 7),
                                    (method("fedvarp"), None), (method("fedstale"), None), (method("mifa"), None),
                                    (method("scaffold"), None), (method("fedavg"), None)])
def test_server_state_bytes_measured_on_meta_equal_real_tensors_and_the_formula(spec, k):
    n, d = 12, 50
    meta = server_memory.server_state_bytes(spec, n, d)
    assert meta == server_memory.server_state_bytes(spec, n, d, device="cpu")  # meta tensors: same shapes and dtypes
    assert meta == server_memory.memory_formula(spec.name, n, d, k)


def test_memory_formula_scales_as_section_8_2_says():
    """FedVARP's state grows as N d, FedSteer's as N k + k d (chapter 4 draws it against N, the
    ledger's memory rows read it)."""
    d = 1_600_000
    varp = {n: server_memory.server_state_bytes(method("fedvarp"), n, d) for n in (100, 10_000)}
    steer = {n: server_memory.server_state_bytes(method("fedsteer", core_size=10), n, d) for n in (100, 10_000)}
    assert varp[10_000] == 100 * varp[100]  # O(N d)
    assert steer[10_000] < 1.02 * steer[100]  # O(N k + k d), dominated by k d
    assert 9.9 < varp[100] / steer[100] <= 10.0  # the paper's "around 10 times" at N = 100, |X| = 10
    with pytest.raises(ValueError, match="core size"):
        server_memory.memory_formula("fedsteer", 10, 10)


# --- method labels ---------------------------------------------------------------------------
def test_method_name_drops_only_the_warmup_length():
    assert method_name(method("fedsteer", core_size=10, lam=0.0, refresh_every=5, warmup_cycles=2), "fmnist") == \
        "FedSteer (|X|=10, λ=0.0, enforce=5)"
    assert method_name(method("fedsteer", core_size=40, lam=0.5, warmup_cycles=2), "fmnist") == "FedSteer"
    assert method_name(method("fedsteer", core_size=40, lam=0.5, ordering="as_written"), "fmnist") == "FedSteer (as written)"
    assert method_name(method("fedvarp", warmup_cycles=5)) == "FedVARP (warmup_cycles=5)"  # the fair start is a variant
    assert method_name(method("fedstale", beta=0.5)) == "FedStale (β=0.5)"
    assert method_name(method("fedavg")) == "FedAvg"


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


def test_every_method_has_a_hue_of_its_own_and_the_schematics_none_of_them():
    from matplotlib.colors import to_rgb
    import colorsys

    from fedsteer_lib.book.figures.style import SCHEMATIC
    from fedsteer_lib.experiments.registry import METHODS

    colours = {name: info.colour for name, info in METHODS.items()}
    assert len(set(colours.values())) == len(colours)
    hues = {name: colorsys.rgb_to_hls(*to_rgb(c)) for name, c in colours.items() if name != "full"}
    for a in hues:
        for b in hues:
            if a < b:  # hue distance (a circle) of two chromatic colours: at least 20 degrees apart
                d = abs(hues[a][0] - hues[b][0]) * 360
                assert min(d, 360 - d) >= 20 or abs(hues[a][1] - hues[b][1]) > 0.25, (a, b)
    for style in SCHEMATIC.values():  # greys only (not even full participation's black): never a method's colour
        r, g, b = to_rgb(style["color"])
        assert r == g == b and style["color"] not in colours.values()
