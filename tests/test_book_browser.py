"""Open the BUILT book (`_build/html`) in headless Chromium and check every page of the toc.

The Makefile builds the book before pytest runs (`make test`, `make book`). If `_build/html` is
missing the tests fail (they never skip): build it first with

    .venv/bin/jupyter-book build . --toc book/_toc.yml --config _config.yml -W -n --quiet

For every page of `book/_toc.yml`: the page loads and shows its title as h1; where its source
contains math, MathJax (served locally) has typeset it and no raw TeX delimiters are left;
every <img> resolves to a non-empty image file under `_build/html`; the rendered page loads no
script, stylesheet, image or frame from the network; no formula is clipped; every figure of a
chapter sits in a <figure> with a caption and an alt text that describes it (not a file name);
no rendered table cell reads NaN, None, True or False; nothing in the main column is wider than
the column (no sideways scrolling, no hidden overflow). Screenshots of the introduction,
chapter 6 (Table 1) and chapter 9 (the verdict) are written to `_build/screenshots/`.
"""
from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from fedsteer_lib.experiments.doctor import chromium_path, chromium_problem

ROOT = Path(__file__).resolve().parents[1]
TOC = ROOT / "book" / "_toc.yml"
HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = chromium_path()
TIMEOUT_S = 120
BUILD_HINT = ("run the book build first: `make book` (or `make test`), i.e. "
              "`jupyter-book build . --toc book/_toc.yml --config _config.yml -W -n --quiet` "
              "from the repository root")


# ----------------------------------------------------------------------------- the pages
def _toc_docs() -> list[str]:
    """Every document of the toc, in order: the root, then the files of all parts."""
    toc = yaml.safe_load(TOC.read_text(encoding="utf8"))
    docs = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                docs.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return [str(Path(d).with_suffix("")) if Path(d).suffix in (".md", ".ipynb") else d for d in docs]


PAGES = _toc_docs()
CHAPTERS = [d for d in PAGES if "/chapters/" in d]
SCREENSHOT_PAGES = [PAGES[0], *(d for d in CHAPTERS if Path(d).name.startswith(("06_", "09_")))]
# Chapter 6's Table 1 (and its bar figure) sits below the first screen: its screenshot is taller.
SCREENSHOT_HEIGHT = {d: 3600 if Path(d).name.startswith("06_") else 1800 for d in SCREENSHOT_PAGES}


def _built_html() -> Path:
    if not (HTML / "index.html").is_file():
        pytest.fail(f"the built book is missing ({HTML / 'index.html'} does not exist): {BUILD_HINT}")
    return HTML


def _page_file(doc: str) -> Path:
    page = _built_html() / f"{doc}.html"
    if not page.is_file():
        pytest.fail(f"{doc} is in book/_toc.yml but {page} was not built: {BUILD_HINT}")
    return page


def _source(doc: str) -> tuple[str, str]:
    """(markdown text of the page's source, where it came from).

    The sources Sphinx copied into `_build/html/_sources` are exactly what was built (the
    executed chapters under book/chapters/ may already be gone); else the file in book/.
    """
    for suffix in (".ipynb", ".md"):
        for candidate in (_built_html() / "_sources" / f"{doc}{suffix}", ROOT / f"{doc}{suffix}"):
            if candidate.is_file():
                text = candidate.read_text(encoding="utf8")
                if suffix == ".ipynb":
                    cells = json.loads(text)["cells"]
                    text = "\n\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                                       for c in cells if c["cell_type"] == "markdown")
                return text, str(candidate)
    pytest.fail(f"no source found for {doc} (neither _build/html/_sources/{doc}.* nor {doc}.md/.ipynb)")


def _strip_code(markdown: str) -> str:
    markdown = re.sub(r"^(```|~~~).*?^\1\s*$", "", markdown, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", markdown)


MATH_IN_SOURCE = re.compile(r"\$\$|\$[^$\s][^$\n]*?\$|\\\(|\\\[|\\begin\{|\{math\}|\{eq\}")


def _title(markdown: str) -> str:
    match = re.search(r"^#\s+(.+?)\s*#*\s*$", _strip_code(markdown), flags=re.M)
    assert match, "the page's source has no level-1 '# title' heading"
    return match.group(1)


# ----------------------------------------------------------------------------- Chromium
def test_chromium_is_installed():
    """Without the browser every other test of this module is deselected (tests/conftest.py) and
    this one fails with what is missing and the command that installs it."""
    problem = chromium_problem()
    assert problem is None, problem


def _chromium(url: str, *extra: str) -> str:
    if chromium_problem():
        pytest.fail(chromium_problem())
    with tempfile.TemporaryDirectory(prefix="fedsteer-chromium-") as profile:
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=15000",
               *extra, url]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # Chromium and the helpers it started
            proc.communicate()
            pytest.fail(f"Chromium did not finish within {TIMEOUT_S} s on {url}")
    if proc.returncode != 0:
        pytest.fail(f"Chromium exited with {proc.returncode} on {url}:\n{err[-3000:]}")
    return out


