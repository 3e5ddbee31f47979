"""A page of the book as JupyterLab reads it: the reading copies of `make lab` (tools/lab.py).

JupyterLab renders Markdown cells as CommonMark; the book's cells are MyST, whose roles only
Sphinx resolves: the glued numbers, figures and tables (`{glue:text}`, `{glue:}`, `{glue:md}`,
`{glue:figure}`; their values are the outputs of the chapter's own code cells), the citations
(`{cite:p}`, `{cite:t}`, from book/references.bib) and the cross-references (`{doc}`, `{ref}`,
`(label)=`). A copy written here says in plain Markdown what the book's page says: the glued
values in place, each citation as the book prints it with the chapter's reference list at the
end, links to the other copies, dropdowns as <details>, admonitions as quotes, a literalinclude
as the code it includes, figures numbered as in the book, and the cells the book hides
(hide-input, remove-cell, ...) collapsed; the book's prose pages (the rerun page, the Flower
page) likewise, with the files they include written in. Rerunning a copy does not rewrite its
text; the chapters to edit and rerun stay in notebooks/.
"""
from __future__ import annotations

import ast
import copy
import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
BOOK = REPO_ROOT / "book"
TOC = BOOK / "_toc.yml"
BIB = BOOK / "references.bib"

ROLE = re.compile(r"\{(?P<name>[\w:-]+)\}`(?P<text>[^`]*)`")
DIRECTIVE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[\w:-]+)\}[ \t]*(?P<arg>[^\n]*)\n"
                       r"(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S)
TARGET = re.compile(r"^\((?P<label>[\w.:-]+)\)=[ \t]*$", re.M)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)
FIGURES = ("figure", "glue:figure")
ADMONITIONS = ("admonition", "note", "tip", "hint", "important", "seealso", "warning", "caution",
               "attention", "danger", "error")
HIDDEN = {"remove-cell": ("source", "outputs"), "hide-cell": ("source", "outputs"),
          "remove-input": ("source",), "hide-input": ("source",),
          "remove-output": ("outputs",), "hide-output": ("outputs",)}
IMAGES = ("image/png", "image/jpeg", "image/svg+xml")


# ----------------------------------------------------------------------------- the whole book
@dataclass
class BookIndex:
    """What one page needs from the others: titles, labels, figure numbers, the bibliography."""
    titles: dict[str, str] = field(default_factory=dict)              # doc -> its h1
    labels: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # label -> (doc, text, anchor)
    figures: dict[str, list[int]] = field(default_factory=dict)       # doc -> its figure numbers
    copies: dict[str, str] = field(default_factory=dict)              # doc -> copy's file name


def _markdown(path: Path) -> str:
    if path.suffix == ".md":
        return path.read_text(encoding="utf8")
    cells = json.loads(path.read_text(encoding="utf8"))["cells"]
    return "\n\n".join(source_text(c["source"]) if c["cell_type"] == "markdown" else _figure_cell(c)
                       for c in cells if c["cell_type"] == "markdown" or _figure(c))


def _figure(cell: dict) -> dict | None:
    """myst-nb's figure options of a code cell that displays a figure (None for any other cell)."""
    return cell.get("metadata", {}).get("mystnb", {}).get("figure") if cell["cell_type"] == "code" else None


def _figure_cell(cell: dict) -> str:
    """A code cell's figure as the directive Sphinx numbers it like (its name, in page order)."""
    return f"```{{figure}} cell\n:name: {_figure(cell).get('name', '')}\n```"


def source_text(source: str | list[str]) -> str:
    return source if isinstance(source, str) else "".join(source)


def toc_parts() -> list[tuple[str, list[str]]]:
    """The book's parts in its order (book/_toc.yml): (caption, docs); the root page first, in a
    part without a caption."""
    toc = yaml.safe_load(TOC.read_text(encoding="utf8"))

    def walk(entries) -> list[str]:
        docs = []
        for entry in entries or []:
            if "file" in entry:
                docs.append(posixpath.splitext(entry["file"])[0])
            docs += walk(entry.get("sections"))
        return docs

    parts = [("", [toc["root"]])] + [(part.get("caption", ""), walk(part.get("chapters"))) for part in toc.get("parts", [])]
    return parts + ([("", walk(toc["chapters"]))] if toc.get("chapters") else [])


