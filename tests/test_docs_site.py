"""The documentation site: `mkdocs build --strict` of the real docs with no warning, nothing loaded
from another host (the site works offline and from disk), every internal link and anchor resolves,
and the generated Reference pages are current and complete (docs/scripts/generate.py writes them)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from .helpers import ROOT

DOCS = Path(ROOT) / "docs"
SCRIPTS = DOCS / "scripts"
# What a page could fetch from a CDN, a font service, an analytics service or an API at view time.
FETCHED = re.compile(r"""https?://[^\s'"`)]*(?:cdn|unpkg|jsdelivr|fonts\.g|analytics|googletagmanager|api\.github)[^\s'"`)]*""")
# The only such URLs Material's JavaScript holds, each behind a feature this site leaves off (see
# test_the_site_loads_nothing_from_another_host): Mermaid (a diagram on the page), the ResizeObserver
# polyfill (a browser without ResizeObserver, none current) and the repository's stars (repo_url).
DORMANT = ("https://unpkg.com/mermaid@", "https://unpkg.com/resize-observer-polyfill", "https://api.github.com/")
LOADING = {("link", "href"), ("script", "src"), ("img", "src"), ("iframe", "src"), ("source", "src"),
           ("video", "src"), ("audio", "src"), ("embed", "src"), ("object", "data"), ("image", "href"),
           ("use", "href"), ("img", "srcset"), ("source", "srcset")}


def _needs_docs_tools():
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("the docs tools are not installed: pip install -e '.[docs]'")


