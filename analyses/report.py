"""The demo's self-contained `report.html`: figures inlined as base64 PNG, and the plain-language reading of
each figure (`analyses.readings`). It looks like the docs site (Material's indigo and deep orange, the system
fonts); Markdown the analyses write (`instrument.table_lines`) is rendered by a small renderer here, tables as
HTML tables that scroll inside their own box, so the page never scrolls sideways.

>>> table([{"layer": 2, "accuracy": 0.91234}], ["layer", "accuracy"]).count("<td")
2
"""

from __future__ import annotations

import html
import re

from .common import png_data_uri

# The docs site's look (MkDocs Material, `palette: primary: indigo, accent: deep orange`, `font: false`):
# its system font stacks, indigo for the header bar, headings, links and table heads, deep orange on hover
# and focus. Nothing may widen the page: tables scroll inside their own wrapper, figures and code shrink
# or scroll inside themselves, long words break.
INDIGO, DEEP_ORANGE = "#3f51b5", "#ff5722"
CSS = f"""*,*::before,*::after{{box-sizing:border-box}}
html{{-webkit-text-size-adjust:100%;text-size-adjust:100%}}
body{{font-family:-apple-system,BlinkMacSystemFont,'Segoe UI',Helvetica,Arial,sans-serif;font-size:16px;
line-height:1.6;color:rgba(0,0,0,.87);background:#fff;margin:0;overflow-wrap:break-word}}
header.top{{background:{INDIGO};color:#fff;box-shadow:0 0 .2rem rgba(0,0,0,.1),0 .2rem .4rem rgba(0,0,0,.2)}}
header.top div,main{{max-width:1220px;margin:0 auto;padding:0 24px}}
header.top div{{padding-top:14px;padding-bottom:12px}}
h1{{font-size:1.45em;font-weight:400;margin:0;letter-spacing:-.01em}}
header.top p.meta{{color:rgba(255,255,255,.82);font-size:.85em;margin:2px 0 0}}
header.top code{{background:rgba(255,255,255,.16);color:#fff}}
h2{{font-size:1.25em;font-weight:500;color:{INDIGO};border-bottom:2px solid rgba(63,81,181,.25);
padding-bottom:3px;margin:2em 0 .7em}}
h3{{font-size:1.05em;font-weight:600;color:{INDIGO};margin:1.4em 0 .5em}}
a{{color:{INDIGO};text-decoration:none}}a:hover,a:focus{{color:{DEEP_ORANGE};text-decoration:underline}}
a:focus-visible{{outline:2px solid {DEEP_ORANGE};outline-offset:2px}}
nav.toc ul{{padding-left:1.4em;margin:1em 0}}nav.toc li{{margin:.1em 0}}
p.reading{{background:rgba(63,81,181,.06);border-left:4px solid {INDIGO};border-radius:2px;padding:8px 14px}}
figure{{margin:1em 0;max-width:100%}}img{{max-width:100%;height:auto}}
figure img{{display:block;margin:0 auto;border:1px solid rgba(0,0,0,.07);border-radius:2px}}
figcaption{{font-size:.85em;color:rgba(0,0,0,.6);margin-top:.4em;max-width:60em}}
code,pre,kbd{{font-family:SFMono-Regular,Consolas,Menlo,monospace}}
code{{background:#f5f5f5;color:#36464e;font-size:.85em;padding:.1em .35em;border-radius:2px;
overflow-wrap:anywhere}}
pre{{background:#f5f5f5;color:#36464e;font-size:.8em;line-height:1.5;padding:10px 14px;border-radius:2px;
max-width:100%;overflow-x:auto;white-space:pre-wrap}}
pre code{{background:none;padding:0;font-size:1em}}
.table-wrap{{max-width:100%;overflow-x:auto;margin:1em 0}}
.table-wrap table{{border-collapse:separate;border-spacing:0;font-size:.8em;line-height:1.5;
border:1px solid rgba(0,0,0,.12);border-radius:2px;background:#fff}}
.table-wrap th{{font-weight:700;text-align:left;color:{INDIGO};background:rgba(63,81,181,.06);
border-bottom:2px solid {INDIGO};padding:.55em 1em;vertical-align:bottom;white-space:nowrap}}
.table-wrap td{{border-top:1px solid rgba(0,0,0,.07);padding:.45em 1em;vertical-align:top}}
.table-wrap tr:hover td{{background:rgba(255,87,34,.06)}}
.table-wrap td.num,.table-wrap th.num{{text-align:right;font-variant-numeric:tabular-nums}}
.table-wrap td.num{{white-space:nowrap}}.table-wrap .c{{text-align:center}}
.table-wrap code{{white-space:nowrap;overflow-wrap:normal}}
"""