def copy_name(doc: str) -> str:
    """The file name of a page's reading copy: the page's own name, marked, so that JupyterLab's
    tab for a copy never reads like the tab for the notebook itself."""
    return f"{posixpath.basename(doc)} (as in the book).ipynb"


def read_book(chapters: list[Path], pages: tuple[str, ...] = ()) -> BookIndex:
    """Titles, `(label)=` targets and figure numbers (Sphinx numbers figures in toc order); the
    executed `chapters` and the prose `pages` (docs, e.g. "book/rerun") have copies."""
    by_stem = {p.stem: p for p in chapters}
    book, number = BookIndex(), 0
    for doc in (doc for _, docs in toc_parts() for doc in docs):
        stem = posixpath.basename(doc)
        path = by_stem.get(stem) if "/chapters/" in doc else REPO_ROOT / f"{doc}.md"
        if path is None or not path.is_file():
            continue
        text = _markdown(path)
        title = HEADING.search(text)
        book.titles[doc] = title.group(1) if title else stem
        if stem in by_stem or doc in pages:
            book.copies[doc] = copy_name(doc)
        for target in TARGET.finditer(text):
            heading = HEADING.search(text, target.end())
            title = heading.group(1) if heading else target["label"]
            book.labels[target["label"]] = (doc, title, heading_id(title))
        book.figures[doc] = []
        for fig in DIRECTIVE.finditer(text):
            if fig["name"] in FIGURES:
                number += 1
                book.figures[doc].append(number)
                name = re.search(r"^:name:\s*(\S+)", fig["body"], re.M)
                if name:
                    book.labels[name.group(1)] = (doc, f"Fig. {number}", "")
    return book


# ----------------------------------------------------------------------------- citations
def bibliography():
    from pybtex.database import parse_file
    from pybtex.plugin import find_plugin

    return parse_file(str(BIB)), find_plugin("pybtex.style.formatting", "plain")()


def authors_year(entry) -> tuple[str, str]:
    """sphinxcontrib-bibtex's author_year label: "Xiao *et al.*", "2017"."""
    from pybtex.richtext import Text

    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [str(Text.from_latex(" ".join(p.prelast_names + p.last_names))) for p in people]
    who = (names[0] if len(names) == 1 else " and ".join(names) if len(names) == 2
           else f"{names[0]} *et al.*" if names else entry.key)
    return who, entry.fields.get("year", "n.d.")