_LOADED: dict[str, str] = {}  # doc -> the DOM of its one load in Chromium, the probes' rows included


def _loaded(doc: str) -> str:
    """The page's DOM after one load of a copy of the built page in Chromium, 1280 px wide: its
    scripts (MathJax included) ran, and so did this module's probes (`_probe`), which each wait
    for the page and MathJax on their own and write their rows into a hidden <pre> of their own.
    The copy sits in a temporary folder, where a <base> points every relative URL back at the
    built book. One Chromium start per page serves every test of the page."""
    if doc not in _LOADED:
        page = _page_file(doc)
        text = page.read_text(encoding="utf8")
        text = text.replace("<head>", f'<head><base href="{page.parent.as_uri()}/">', 1)
        scripts = "".join(f"<script>{probe}</script>" for probe in PROBES)
        text = text.replace("</body>", f"{scripts}</body>", 1)
        with tempfile.TemporaryDirectory(prefix="fedsteer-probe-") as tmp:
            copy = Path(tmp) / page.name
            copy.write_text(text, encoding="utf8")
            _LOADED[doc] = _chromium(copy.as_uri(), "--dump-dom", "--window-size=1280,1800")
    return _LOADED[doc]


def _dom(doc: str) -> str:
    """The page's DOM after its scripts (MathJax included) ran, without the <base> and the
    probes' rows that its load added (the probes' own <script>s, like every script, hold no text
    a test reads)."""
    dom = re.sub(r'<base href="[^"]*">', "", _loaded(doc), count=1)
    return re.sub(r'<pre id="fedsteer-[a-z]+-probe".*?</pre>', "", dom, flags=re.S)


class _Page(HTMLParser):
    """What the tests need from a DOM: the article's h1 texts and text, math containers,
    visible text, images and everything the page fetches."""

    SKIP = {"script", "style", "pre", "code", "textarea", "noscript", "mjx-assistive-mml", "svg"}
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
            "track", "wbr"}

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.h1: list[str] = []
        self.mjx = 0
        self.text: list[str] = []
        self.article_text: list[str] = []
        self.imgs: list[str] = []
        self.loads: list[tuple[str, str]] = []  # (tag, url) of everything the page fetches
        self._stack: list[str] = []
        self._h1_depth: int | None = None
        self._headerlink = 0
        self._cur_h1: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "mjx-container":
            self.mjx += 1
        if tag == "img":
            self.imgs.append(a.get("src") or "")
        if tag in ("script", "img", "iframe", "source", "audio", "video", "embed") and a.get("src"):
            self.loads.append((tag, a["src"]))
        if tag == "link" and a.get("href"):
            rel = (a.get("rel") or "").lower().split()
            if not set(rel) & {"canonical", "alternate", "index", "search", "next", "prev", "author",
                               "license", "help"}:
                self.loads.append((f"link rel={' '.join(rel)}", a["href"]))
        if tag in self.VOID:
            return
        self._stack.append(tag)
        if tag == "h1" and self._h1_depth is None and "article" in self._stack:
            self._h1_depth, self._cur_h1 = len(self._stack), []
        if tag == "a" and "headerlink" in (a.get("class") or "").split() and self._h1_depth is not None:
            self._headerlink = len(self._stack)

    def handle_endtag(self, tag):
        if tag in self.VOID or tag not in self._stack:
            return
        while self._stack:
            if self._headerlink and len(self._stack) == self._headerlink:
                self._headerlink = 0
            if self._h1_depth is not None and len(self._stack) == self._h1_depth:
                self.h1.append(" ".join("".join(self._cur_h1).split()))
                self._h1_depth = None
            if self._stack.pop() == tag:
                break

    def handle_data(self, data):
        if self._h1_depth is not None and not self._headerlink:
            self._cur_h1.append(data)
        if not self.SKIP & set(self._stack) and not any(t.startswith("mjx-") for t in self._stack):
            self.text.append(data)
            if "article" in self._stack:
                self.article_text.append(data)


