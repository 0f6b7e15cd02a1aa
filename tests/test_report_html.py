"""The demo's report.html reads like the docs: the instrument's Markdown table (and the lists beside it)
arrive as HTML, checked cell by cell against the numbers it came from (parsed back with html.parser);
the page never scrolls sideways in a real browser at 800 px (wide tables scroll inside their own
wrapper, figures shrink); the site's palette and system fonts; nothing fetched.

The browser test needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package;
without them it skips with the reason.
"""

import html
import io
from html.parser import HTMLParser

import pytest

from beliefscope.analyses import report
from beliefscope.analyses.instrument import COLUMNS, table_lines

from .helpers import browser_parts


def _instrument() -> dict:
    """An `instrument` result by hand: two models, two bands, a column one model lacks, the causal check."""
    def band(p, f, t=None, c=0.6):
        b = {"probe_accuracy": p, "forced_accuracy": f, "probe_forced_agreement": min(p, f), "control_accuracy": c}
        if t is not None:
            b.update(thought_accuracy=t, probe_thought_agreement=min(p, t), forced_thought_agreement=min(f, t))
        return b

    return {"models": {
        "thinking": {"hook": "blocks.3.hook_resid_post", "verdict": "thinking keeps a running state",
                     "bands": {"1-8": band(0.9231, 1.0, 1.0, 0.6538), "9-16": band(0.9277, 1.0, 0.9876, 0.5904)},
                     "random_init_probe_accuracy": 0.5,
                     "causal": {"n": 4, "answer_flip_rate_swap": 1.0, "answer_follows_swap": 1.0,
                                "downstream_thoughts_follow_swap": 1.0, "answer_flip_rate_random": 0.0,
                                "answer_follows_random": 0.0, "downstream_thoughts_follow_random": 0.0}},
        "target": {"hook": "blocks.2.hook_resid_post", "verdict": "target computes the state <lazily> & late",
                   "bands": {"1-8": band(0.6923, 1.0), "9-16": band(0.5783, 0.7952, c=0.8554)},
                   "random_init_probe_accuracy": 0.7308}}}


def _expected_rows(inst: dict) -> list[list[str]]:
    """The instrument table's cells from the result itself (not from its Markdown)."""
    rows = []
    for name, r in inst["models"].items():
        for i, (band, b) in enumerate(r["bands"].items()):
            ri = f"{r['random_init_probe_accuracy']:.3f}" if i == 0 else ""
            rows.append([f"{name} ({r['hook']})", band] + [f"{b[k]:.3f}" if k in b else "-" for k, _ in COLUMNS]
                        + [ri])
    return rows