# ----------------------------------------------------------------------------- one page
@dataclass
class ReadingPage:
    doc: str
    book: BookIndex
    glue: dict[str, dict]
    bib: tuple
    cited: list[str] = field(default_factory=list)
    figure: int = 0
    attachments: dict[str, dict] = field(default_factory=dict)

    def next_figure(self) -> int:
        """The book's number of this page's next figure (a directive or a figure cell, in page order)."""
        numbers = self.book.figures.get(self.doc, [])
        number = numbers[self.figure] if self.figure < len(numbers) else self.figure + 1
        self.figure += 1
        return number

    # -- links
    def link(self, doc: str, text: str, anchor: str = "") -> str:
        target = "" if doc == self.doc else self.book.copies.get(doc)
        if target is None or not (target or anchor):
            return f"*{text}*" if target is None else text
        return f"[{text}](<{target}{'#' + anchor if anchor else ''}>)"

    def doc_role(self, text: str) -> str:
        label, target = _explicit(text)
        doc = posixpath.normpath(posixpath.join(posixpath.dirname(self.doc), target))
        return self.link(doc, label or self.book.titles.get(doc, target))

    def ref_role(self, text: str, numbered: bool) -> str | None:
        label, target = _explicit(text)
        if target not in self.book.labels:
            return None
        doc, title, anchor = self.book.labels[target]
        if label and numbered:
            label = label.replace("%s", title.split()[-1]).replace("{number}", title.split()[-1])
        return self.link(doc, label or title, anchor)

    def cite(self, keys: str, textual: bool) -> str | None:
        entries, _ = self.bib
        keys = [k.strip() for k in keys.split(",")]
        if not all(k in entries.entries for k in keys):
            return None
        self.cited += [k for k in keys if k not in self.cited]
        # Each links to the chapter's reference list, the full reference as its tooltip.
        parts = [(*authors_year(entries.entries[k]), self.reference(k)[1].replace('"', "'")) for k in keys]
        if textual:
            return ", ".join(f'[{who} \\[{year}\\]](#References "{full}")' for who, year, full in parts)
        return "\\[" + "; ".join(f'[{who}, {year}](#References "{full}")' for who, year, full in parts) + "\\]"

    def reference(self, key: str) -> tuple[str, str]:
        """The reference as the book's list prints it: (Markdown, plain text)."""
        entries, style = self.bib
        text = next(iter(style.format_entries([entries.entries[key]]))).text
        return (" ".join(text.render_as("markdown").split("\n")), " ".join(text.render_as("text").split("\n")))

    def references(self) -> str:
        lines = ["## References", ""]
        for key in self.cited:
            who, year = authors_year(self.bib[0].entries[key])
            lines += [f"\\[{who}, {year}\\] {self.reference(key)[0]}", ""]
        return "\n".join(lines)

    # -- glue
    def glued(self, key: str) -> dict | None:
        return self.glue.get(key.split("::")[-1])

    def image(self, key: str, alt: str) -> str | None:
        data = self.glued(key)
        mime = next((m for m in IMAGES if data and m in data), None)
        if mime is None:
            return None
        name = f"{key}.{mime.split('/')[1].split('+')[0]}"
        self.attachments[name] = {mime: data[mime]}
        alt = re.sub(r"[\[\]\n]", " ", alt)
        return f"![{alt}](attachment:{name})"

    def any_value(self, key: str, inline: bool) -> str | None:
        """`{glue:}` / `{glue}`: the value's richest form, as myst-nb chooses it."""
        data = self.glued(key)
        if data is None:
            return None
        if "text/markdown" in data:
            return self.convert(source_text(data["text/markdown"]))
        if "text/html" in data and not inline:
            return "\n".join(line for line in source_text(data["text/html"]).splitlines() if line.strip())
        if any(m in data for m in IMAGES):
            return self.image(key, key)
        return format_plain_text(source_text(data["text/plain"]), "")

    # -- Markdown
    def convert(self, text: str) -> str:
        text = DIRECTIVE.sub(lambda m: self.directive(m) or m.group(0), text)
        text = TARGET.sub("", text)  # JupyterLab links to headings by their text, not by labels
        return ROLE.sub(lambda m: self.role(m["name"], m["text"]) or m.group(0), text)

    def role(self, name: str, text: str) -> str | None:
        if name == "glue:text":
            key, _, fmt = text.rpartition(":") if ":" in text.split("::")[-1] else (text, "", "")
            data = self.glued(key)
            return format_plain_text(source_text(data["text/plain"]), fmt) if data else None
        if name in ("glue", "glue:", "glue:any"):
            return self.any_value(text, inline=True)
        if name == "glue:md":
            data = self.glued(text.split("::")[-1].split(":")[0])
            return self.convert(source_text(data["text/markdown"])) if data else None
        if name in ("cite", "cite:p", "cite:ps", "cite:t", "cite:ts"):
            return self.cite(text, textual=name.startswith("cite:t"))
        if name == "doc":
            return self.doc_role(text)
        if name in ("ref", "numref"):
            return self.ref_role(text, numbered=name == "numref")
        if name in ("math", "eq"):
            return f"${text}$"
        if name == "download":  # a file outside JupyterLab's root: where it is
            path = posixpath.normpath(posixpath.join(posixpath.dirname(self.doc), _explicit(text)[1]))
            return f"`{path}`"
        return None

    def directive(self, m: re.Match) -> str | None:
        name, arg = m["name"], m["arg"].strip()
        options = dict(re.findall(r"^:([\w-]+):[ \t]*(.*)$", m["body"].split("\n\n")[0], re.M))
        content = re.sub(r"\A(?::[\w-]+:.*\n)*\n?", "", m["body"]).strip("\n")
        if name in FIGURES:
            image = (self.image(arg, options.get("alt", arg)) if name == "glue:figure"
                     else f"![{options.get('alt', '')}]({arg})")
            if image is None:
                return None
            return f"{image}\n\n**Fig. {self.next_figure()}** {self.convert(content)}\n"
        if name in ("glue", "glue:", "glue:any", "glue:md"):
            value = self.any_value(arg, inline=False)
            return None if value is None else f"{value}\n"
        if name == "dropdown":
            return f"<details>\n<summary>{arg}</summary>\n\n{self.convert(content)}\n\n</details>\n"
        if name in ADMONITIONS:
            title = arg if name == "admonition" else name.capitalize() + (f": {arg}" if arg else "")
            body = self.convert(content)
            return "\n".join(["> **" + title + "**", ">"] + [f"> {line}" for line in body.split("\n")]) + "\n"
        if name == "literalinclude":
            code = _include(Path(os.path.normpath(REPO_ROOT / posixpath.dirname(self.doc) / arg)), options)
            return f"```{options.get('language', '')}\n{code}\n```\n"
        if name == "math":
            return f"$$\n{content}\n$$\n"
        if name == "include":
            path = Path(os.path.normpath(REPO_ROOT / posixpath.dirname(self.doc) / arg))
            if path.is_file():
                return self.convert(path.read_text(encoding="utf8")) + "\n"
            return f"*(`{path.relative_to(REPO_ROOT)}` is written by `make book` or `make generated`.)*\n"
        return None