def table(rows: list[dict], cols: list[str]) -> str:
    """An HTML table of `rows` (dicts) over `cols`, in its own horizontally scrolling wrapper."""
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    return _html_table(cols, cells)


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


_NUMBER = re.compile(r"^[-+−–]?(?:\d[\d,]*\.?\d*|\.\d+)(?:e[-+]?\d+)?%?$|^[-–]$|^n/a$|^$", re.IGNORECASE)


def _html_table(head: list[str], rows: list[list[str]], align: list[str] | None = None, inline=html.escape) -> str:
    """<table> in a `.table-wrap` div. `align` per column ("left", "right", "center" or "" for: right
    where every body cell is a number or a dash, left otherwise); `inline` turns a cell's text into HTML."""
    n = len(head)
    rows = [(list(r) + [""] * n)[:n] for r in rows]
    align = list(align or [""] * n) + [""] * n
    cls = []
    for j in range(n):
        a = align[j] or ("right" if rows and all(_NUMBER.match(r[j].strip()) for r in rows) else "left")
        cls.append({"right": " class='num'", "center": " class='c'"}.get(a, ""))
    thead = "".join(f"<th{cls[j]}>{inline(h)}</th>" for j, h in enumerate(head))
    tbody = "".join("<tr>" + "".join(f"<td{cls[j]}>{inline(c)}</td>" for j, c in enumerate(r)) + "</tr>"
                    for r in rows)
    return f"<div class='table-wrap'><table><thead><tr>{thead}</tr></thead><tbody>{tbody}</tbody></table></div>"


# The Markdown the project writes (`instrument.table_lines`, the `.md` files beside the figures): pipe
# tables, `-` lists, `#` headings, fenced code and paragraphs, with `code`, **bold** and *emphasis* inline.
# A small renderer, so that the report needs no Markdown package.
_SEP_CELL = re.compile(r"^\s*:?-{1,}:?\s*$")
_INLINE = re.compile(r"(`+)(.+?)\1|\*\*(.+?)\*\*|(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")


def inline_markdown(text: str) -> str:
    """One line of Markdown's inline markup as HTML (everything else escaped).

    >>> inline_markdown("thinking (`blocks.3.hook_resid_post`) & **bold** <x>")
    'thinking (<code>blocks.3.hook_resid_post</code>) &amp; <strong>bold</strong> &lt;x&gt;'
    """
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos:m.start()], quote=False))
        if m.group(1):
            out.append(f"<code>{html.escape(m.group(2).strip(), quote=False)}</code>")
        elif m.group(3) is not None:
            out.append(f"<strong>{inline_markdown(m.group(3))}</strong>")
        else:
            out.append(f"<em>{inline_markdown(m.group(4))}</em>")
        pos = m.end()
    out.append(html.escape(text[pos:], quote=False))
    return "".join(out)


def _cells(line: str) -> list[str]:
    """A pipe-table row's cells: outer pipes optional, `\\|` is a literal pipe, pipes inside `code` too."""
    s = line.strip()
    s = s.removeprefix("|")
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    cells, cur, in_code, i = [], [], False, 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s) and s[i + 1] == "|":
            cur.append("|")
            i += 2
            continue
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
        i += 1
    cells.append("".join(cur).strip())
    return cells


def _is_table_start(lines: list[str], i: int) -> bool:
    """Lines i and i+1 are a pipe table's header and its `|---|---|` separator."""
    if i + 1 >= len(lines) or "|" not in lines[i] or "-" not in lines[i + 1]:
        return False
    sep = _cells(lines[i + 1])
    return bool(sep) and all(_SEP_CELL.match(c) for c in sep) and len(_cells(lines[i])) >= 1


def has_markdown_table(text: str) -> bool:
    lines = text.splitlines()
    return any(_is_table_start(lines, i) for i in range(len(lines)))