class _Page(HTMLParser):
    """Every <table>'s rows as lists of cell texts, every <pre>'s text, and every src/href."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tables, self.pres, self.urls, self.items = [], [], [], []
        self._cell = self._pre = self._li = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "pre":
            self._pre = []
        elif tag == "li":
            self._li = []

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "pre":
            self.pres.append("".join(self._pre))
            self._pre = None
        elif tag == "li":
            self.items.append("".join(self._li).strip())
            self._li = None

    def handle_data(self, data):
        for part in (self._cell, self._pre, self._li):
            if part is not None:
                part.append(data)


def _sections(inst: dict) -> list[dict]:
    """The demo's sections around the instrument table, as demo_view and demo_thinking hand them over
    (a <pre> of the escaped Markdown: html.escape, and & and < only), with a data table and a figure."""
    md = "\n".join(table_lines(inst))
    return [{"title": "The validated instrument", "reading": "reading <b>", "figures": [],
             "html": "<pre>" + html.escape(md) + "</pre>"},
            {"title": "The belief instrument", "reading": "", "figures": [],
             "html": "<pre>" + md.replace("&", "&amp;").replace("<", "&lt;") + "</pre>"},
            {"title": "Task accuracy", "reading": "", "figures": [],
             "html": report.table([{"events": "1-8", "acc": 0.91234, "n": 3}, {"events": "9-16", "acc": None, "n": 4}],
                                  ["events", "acc", "n"])},
            {"title": "As Markdown", "markdown": md},
            {"title": "A plain pre", "html": "<pre>x | y\nno table here</pre>"}]


def test_instrument_table_is_an_html_table():
    inst = _instrument()
    text = report.render("beliefscope demo: test", "model <code>x</code>", _sections(inst))
    page = _Page(text)
    want = _expected_rows(inst)
    head = ["model", "events"] + [c for _, c in COLUMNS] + ["random-init"]
    instrument_tables = [t for t in page.tables if t[0] == head]
    assert len(instrument_tables) == 3  # both <pre> spellings and the "markdown" key
    for t in instrument_tables:
        assert t[1:] == want
    # the lists under the table: verdicts (escaped text, not markup) and the causal check
    assert "target computes the state <lazily> & late." in page.items
    assert any(i.startswith("causal check on thinking (4 prompts)") for i in page.items)
    assert "<code>blocks.3.hook_resid_post</code>" in text
    # no Markdown table left in a <pre>; a <pre> without a table stays one
    assert not [p for p in page.pres if "|---" in p]
    assert page.pres == ["x | y\nno table here"]
    assert "|---" not in text and "| model |" not in text
    # the data table: _fmt's cells, numbers right-aligned, and every table in a scrolling wrapper
    acc = next(t for t in page.tables if t[0] == ["events", "acc", "n"])
    assert acc[1:] == [["1-8", "0.9123", "3"], ["9-16", "–", "4"]]
    assert text.count("<table>") == text.count("<div class='table-wrap'><table>") == 4
    assert "<td class='num'>0.9123</td>" in text and "<td>1-8</td>" in text
    assert "reading &lt;b&gt;" in text  # readings stay text
    assert all(u.startswith(("#", "data:")) for u in page.urls) and "http" not in text  # self-contained


def test_site_palette_and_fonts():
    css = report.CSS
    assert "#3f51b5" in css and "#ff5722" in css  # Material indigo (primary) and deep orange (accent)
    assert "-apple-system" in css and "BlinkMacSystemFont" in css  # mkdocs.yml: font: false, the system's fonts
    assert ".table-wrap{max-width:100%;overflow-x:auto" in css and "img{max-width:100%" in css
    assert "overflow-x:auto" in css.split("\npre{")[1].split("}")[0]


@pytest.mark.parametrize("md, head, rows", [
    ("| a | b |\n|---|---|\n| `x|y` | 1 |", ["a", "b"], [["x|y", "1"]]),  # a pipe inside code
    ("a | b\n:-- | --:\nc \\| d | 2", ["a", "b"], [["c | d", "2"]]),  # no outer pipes, an escaped pipe
    ("| a | b | c |\n|---|:-:|---|\n| 1 |\n| <i> | & | **z** |", ["a", "b", "c"], [["1", "", ""], ["<i>", "&", "z"]]),
])
def test_markdown_tables(md, head, rows):
    out = report.markdown_html(md)
    page = _Page(out)
    assert len(page.tables) == 1 and page.tables[0] == [head] + rows
    assert "<i>" not in out  # cells are escaped text plus Markdown's inline markup


def test_markdown_blocks():
    out = report.markdown_html("# Title\nsome *text*\nmore\n\n- one\n  two\n- `three`\n\n```\n| a |\n|---|\n```")
    assert out.split("\n", 3) == ["<h3>Title</h3>", "<p>some <em>text</em> more</p>",
                                 "<ul><li>one two</li><li><code>three</code></li></ul>",
                                 "<pre><code>| a |\n|---|</code></pre>"]  # a table in fenced code stays code


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_thinking_demo_report_has_the_instrument_table(tmp_path):
    """End to end: `beliefscope demo --model thinking --quick`, its instrument table against summary.json."""
    import json

    from beliefscope.analyses.demo import DemoConfig
    from beliefscope.analyses.demo_thinking import main

    out = tmp_path / "demo"
    main(DemoConfig(out=str(out), model="thinking", quick=True, progress=False))
    inst = json.loads((out / "summary.json").read_text())["instrument"]
    page = _Page((out / "report.html").read_text())
    tables = [t for t in page.tables if t[0][:2] == ["model", "events"]]
    assert len(tables) == 1 and tables[0][1:] == _expected_rows(inst)
    assert not [p for p in page.pres if "|" in p]


def _wide_png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (2400, 300), (63, 81, 181)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.slow
def test_no_sideways_scrolling_in_a_browser(tmp_path):
    parts, why = browser_parts()
    if parts is None:
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    inst = _instrument()
    wide = {f"column_{i}": 0.123456 * i for i in range(16)}
    sections = _sections(inst) + [
        {"title": "A wide figure, a wide table, long code", "reading": "x" * 400,
         "figures": [(_wide_png(), "a figure 2400 px wide")],
         "html": report.table([wide], list(wide)) + "<p><code>" + "a.b" * 200 + "</code></p>"
                 + "<pre>" + "long_line " * 200 + "</pre>"}]
    path = tmp_path / "report.html"
    path.write_text(report.render("beliefscope demo: browser", "model <code>" + "m" * 150 + "</code>", sections))
    opts = webdriver.ChromeOptions()
    opts.binary_location = parts[0]
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=800,900",
              "--disable-extensions", "--no-first-run", "--disable-background-networking"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(parts[1]), options=opts)
    try:
        for width in (800, 1280):
            drv.set_window_size(width, 900)
            drv.get(path.as_uri())
            drv.set_window_size(2 * width - drv.execute_script("return window.innerWidth"), 900)  # viewport = width
            sw, cw = drv.execute_script("const d = document.documentElement; return [d.scrollWidth, d.clientWidth]")
            assert cw <= width and sw <= cw, (width, sw, cw)
            # the wide tables scroll inside their wrappers; the figure shrinks to the column
            wraps = drv.execute_script("return [...document.querySelectorAll('.table-wrap')]"
                                       ".map(e => [e.scrollWidth, e.clientWidth])")
            assert len(wraps) == 5 and any(s > c for s, c in wraps) and all(c <= cw for _, c in wraps)
            img = drv.execute_script("return document.querySelector('figure img').getBoundingClientRect().right")
            assert img <= cw
            th = drv.execute_script("return getComputedStyle(document.querySelector('th')).color")
            assert th == "rgb(63, 81, 181)"
    finally:
        drv.quit()