def _script(name: str):
    _needs_docs_tools()
    spec = importlib.util.spec_from_file_location(f"beliefscope_docs_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Page(HTMLParser):
    """The ids of one HTML page and the URLs it refers to: ``(tag, attribute, value)``."""

    def __init__(self, text: str):
        super().__init__()
        self.ids, self.refs, self.styles = set(), [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)
            elif name in ("href", "src", "data", "srcset", "xlink:href") and value is not None:
                self.refs.append((tag, name.removeprefix("xlink:"), value))
            elif name == "style" and value:
                self.styles.append(value)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The real docs built by `mkdocs build --strict` into a temporary folder: (folder, its output)."""
    _needs_docs_tools()
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                       env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), capture_output=True, text=True, timeout=600,
                       check=False)
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"mkdocs build --strict failed (a nav page missing? a warning?):\n{log[-6000:]}"
    return out, log


@pytest.fixture(scope="module")
def pages(site):
    return {p: _Page(p.read_text(encoding="utf-8")) for p in sorted(site[0].rglob("*.html"))}


def _external(url: str) -> bool:
    return bool(re.match(r"(?i)^(https?:)?//", url.strip()))


@pytest.mark.slow
def test_the_strict_build_has_no_warning(site):
    _, log = site
    bad = [line for line in log.splitlines() if re.match(r"\W*(WARNING|ERROR)\b", line)]
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_the_site_loads_nothing_from_another_host(site, pages):
    folder, _ = site
    loaded = [(p.relative_to(folder), tag, value) for p, page in pages.items() for tag, attr, value in page.refs
              if (tag, attr) in LOADING and any(_external(u.split()[0]) for u in value.split(",") if u.strip())]
    assert not loaded, f"pages load from another host: {loaded[:10]}"
    css_urls = re.compile(r"""url\(\s*['"]?([^'")]+)|@import\s+['"]([^'"]+)""")
    for path in sorted(folder.rglob("*.css")):
        urls = [a or b for a, b in css_urls.findall(path.read_text(encoding="utf-8"))]
        assert not [u for u in urls if _external(u)], f"{path.name} imports from another host"
    styles = [s for page in pages.values() for s in page.styles]
    assert not [s for s in styles if any(_external(a or b) for a, b in css_urls.findall(s))]
    text = "\n".join(p.read_text(encoding="utf-8") for p in pages)
    assert not re.search(r"fonts\.(googleapis|gstatic)\.com|googletagmanager|google-analytics", text)
    fetched = {m.group(0) for p in [*folder.rglob("*.js"), *pages] for m in FETCHED.finditer(p.read_text("utf-8"))}
    assert not [u for u in fetched if not u.startswith(DORMANT)], f"new URLs to fetch: {sorted(fetched)}"
    # ... and what would wake them is absent: no Mermaid diagram, no repository widget
    assert 'class="mermaid"' not in text and 'data-md-component="source"' not in text


@pytest.mark.slow
def test_every_internal_link_and_anchor_resolves(site, pages):
    folder, _ = site
    broken = []
    for path, page in pages.items():
        if path == folder / "404.html":  # a web server's page, linked from the server's root: not for file://
            continue
        for tag, attr, value in page.refs:
            parts = urlsplit(value)
            if parts.scheme or value.startswith("//") or attr == "srcset" or not value:
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if not target.is_file():  # a folder would not open from disk (file://): links end in .html
                broken.append(f"{path.relative_to(folder)}: {value}")
            elif parts.fragment and target in pages and unquote(parts.fragment) not in pages[target].ids:
                broken.append(f"{path.relative_to(folder)}: {value} (no such anchor)")
    assert not broken, "\n".join(broken[:40])


@pytest.mark.slow
def test_the_reference_pages_are_current(tmp_path):
    _needs_docs_tools()
    r = subprocess.run([sys.executable, str(SCRIPTS / "generate.py"), "--out", str(tmp_path), "--only", "reference"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    fresh = sorted(p.name for p in (tmp_path / "reference").glob("*.md"))
    assert fresh == sorted(p.name for p in (DOCS / "reference").glob("*.md")), "docs/reference/ has other pages"
    stale = [n for n in fresh if (tmp_path / "reference" / n).read_bytes() != (DOCS / "reference" / n).read_bytes()]
    assert not stale, f"{stale} are stale: run `python docs/scripts/generate.py` and commit the pages"


def _config_classes_in_the_source() -> dict[str, str]:
    """Every ``@dataclass`` ``class ...Config`` of the packages, found by a plain reading of the
    source: class name -> its module."""
    found = {}
    folders = {"beliefscope": "beliefscope", "benchmarks": "beliefscope.benchmarks"}
    folders.update({f: f"beliefscope.{f}" for f in ("tasks", "models", "hooks", "cache", "decoding", "probes",
                                                   "analyses", "checkpoints")})
    pattern = re.compile(r"^@(?:dataclasses\.)?dataclass\b.*\n(?:@.*\n)*class (\w+Config)\b", re.MULTILINE)
    for folder, package in folders.items():
        for path in sorted((Path(ROOT) / folder).glob("*.py")):
            for name in pattern.findall(path.read_text(encoding="utf-8")):
                found[name] = package if path.stem == "__init__" else f"{package}.{path.stem}"
    return found


@pytest.mark.slow
def test_configs_page_lists_every_config_dataclass_with_every_field():
    text = (DOCS / "reference" / "configs.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^### (\w+)\n(.*?)(?=^##|\Z)", text, re.MULTILINE | re.DOTALL))
    code = _config_classes_in_the_source()
    assert len(code) >= 30 and set(sections) == set(code), (set(code) ^ set(sections))
    for name, module in code.items():
        fields = [f.name for f in dataclasses.fields(getattr(importlib.import_module(module), name))]
        assert re.findall(r"^\| `(\w+)` \|", sections[name], re.MULTILINE) == fields, name


@pytest.mark.slow
def test_every_config_field_has_its_comment():
    from beliefscope.base.config_flags import field_help

    missing = []
    for name, module in _config_classes_in_the_source().items():
        cls = getattr(importlib.import_module(module), name)
        helps = field_help(cls)
        missing += [f"{name}.{f.name}" for f in dataclasses.fields(cls) if not helps.get(f.name)]
    assert not missing, f"fields without a trailing comment: {missing}"


def test_docstrings_become_markdown():
    reference = _script("reference")
    text = "Adds (:func:`add`), see :class:`~cache.KVCache`.\n>>> add(1, 1)\n2\n\nExample::\n\n    >>> add(2, 2)\n    4"
    assert reference.markdown_docstring(text).splitlines() == [
        "Adds (`add`), see `cache.KVCache`.", "", "```pycon", ">>> add(1, 1)", "2", "```", "",
        "Example:", "", "    >>> add(2, 2)", "    4"]
    assert reference.markdown_docstring(">>> x = 1").splitlines() == ["```pycon", ">>> x = 1", "```"]
    once = reference.markdown_docstring(text)
    assert reference.markdown_docstring(once) == once  # griffe may hand a docstring over twice


def test_table_cells_escape_pipes_tags_and_stars_outside_code():
    reference = _script("reference")
    assert reference._cell("a | b <x> 2 * 3 `int | None` ``a*b``") == \
        "a \\| b &lt;x> 2 \\* 3 `int | None` ``a*b``"