def markdown_html(text: str | list[str]) -> str:
    """The Markdown subset the project writes, as HTML: tables become `<table>`s in a scrolling wrapper.

    >>> print(markdown_html(["| model | acc |", "|---|---|", "| a (`h`) | 0.5 |", "", "- done."]))
    <div class='table-wrap'><table><thead><tr><th>model</th><th class='num'>acc</th></tr></thead><tbody><tr>...
    <ul><li>done.</li></ul>
    """
    lines = text if isinstance(text, list) else text.splitlines()
    lines = [ln.rstrip() for ln in lines]
    out, i, n = [], 0, len(lines)
    while i < n:
        line = lines[i]
        s = line.strip()
        if not s:
            i += 1
        elif s.startswith("```"):
            j = i + 1
            while j < n and not lines[j].strip().startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1:j]), quote=False) + "</code></pre>")
            i = j + 1
        elif _is_table_start(lines, i):
            head = _cells(line)
            align = ["center" if c.strip().startswith(":") and c.strip().endswith(":") else
                     "right" if c.strip().endswith(":") else "left" if c.strip().startswith(":") else ""
                     for c in _cells(lines[i + 1])]
            rows, i = [], i + 2
            while i < n and lines[i].strip() and "|" in lines[i]:
                rows.append(_cells(lines[i]))
                i += 1
            out.append(_html_table(head, rows, align, inline_markdown))
        elif re.match(r"#{1,6}\s", s):
            level = min(len(s) - len(s.lstrip("#")) + 2, 6)  # the report's sections are h2: start below them
            out.append(f"<h{level}>{inline_markdown(s.lstrip('#').strip())}</h{level}>")
            i += 1
        elif re.match(r"[-*+]\s", s) or re.match(r"\d+[.)]\s", s):
            tag = "ul" if s[0] in "-*+" else "ol"
            items = []
            while i < n and lines[i].strip():
                t = lines[i].strip()
                m = re.match(r"(?:[-*+]|\d+[.)])\s+(.*)", t)
                if m:
                    items.append(m.group(1))
                elif items:  # a continuation line of the item above
                    items[-1] += " " + t
                else:
                    break
                i += 1
            out.append(f"<{tag}>" + "".join(f"<li>{inline_markdown(t)}</li>" for t in items) + f"</{tag}>")
        else:
            para = []
            while (i < n and lines[i].strip() and not _is_table_start(lines, i)
                   and not re.match(r"(?:[-*+]|\d+[.)]|#{1,6}|```)\s*", lines[i].strip())):
                para.append(lines[i].strip())
                i += 1
            if not para:  # a line no rule above took (e.g. "-" alone): keep it as text
                para, i = [s], i + 1
            out.append("<p>" + inline_markdown(" ".join(para)) + "</p>")
    return "\n".join(out)


_PRE = re.compile(r"<pre>(.*?)</pre>", re.DOTALL)


def _tables_from_pre(fragment: str) -> str:
    """A `<pre>` block whose (escaped) text is Markdown with a pipe table becomes that Markdown rendered:
    the sections hand over `instrument.table_lines` that way."""
    def sub(m):
        text = html.unescape(m.group(1))
        return markdown_html(text) if has_markdown_table(text) else m.group(0)
    return _PRE.sub(sub, fragment)


def render(title: str, meta: str, sections: list[dict]) -> str:
    """sections: [{"title", "reading", "figures": [(png bytes, caption)], "html": extra, "markdown": text}]
    -> HTML text. ``markdown`` (text or lines) is rendered with `markdown_html`; a ``<pre>`` in ``html``
    that holds a Markdown pipe table is rendered the same way. `meta` is HTML."""
    head = ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
            f"<header class='top'><div><h1>{html.escape(title)}</h1><p class='meta'>{meta}</p></div></header><main>")
    parts = [head]
    parts.append("<nav class='toc'><ul>" + "".join(f"<li><a href='#s{i}'>{html.escape(s['title'])}</a></li>"
                                                   for i, s in enumerate(sections)) + "</ul></nav>")
    for i, s in enumerate(sections):
        parts.append(f"<h2 id='s{i}'>{html.escape(s['title'])}</h2>")
        if s.get("reading"):
            parts.append(f"<p class='reading'>{html.escape(s['reading'])}</p>")
        for data, cap in s.get("figures", []):
            parts.append(f"<figure><img src='{png_data_uri(data)}' alt='{html.escape(cap)}'>"
                         f"<figcaption>{html.escape(cap)}</figcaption></figure>")
        if s.get("markdown"):
            parts.append(markdown_html(s["markdown"]))
        parts.append(_tables_from_pre(s.get("html", "")))
    parts.append("</main></body></html>")
    return "\n".join(parts)
