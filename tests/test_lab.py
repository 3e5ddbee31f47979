"""The reader in JupyterLab (`make lab`): a chapter reads there as it does in the book.

`make lab` writes reading copies of the executed chapters (tools/lab.py) and starts
JupyterLab on them. Here the copies are made from the committed notebooks (their outputs hold the
glued values) and

- every chapter's copy has no MyST left that JupyterLab would show raw (roles, directives,
  `(label)=` targets), every `{glue:text}` value is in its text and every citation has its
  reference;
- JupyterLab, started with `make lab`'s own command line (so as root it must say --allow-root),
  opens the copy of the chapter that uses the most kinds of MyST in headless Chromium (driven over
  the DevTools protocol); its rendered Markdown shows the glued numbers, the citations as the book
  prints them, links to the other chapters, the glued figures as loaded images and typeset math,
  and no raw `{glue:`, `{cite:`, `{doc}`, `{ref}` text. The chapter itself, opened the same way,
  shows them raw: the check can fail.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import websocket  # websocket-client, a dependency of jupyter_server

from fedsteer_lib.experiments.doctor import chromium_path, chromium_problem
from tools import lab

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SCREENSHOT = ROOT / "_build" / "screenshots" / "lab.png"
RAW = re.compile(r"\{(?:glue|cite|doc|ref|numref|eq|math)[\w:-]*\}|^\([\w.:-]+\)=$|^(?:```|:::)\{", re.M)
KINDS = ("{glue:text}", "{glue:figure}", "{cite:p}", "{cite:t}", "{doc}", "{ref}", "{glue:}",
         "{glue:md}", "{dropdown}")
TIMEOUT_S = 90


def _markdown(nb: dict) -> str:
    return "\n\n".join(lab._text(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> Path:
    """JupyterLab's root as `make lab` lays it out: the copies in as-in-the-book/."""
    root = tmp_path_factory.mktemp("lab")
    lab.write_copies(root / lab.COPIES_NAME, CHAPTERS)
    return root


def test_every_chapter_copy_has_no_myst_left(copies):
    problems = []
    for source in CHAPTERS:
        nb = json.loads(source.read_text(encoding="utf8"))
        text = _markdown(json.loads((copies / lab.COPIES_NAME / source.name).read_text(encoding="utf8")))
        glue, used = lab.glue_values(nb), re.findall(r"\{glue[\w:-]*\}`(?:[^`]*::)?([^`:]+)", _markdown(nb))
        missing = sorted(set(used) - set(glue))
        if missing:
            problems.append(f"{source.name}: glues {missing[:5]} but its outputs hold no such values "
                            "(execute the chapter and save its outputs)")
        left = sorted({line.strip()[:80] for line in text.splitlines() if RAW.search(line)})
        if left and not missing:
            problems.append(f"{source.name}: left as MyST (JupyterLab shows it raw): {left[:5]}")
        for key in sorted(set(re.findall(r"\{glue:text\}`([^`:]+)`", _markdown(nb))) & set(glue)):
            value = lab.format_plain_text(lab._text(glue[key]["text/plain"]), "")
            if value not in text:
                problems.append(f"{source.name}: the glued value of {key!r} ({value[:60]!r}) is not in the copy")
        if "](#References " in text and "\n## References\n" not in f"\n{text}\n":
            problems.append(f"{source.name}: cites but has no reference list")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- JupyterLab
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _make_lab_command() -> list[str]:
    """`make lab`'s `jupyter lab ...` line, as make would run it here (nothing is executed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "--no-print-directory", "-n", "lab", "CHAPTERS="], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    lines = [line for line in out.stdout.splitlines() if re.search(r"\bjupyter lab\b", line)]
    assert out.returncode == 0 and lines, f"`make -n lab` gives no `jupyter lab` line:\n{out.stdout}{out.stderr}"
    return shlex.split(lines[-1])


class _Browser:
    """Headless Chromium over the DevTools protocol (one page)."""

    def __init__(self, profile: Path):
        self.proc = subprocess.Popen(
            [chromium_path(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage", "--disable-background-networking", "--disable-component-update",
             "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,2000",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file, deadline = profile / "DevToolsActivePort", time.time() + 30
        while not (port_file.is_file() and port_file.read_text().strip()):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=10))
        url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        self.ws = websocket.create_connection(url, timeout=TIMEOUT_S, suppress_origin=True)
        self.id = 0

    def call(self, method: str, **params) -> dict:
        self.id += 1
        self.ws.send(json.dumps({"id": self.id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.id:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return msg["result"]

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def close(self):
        self.ws.close()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture(scope="module")
def jupyterlab(copies, tmp_path_factory):
    """The browser on JupyterLab, started with `make lab`'s command line on the copies."""
    if chromium_problem():
        pytest.fail(chromium_problem())
    work = tmp_path_factory.mktemp("jupyter")
    settings = work / "settings" / "@jupyterlab"
    # Every cell rendered (not only those on screen), and no news prompt over the page.
    for plugin, value in (("notebook-extension/tracker", {"windowingMode": "none"}),
                          ("apputils-extension/notification", {"fetchNews": "false"})):
        (settings / plugin).parent.mkdir(parents=True, exist_ok=True)
        (settings / f"{plugin}.jupyterlab-settings").write_text(json.dumps(value))
    for src in CHAPTERS:  # the copies link back to ../NN.ipynb
        (copies / src.name).write_bytes(src.read_bytes())
    config = work / "jupyter_server_config.json"  # a faster start: no language servers, no terminals
    config.write_text(json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_lsp": False,
                                                                        "jupyter_server_terminals": False}}}))
    port, token = _free_port(), "fedsteer-lab-test"
    # `make lab`'s line with its root (notebooks/) moved to the copies made here.
    cmd = [arg for arg in _make_lab_command() if not arg.startswith("--ServerApp.root_dir=")] + [
        "--no-browser", f"--port={port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={copies}",
        "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=", f"--LabApp.workspaces_dir={work}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--config={config}"]
    # Nothing read from or written to the user's Jupyter directories (settings, workspaces, secrets).
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(work / "settings"), JUPYTER_CONFIG_DIR=str(work / "config"),
               JUPYTER_DATA_DIR=str(work / "data"), JUPYTER_RUNTIME_DIR=str(work / "runtime"))
    log = open(work / "lab.log", "w+")
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    browser = None
    try:
        base, deadline = f"http://127.0.0.1:{port}", time.time() + TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                log.seek(0)
                assert server.poll() is None, f"`{shlex.join(cmd)}` stopped:\n{log.read()[-3000:]}"
                assert time.time() < deadline, f"JupyterLab did not start within {TIMEOUT_S} s"
                time.sleep(0.25)
        browser = _Browser(work / "chromium")
        browser.call("Page.navigate", url=f"{base}/lab/tree/{lab.COPIES_NAME}?token={token}")
        _wait(browser, "window.jupyterapp", "JupyterLab's page did not load")
        browser.js("window.jupyterapp.restored.then(() => 1)")
        yield browser
    finally:
        if browser:
            browser.close()
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        log.close()