def _parsed(doc: str) -> _Page:
    page = _Page(_dom(doc))
    assert "".join(page.text).strip(), f"{doc}: Chromium returned an empty DOM"
    return page


def _plain(md_title: str) -> str:
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", md_title)  # links
    t = re.sub(r"[*_`]", "", t)
    return " ".join(t.split())


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("doc", PAGES)
def test_page_loads_with_title(doc):
    page = _parsed(doc)
    body = " ".join(" ".join(page.article_text).split())
    assert body, f"{doc}: the rendered page has no <article> content"
    assert page.h1, f"{doc}: the rendered page has no <h1> in its <article>"
    source, where = _source(doc)
    title = _title(source)
    if re.search(r"[$\\{]", title):  # math or roles in the title: only require an h1
        return
    assert _plain(title) in page.h1, f"{doc}: expected the h1 {_plain(title)!r} (from {where}), found {page.h1}"


@pytest.mark.parametrize("doc", PAGES)
def test_math_is_typeset(doc):
    source, where = _source(doc)
    has_math = bool(MATH_IN_SOURCE.search(_strip_code(source)))
    page = _parsed(doc)
    text = "\n".join(page.text)
    leftovers = [d for d in ("$$", "\\(", "\\)", "\\[", "\\]", "\\begin{") if d in text]
    assert not leftovers, (f"{doc}: raw TeX delimiters {leftovers} left in the rendered text "
                           "(MathJax did not run or did not find the math)")
    if not has_math:
        return
    assert page.mjx > 0, (f"{doc}: the source ({where}) contains math but the rendered page has no "
                          "<mjx-container>: MathJax did not load or did not typeset "
                          "(check mathjax_path in _config.yml and book/_static/mathjax/tex-chtml.js)")


def _check_image(data: bytes, name: str, kind: str) -> None:
    assert data, f"{name} is empty"
    if kind == "svg" or data.lstrip()[:5] in (b"<?xml", b"<svg ") or data.lstrip().startswith(b"<svg"):
        root = ET.fromstring(data)
        assert root.tag.rsplit("}", 1)[-1] == "svg", f"{name} is XML but not SVG (root <{root.tag}>)"
        return
    import io

    import matplotlib.image as mpimg

    fmt = "png" if data[:8] == b"\x89PNG\r\n\x1a\n" else None
    try:
        arr = mpimg.imread(io.BytesIO(data), format=fmt)
    except Exception as err:  # noqa: BLE001 - any decoding error is a failure
        pytest.fail(f"{name} does not decode as an image: {err}")
    assert arr.ndim >= 2 and arr.shape[0] > 0 and arr.shape[1] > 0, f"{name} decodes to an empty image"


@pytest.mark.parametrize("doc", PAGES)
def test_images_resolve(doc):
    page_file = _page_file(doc)
    page = _parsed(doc)
    html_root = _built_html().resolve()
    for src in page.imgs:
        assert src, f"{doc}: <img> without src"
        if src.startswith("data:"):
            header, _, payload = src.partition(",")
            data = base64.b64decode(payload) if header.endswith(";base64") else unquote(payload).encode()
            _check_image(data, f"{doc}: inline {header}", "svg" if "svg" in header else "")
            continue
        parts = urlsplit(src)
        assert parts.scheme in ("", "file"), f"{doc}: <img src={src!r}> is not a local file"
        target = (Path(unquote(parts.path)) if parts.scheme == "file"
                  else page_file.parent / unquote(parts.path)).resolve()
        assert target.is_relative_to(html_root), f"{doc}: <img src={src!r}> points outside _build/html"
        assert target.is_file(), f"{doc}: <img src={src!r}> does not exist ({target})"
        _check_image(target.read_bytes(), f"{doc}: {src}", target.suffix.lower().lstrip("."))


@pytest.mark.parametrize("doc", PAGES)
def test_no_network_resources(doc):
    page = _parsed(doc)
    remote = [f"<{tag}> {url}" for tag, url in page.loads
              if re.match(r"^(https?:)?//", url, flags=re.I)]
    assert not remote, f"{doc}: the rendered page loads resources from the network:\n" + "\n".join(remote)