def format_plain_text(text: str, fmt: str) -> str:
    """myst-nb's `{glue:text}`key:fmt``: the text/plain value, unquoted, formatted by `fmt`
    (myst_nb.core.variables.format_plain_text; importing myst_nb costs seconds)."""
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if not fmt:
        return str(value)
    kind = fmt[-1]
    value = (str(value) if kind == "s" else int(value) if kind in "bcdoxX"
             else float(value) if kind in "eEfFgGn%" else value)
    return format(value, fmt)


def heading_id(heading: str) -> str:
    """JupyterLab's id of a rendered Markdown heading (its text, spaces as '-'): what a
    `NN.ipynb#id` link scrolls to."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[*`]", "", text).strip().replace(" ", "-")


def _explicit(text: str) -> tuple[str, str]:
    """`text <target>` -> (text, target); `target` -> ("", target)."""
    m = re.fullmatch(r"\s*(.*?)\s*<([^<>]+)>\s*", text, re.S)
    return (m.group(1), m.group(2)) if m else ("", text.strip())


def _include(path: Path, options: dict[str, str]) -> str:
    source = path.read_text(encoding="utf8")
    if "pyobject" in options:
        for node in ast.walk(ast.parse(source)):
            if getattr(node, "name", None) == options["pyobject"]:
                start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
                return "\n".join(source.splitlines()[start - 1:node.end_lineno])
    return source.rstrip("\n")


# ----------------------------------------------------------------------------- notebooks
def glue_values(nb: dict) -> dict[str, dict]:
    """Each glued name's mime bundle, from the scrapbook outputs of `glue(...)`."""
    values = {}
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            meta = out.get("metadata", {}).get("scrapbook")
            if meta and "data" in out:
                prefix = meta.get("mime_prefix", "")
                values[meta["name"]] = {k[len(prefix):]: v for k, v in out["data"].items()}
    return values


def reading_copy(nb: dict, doc: str, book: BookIndex, bib, source_note: str) -> dict:
    nb = copy.deepcopy(nb)
    page = ReadingPage(doc, book, glue_values(nb), bib)
    captions: list[tuple[dict, str]] = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            page.attachments = dict(cell.get("attachments", {}))
            cell["source"] = page.convert(source_text(cell["source"]))
            if page.attachments:
                cell["attachments"] = page.attachments
        elif cell["cell_type"] == "code":
            if _figure(cell):  # its caption as the book prints it, numbered in page order
                captions.append((cell, f"**Fig. {page.next_figure()}** {page.convert(_figure(cell).get('caption', ''))}"))
            cell["outputs"] = [o for o in cell.get("outputs", [])
                               if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
            hidden = {part for tag in cell["metadata"].get("tags", []) for part in HIDDEN.get(tag, ())}
            for part in hidden:
                cell["metadata"].setdefault("jupyter", {})[f"{part}_hidden"] = True
    for k, (cell, caption) in enumerate(captions):
        at = next(i for i, c in enumerate(nb["cells"]) if c is cell)
        nb["cells"].insert(at + 1, {"cell_type": "markdown", "metadata": {}, "id": f"reading-copy-caption-{k}",
                                    "source": caption})
    note = {"cell_type": "markdown", "metadata": {}, "id": "reading-copy-note", "source": source_note}
    nb["cells"].insert(0, note)
    if page.cited:
        nb["cells"].append({"cell_type": "markdown", "metadata": {}, "id": "reading-copy-references",
                            "source": page.references()})
    return nb