def _wait(browser: _Browser, condition: str, what: str):
    deadline = time.time() + TIMEOUT_S
    while not browser.js(f"!!({condition})"):
        assert time.time() < deadline, f"{what} within {TIMEOUT_S} s"
        time.sleep(0.25)


# The open notebook's Markdown cells: {wait: why they are not rendered yet} or what they show.
RENDERED = """(() => {
  const panel = window.fedsteerPanel;
  if (!panel || panel.context.path !== PATH || !panel.context.isReady) return {wait: 'the notebook is not open'};
  const cells = Array.from(panel.node.querySelectorAll('.jp-MarkdownCell'));
  const rendered = cells.map(c => c.querySelector('.jp-RenderedMarkdown')).filter(Boolean);
  const prose = r => { const c = r.cloneNode(true);
                       c.querySelectorAll('code, pre, mjx-container').forEach(e => e.remove()); return c.textContent; };
  if (!cells.length || rendered.length < cells.length) return {wait: `${rendered.length} of ${cells.length} Markdown cells rendered`};
  if (rendered.some(r => !r.textContent.trim() && !r.querySelector('img'))) return {wait: 'a Markdown cell is empty'};
  const tex = rendered.map(prose).find(t => /\\$[^$\\s]/.test(t));
  if (tex) return {wait: 'math not typeset: ' + tex.slice(0, 200)};
  return {
    text: rendered.map(r => r.innerText).join('\\n\\n'),
    links: rendered.flatMap(r => Array.from(r.querySelectorAll('a[href]'))
                                      .map(a => [a.innerText, a.getAttribute('href')])),
    images: rendered.flatMap(r => Array.from(r.querySelectorAll('img')))
                    .map(i => [i.complete && i.naturalWidth > 0, i.alt]),
    math: rendered.reduce((n, r) => n + r.querySelectorAll('mjx-container').length, 0),
  };
})()"""