@pytest.mark.parametrize("doc", SCREENSHOT_PAGES)
def test_screenshot(doc):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / (doc.replace("/", "__") + ".png")
    shot.unlink(missing_ok=True)
    _chromium(_page_file(doc).as_uri(), f"--screenshot={shot}", f"--window-size=1280,{SCREENSHOT_HEIGHT[doc]}",
              "--hide-scrollbars")
    assert shot.is_file() and shot.stat().st_size > 0, f"{doc}: Chromium wrote no screenshot to {shot}"
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{shot} is not a PNG"
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)
    assert img.shape[0] >= 100 and img.shape[1] >= 100, f"{shot} is tiny: {img.shape}"
    assert float(img[..., :3].std()) > 0.01, f"{shot} is blank (a single colour)"


# ----------------------------------------------------------------------------- clipped math
# Measures, after MathJax has typeset the page, every formula's box (<mjx-math>) against the
# nearest ancestor that clips (overflow other than visible): the theme makes each formula such a
# box, and ink flush with its edge is cut. That is how the transpose sign of Eq. 3 (Q_t^\top)
# lost its bar and read as "|" (book/_static/math.css gives the formulas room).
_CLIP_PROBE = """
window.addEventListener('load', () => MathJax.startup.promise.then(() => {
  const rows = [];
  document.querySelectorAll('mjx-container').forEach((c) => {
    const math = c.querySelector('mjx-math');
    if (!math) return;
    let clip = c;
    while (clip && clip !== document.body && getComputedStyle(clip).overflowX === 'visible'
           && getComputedStyle(clip).overflowY === 'visible') clip = clip.parentElement;
    if (!clip || clip === document.body) return;
    const m = math.getBoundingClientRect(), r = clip.getBoundingClientRect();
    const top = r.top + clip.clientTop;
    rows.push({display: c.getAttribute('display') === 'true', clip: clip.tagName.toLowerCase(),
               room_top: m.top - top, room_bottom: top + clip.clientHeight - m.bottom,
               tex: (c.querySelector('mjx-assistive-mml') || c).textContent.slice(0, 50)});
  });
  const pre = document.createElement('pre');
  pre.id = 'fedsteer-clip-probe';
  pre.textContent = JSON.stringify(rows);
  document.body.appendChild(pre);
}));
"""
MATH_ROOM_PX = 1.0  # MathJax's ink reaches up to about a pixel beyond its boxes


def _clip_rows(doc: str) -> list[dict]:
    return _probe(doc, _CLIP_PROBE, "fedsteer-clip-probe")


@pytest.mark.parametrize("doc", PAGES)
def test_math_is_not_clipped(doc):
    """Every typeset formula has at least MATH_ROOM_PX of room above and below inside the box
    that clips it, so no glyph (the transpose's bar, a descender) is cut off."""
    source, _ = _source(doc)
    if not MATH_IN_SOURCE.search(_strip_code(source)):
        return
    rows = _clip_rows(doc)
    tight = [f"{'display' if r['display'] else 'inline'} {r['tex']!r} in <{r['clip']}>: "
             f"{r['room_top']:.2f} px above, {r['room_bottom']:.2f} px below"
             for r in rows if min(r["room_top"], r["room_bottom"]) < MATH_ROOM_PX]
    assert not tight, (f"{doc}: {len(tight)} formulas touch the edge of a clipping box (overflow not "
                       f"visible), so their glyphs are cut off (see book/_static/math.css):\n" + "\n".join(tight[:10]))


# ----------------------------------------------------------------------------- figures and tables
class _Contents(HTMLParser):
    """The article's images, each with its alt text and the caption of the <figure> holding it
    (None when it is in no figure), and the text of every table cell."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.images: list[dict] = []
        self.cells: list[str] = []
        self._article = 0
        self._figures: list[dict] = []  # open <figure> elements: their images and caption text
        self._caption = 0
        self._cell: list[str] | None = None
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "article":
            self._article += 1
        if not self._article:
            return
        if tag == "figure":
            self._figures.append({"images": [], "caption": []})
        elif tag == "figcaption" and self._figures:
            self._caption += 1
        elif tag == "img":
            image = {"src": a.get("src") or "", "alt": (a.get("alt") or "").strip(), "caption": None}
            self.images.append(image)
            if self._figures:
                self._figures[-1]["images"].append(image)
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "article" and self._article:
            self._article -= 1
        elif tag == "figcaption" and self._caption:
            self._caption -= 1
        elif tag == "figure" and self._figures:
            figure = self._figures.pop()
            for image in figure["images"]:
                image["caption"] = " ".join("".join(figure["caption"]).split())
        elif tag in ("td", "th") and self._cell is not None:
            self.cells.append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        if self._caption and self._figures:
            self._figures[-1]["caption"].append(data)
        if self._cell is not None:
            self._cell.append(data)


FILE_NAME_ALT = re.compile(r"^\S*\.(png|svg|jpe?g|gif|pdf)$|^[0-9a-f]{16,}$", flags=re.I)


@pytest.mark.parametrize("doc", CHAPTERS)
def test_chapter_figures_have_caption_and_alt_text(doc):
    contents = _Contents(_dom(doc))
    for image in contents.images:
        name = image["src"].rsplit("/", 1)[-1]
        assert image["caption"], f"{doc}: the figure {name} has no caption (show it with {{glue:figure}})"
        assert len(image["alt"]) >= 20 and not FILE_NAME_ALT.match(image["alt"]), (
            f"{doc}: the figure {name} has the alt text {image['alt']!r}, which does not describe it")


RAW_CELLS = {"NaN", "nan", "None", "True", "False", "<NA>", "NaT"}


@pytest.mark.parametrize("doc", PAGES)
def test_tables_show_no_raw_values(doc):
    raw = [cell for cell in _Contents(_dom(doc)).cells if cell in RAW_CELLS]
    assert not raw, f"{doc}: rendered table cells read {sorted(set(raw))} ({len(raw)} cells): show them for a reader"


# Measures, once the page has laid out (MathJax included), every element of the main column (the
# <article>) whose content is wider than its box while it scrolls or clips (overflow other than
# visible), and every other element that reaches past the column's right edge.
_OVERFLOW_PROBE = """
window.addEventListener('load', () => (window.MathJax ? MathJax.startup.promise : Promise.resolve()).then(() => {
  const main = document.querySelector('article') || document.querySelector('main') || document.body;
  const rows = [], reported = [];
  const column = main.getBoundingClientRect();
  [main, ...main.querySelectorAll('*')].forEach((el) => {
    const style = getComputedStyle(el);
    if (style.display === 'none' || el.closest('details:not([open]), mjx-assistive-mml')) return;  // hidden
    const tag = el.tagName.toLowerCase();
    if (tag.startsWith('mjx-') && tag !== 'mjx-container') return;  // MathJax's own glyph boxes: the formula counts
    if (reported.some((outer) => outer.contains(el))) return;  // the outermost wide element says it
    const scrolls = ['auto', 'scroll', 'hidden', 'clip'].includes(style.overflowX);
    const box = el.getBoundingClientRect();
    const wide = scrolls ? el.scrollWidth - el.clientWidth : box.right - column.right;
    if (wide > 1 && box.width > 0) {
      reported.push(el);
      rows.push({tag: el.tagName.toLowerCase(), cls: String(el.className).slice(0, 60), px: Math.round(wide),
                 scrolls: scrolls, text: (el.textContent || '').trim().slice(0, 60)});
    }
  });
  const pre = document.createElement('pre');
  pre.id = 'fedsteer-overflow-probe';
  pre.style.display = 'none';
  pre.textContent = JSON.stringify(rows);
  document.body.appendChild(pre);
}));
"""


PROBES = (_CLIP_PROBE, _OVERFLOW_PROBE)  # every probe runs in the page's one load (`_loaded`)


def _probe(doc: str, script: str, probe_id: str) -> list[dict]:
    """The JSON rows that `script`, one of PROBES, wrote into <pre id=probe_id> in the page's
    one load (`_loaded`)."""
    import html as html_lib

    assert script in PROBES, "a new probe must be added to PROBES"
    match = re.search(rf'<pre id="{probe_id}"[^>]*>(.*?)</pre>', _loaded(doc), flags=re.S)
    assert match, f"{doc}: the probe {probe_id} did not run (the page never finished loading?)"
    return json.loads(html_lib.unescape(match.group(1)))


@pytest.mark.parametrize("doc", PAGES)
def test_main_column_has_no_horizontal_overflow(doc):
    rows = _probe(doc, _OVERFLOW_PROBE, "fedsteer-overflow-probe")
    wide = [f"<{r['tag']} class={r['cls']!r}> {r['px']} px {'scrolled/clipped' if r['scrolls'] else 'past the column'}: "
            f"{r['text']!r}" for r in rows]
    assert not wide, f"{doc}: {len(wide)} elements are wider than the main column:\n" + "\n".join(wide[:12])