def _open(browser: _Browser, path: str) -> dict:
    browser.js(f"window.jupyterapp.commands.execute('docmanager:open', {{path: {json.dumps(path)}}})"
               ".then(panel => { window.fedsteerPanel = panel; return 1; })")
    deadline, last = time.time() + TIMEOUT_S, None
    while True:  # until every Markdown cell is rendered and two looks 0.5 s apart agree
        page = browser.js(RENDERED.replace("PATH", json.dumps(path)))
        if "wait" not in page and page == last:
            return page
        assert time.time() < deadline, f"{path} was not rendered within {TIMEOUT_S} s: {page.get('wait')}"
        last = page
        time.sleep(0.5)


def _richest_chapter() -> Path:
    """The chapter whose Markdown uses the most kinds of MyST that JupyterLab cannot render."""
    def kinds(path: Path) -> int:
        text = _markdown(json.loads(path.read_text(encoding="utf8")))
        return sum(kind in text for kind in KINDS)
    return max(CHAPTERS, key=kinds)


def test_a_chapter_reads_in_jupyterlab_as_in_the_book(jupyterlab, copies):
    browser, chapter = jupyterlab, _richest_chapter()
    source = json.loads(chapter.read_text(encoding="utf8"))
    source_md = _markdown(source)
    page = _open(browser, f"{lab.COPIES_NAME}/{chapter.name}")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"]))
    text, problems = page["text"], []

    raw = sorted({m.group(0) for m in RAW.finditer(text)})
    if raw:
        problems.append(f"raw MyST shows: {raw}")
    glue = lab.glue_values(source)
    for key in sorted(set(re.findall(r"\{glue:text\}`([^`:]+)`", source_md))):
        value = " ".join(lab.format_plain_text(lab._text(glue[key]["text/plain"]), "").split())
        if value not in " ".join(text.split()):
            problems.append(f"the glued value of {key!r} ({value[:60]!r}) is not shown")
    book = lab.read_book(CHAPTERS)
    reader = lab.ReadingPage(f"book/chapters/{chapter.stem}", book, glue, lab._bibliography())
    for key in sorted(set(k.strip() for ks in re.findall(r"\{cite:[pt]\}`([^`]+)`", source_md) for k in ks.split(","))):
        who, year = lab._authors_year(reader.bib[0].entries[key])
        who = who.replace("*", "")
        if not any(href == "#References" and label.startswith(who) for label, href in page["links"]):
            problems.append(f"no citation of {key!r} reads {who!r} and links to the references")
        if " ".join(reader.reference(key)[1].split())[:60] not in " ".join(text.split()):
            problems.append(f"the reference list has no entry for {key!r} ({who}, {year})")
    for role, target in re.findall(r"\{(doc|ref)\}`([^`]+)`", source_md):
        label = reader.doc_role(target) if role == "doc" else reader.ref_role(target, False)
        if label and re.fullmatch(r"\*[^*]+\*", label):  # a book page with no copy in the lab: its title, in italics
            if label.strip("*") not in " ".join(text.split()):
                problems.append(f"{{{role}}}`{target}` does not show the page's title {label!r}")
            continue
        expected = re.sub(r"^\[(.*)\]\(.*\)$", r"\1", label or target)
        if not any(text_ == expected and href for text_, href in page["links"]):
            problems.append(f"{{{role}}}`{target}` is not a link reading {expected!r}")
    figures = source_md.count("{glue:figure}")
    loaded = [alt for ok, alt in page["images"] if ok]
    if len(loaded) < figures:
        problems.append(f"{figures} glued figures, {len(loaded)} images loaded: {page['images']}")
    if re.search(r"\$[^$\s]", source_md) and not page["math"]:
        problems.append("the math is not typeset")
    assert not problems, f"{chapter.name} in JupyterLab (screenshot {SCREENSHOT}):\n" + "\n".join(problems)

    # A citation's link scrolls the notebook to its reference list.
    if "{cite:" in source_md:
        browser.js("window.fedsteerPanel.content.node.scrollTop = 0; "
                   "Array.from(window.fedsteerPanel.node.querySelectorAll('.jp-RenderedMarkdown a'))"
                   ".find(a => a.getAttribute('href') === '#References').click(); 1")
        _wait(browser, "(() => { const h = window.fedsteerPanel.node.querySelector("
                       "'h2[data-jupyter-id=\"References\"], h2[id=\"References\"]'); "
                       "const box = window.fedsteerPanel.content.node.getBoundingClientRect(); "
                       "const r = h && h.getBoundingClientRect(); return r && r.top >= box.top - 1 && r.top < box.bottom; })()",
              "a citation's link did not bring the reference list into view")

    # The chapter itself (what a reader saw before): the same check finds its raw MyST.
    original = _open(browser, chapter.name)
    assert RAW.search(original["text"]), f"{chapter.name} shows no raw MyST: the check above could not fail"
