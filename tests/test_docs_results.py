"""The Results pages of the docs (docs/results/*.md) hold no figure typed by hand.

(a) The committed pages are what ``docs/scripts/results.py`` writes from the JSON now.
(b) Independently of that script, `check_page` reads every figure back from a page (each is a
    ``<span class="fig" title="FILE#/json/pointer" data-fmt="FMT">TEXT</span>``), looks its value up in the
    JSON, prints it the way FMT says and reports every mismatch; it also reports a bare number in a table
    cell or a source line (a figure without its source), and a section with a table but no source line.
(c) A figure changed on a copy of a page is reported, and only that one.
Also: the pictures the pages show exist and are current, and benchmarks/README.md lists exactly the
benchmarks of benchmarks/cli.py.
"""

from __future__ import annotations

import datetime
import functools
import glob
import html
import importlib.util
import json
import os
import re
import subprocess

import pytest

from .helpers import ROOT

PAGES = os.path.join(ROOT, "docs", "results")
FIG = re.compile(r'<span class="fig" title="([^"]*)" data-fmt="([^"]*)">([^<]*)</span>')


# ------------------------------------------------------------------------------------ the checker
def _num(v, d: int) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"not a number: {v!r}")
    return f"{float(v):.{d}f}"


def expected_text(value, fmt: str) -> str:
    """How a page prints ``value`` under ``data-fmt``: the formats of docs/scripts/results.py, written again."""
    simple = {
        "str": lambda v: v if isinstance(v, str) else _fail(v),
        "gitdate": lambda v: v,
        "date": lambda v: v[:10] if re.match(r"\d{4}-\d\d-\d\d", v) else _fail(v),
        "yesno": lambda v: {True: "yes", False: "no"}[v] if isinstance(v, bool) else _fail(v),
        "met": lambda v: {True: "met", False: "missed"}[v] if isinstance(v, bool) else _fail(v),
        "len": lambda v: str(len(v)),
        "int": lambda v: str(int(v)) if not isinstance(v, bool) and float(v) == int(v) else _fail(v),
    }
    if fmt in simple:
        return simple[fmt](value)
    kind, d = re.fullmatch(r"([a-z]+)(\d)", fmt).groups()
    d = int(d)
    if kind == "f":
        return _num(value, d)
    if kind == "x":
        return _num(value, d) + "x"
    if kind == "e":
        return f"{float(value):.{d}e}"
    if kind == "pct":
        return _num(100 * value, d) + "%"
    if kind == "iqr":
        return _num(value["q1"], d) + "–" + _num(value["q3"], d)
    if kind == "range":
        return _num(value[0], d) + "–" + _num(value[1], d)
    if kind == "list":
        return ", ".join(_num(v, d) for v in value)
    raise ValueError(f"unknown format {fmt!r}")


def _fail(v):
    raise TypeError(f"unexpected value {v!r}")


def lookup(doc, ptr: str):
    """RFC 6901: ``/a/0/b~1c`` is doc["a"][0]["b/c"]."""
    if ptr == "":
        return doc
    for raw in ptr.split("/")[1:]:
        key = raw.replace("~1", "/").replace("~0", "~")
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    return doc


def _read(path, mode: str = "r"):
    with open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        return f.read()


@functools.cache
def _json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def commit_date(root: str, rel: str) -> str:
    """The file's last commit date; today while it has uncommitted changes."""
    dirty = subprocess.run(["git", "status", "--porcelain", "--", rel], cwd=root, capture_output=True, text=True,
                           check=False)
    if dirty.stdout.strip():
        return datetime.date.today().isoformat()
    out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", rel], cwd=root, capture_output=True, text=True,
                         check=False)
    return out.stdout.strip() or "not recorded"


def _strip(cell: str) -> str:
    """A cell without its figures, code spans and link targets."""
    cell = FIG.sub("", cell)
    cell = re.sub(r"`[^`]*`", "", cell)
    return re.sub(r"\]\([^)]*\)", "]", cell)


def check_page(path: str, root: str = ROOT, git_dates: bool = True) -> list[str]:
    """Every problem with the figures of one results page, as ``"FILE:LINE: ..."`` lines (empty: none)."""
    name = os.path.basename(path)
    lines = _read(path).split("\n")
    errors = []
    n_figures = 0
    table_start = True
    section_has_table = section_has_source = False
    section = None

    def close_section():
        if name != "index.md" and section_has_table and not section_has_source:
            errors.append(f"{name}: section {section!r} has a table but no 'Source:' line")

    for i, line in enumerate(lines, 1):
        where = f"{name}:{i}"
        if line.startswith("#"):
            close_section()
            section, section_has_table, section_has_source = line, False, False
        if line.count('<span class="fig"') != len(FIG.findall(line)):
            errors.append(f"{where}: a figure span that does not parse")
        for src, fmt, shown in FIG.findall(line):
            n_figures += 1
            src, shown = html.unescape(src), html.unescape(shown)
            try:
                if src.startswith("git:"):
                    if not git_dates:
                        continue
                    want = commit_date(root, src[4:])
                else:
                    rel, _, ptr = src.partition("#")
                    want = expected_text(lookup(_json(os.path.join(root, rel)), ptr), fmt)
            except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:  # missing, wrong kind
                errors.append(f"{where}: {src} ({fmt}): cannot be read back: {type(e).__name__}: {e}")
                continue
            if shown != want:
                errors.append(f"{where}: {src} ({fmt}) shows {shown!r}, its JSON gives {want!r}")
        stripped = line.lstrip("- ")
        if line.startswith("|"):
            section_has_table = True
            if table_start or re.fullmatch(r"\|(-+\|)+", line):
                table_start = False  # the header row
                continue
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            for c in cells[1:]:  # the first column labels the row
                if re.search(r"\d", _strip(c)):
                    errors.append(f"{where}: a number without its source in the cell {c!r}")
        else:
            table_start = True
        if stripped.startswith("Source:"):
            section_has_source = True
            for part in ("command:", "machine:", "date:"):
                if part not in line:
                    errors.append(f"{where}: the source line names no {part[:-1]}")
            if re.search(r"\d", _strip(stripped)):
                errors.append(f"{where}: a number without its source in the source line")
    close_section()
    if n_figures == 0:
        errors.append(f"{name}: no figures at all")
    return errors


# --------------------------------------------------------------------------------------- the tests
def _results_module():
    spec = importlib.util.spec_from_file_location("docs_results", os.path.join(ROOT, "docs", "scripts", "results.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _full_history() -> bool:
    """A git checkout with its history (file commit dates are then what the pages say)."""
    r = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True,
                       check=False)
    return r.returncode == 0 and r.stdout.strip() == "false"


def _pages() -> list[str]:
    return sorted(glob.glob(os.path.join(PAGES, "*.md")))


def test_committed_pages_are_what_the_script_writes_now(tmp_path):
    if not _full_history():
        pytest.skip("needs a git checkout with its history: the pages date undated JSON by its last commit")
    written = _results_module().write_pages(str(tmp_path), pictures=False)
    fresh = {os.path.basename(p): _read(p) for p in written}
    committed = {os.path.basename(p): _read(p) for p in _pages()}
    assert sorted(fresh) == sorted(committed), "pages added or removed: run python docs/scripts/results.py"
    stale = [n for n in fresh if fresh[n] != committed[n]]
    assert not stale, f"docs/results/{stale} differ from the JSON now: run python docs/scripts/results.py"


def test_every_figure_on_the_pages_is_its_json_value():
    pages = _pages()
    assert "index.md" in map(os.path.basename, pages)
    errors = [e for p in pages for e in check_page(p, git_dates=_full_history())]
    assert not errors, "\n".join(errors)
    n = sum(len(FIG.findall(_read(p))) for p in pages)
    assert n > 1000, f"only {n} figures on the results pages"


def _plant(tmp_path, page: str, src: str, new: str) -> tuple[str, str]:
    """A copy of ``page`` whose figure from ``src`` reads ``new``; returns (its path, the old text)."""
    text = _read(os.path.join(PAGES, page))
    m = re.search(r'(<span class="fig" title="' + re.escape(src) + r'" data-fmt="[^"]*">)([^<]*)(</span>)', text)
    assert m, f"{src} is not on {page}"
    path = tmp_path / page
    path.write_text(text[:m.start()] + m.group(1) + new + m.group(3) + text[m.end():], encoding="utf-8")
    return str(path), m.group(2)


def test_the_checker_reports_a_changed_figure_and_only_it(tmp_path):
    src = "benchmarks/results/spec.json#/smollm2/methods/ours store:smollm2 g=11 var/speedup/median"
    path, old = _plant(tmp_path, "speculative.md", src, "3.00x")
    errors = check_page(path, git_dates=False)
    assert len(errors) == 1, errors
    assert src in errors[0] and "'3.00x'" in errors[0] and repr(old) in errors[0], errors[0]
    print("planted mismatch reported as:", errors[0])


def test_the_checker_reports_a_bare_number_and_a_wrong_key(tmp_path):
    text = _read(os.path.join(PAGES, "forced.md"))
    row = next(line for line in text.split("\n") if line.startswith("| 512 tokens"))
    cells = row.split(" | ")
    cells[-1] = "1e-9 |"  # the last figure typed by hand
    bad = text.replace(row, " | ".join(cells)).replace("forced.json#/speedup_512", "forced.json#/speedup_1024", 1)
    path = tmp_path / "forced.md"
    path.write_text(bad, encoding="utf-8")
    errors = check_page(str(path), git_dates=False)
    assert any("without its source" in e and "1e-9" in e for e in errors), errors
    assert any("speedup_1024" in e and "cannot be read back" in e for e in errors), errors
    assert len(errors) == 2, errors


def test_pictures_on_the_pages_exist_and_are_current():
    mod = _results_module()
    docs = os.path.join(ROOT, "docs")
    shown = {m for p in _pages() for m in re.findall(r"!\[[^\]]*\]\(\.\./images/([^)]+)\)", _read(p))}
    assert shown == set(mod.COPIED) | set(mod.DRAWN), "the pages and the script's picture lists disagree"
    for name, rel in mod.COPIED.items():
        with open(os.path.join(docs, "images", name), "rb") as a, open(os.path.join(ROOT, rel), "rb") as b:
            assert a.read() == b.read(), f"docs/images/{name} is not {rel}: run python docs/scripts/results.py"
    for name in mod.DRAWN:
        with open(os.path.join(docs, "images", name), "rb") as f:
            assert mod.picture_digest(ROOT, name).encode() in f.read(), \
                f"docs/images/{name} was drawn from other JSON: run python docs/scripts/results.py"


def test_generation_is_deterministic_and_writes_nothing_unchanged(tmp_path):
    mod = _results_module()
    first = mod.write_pages(str(tmp_path), pictures=False)
    before = {p: (_read(p, "rb"), os.stat(p).st_mtime_ns) for p in first}
    (tmp_path / "results" / "gone.md").write_text("an old page")
    again = mod.write_pages(str(tmp_path), pictures=False)
    assert again == first
    assert {p: (_read(p, "rb"), os.stat(p).st_mtime_ns) for p in again} == before
    assert not (tmp_path / "results" / "gone.md").exists()


def test_benchmarks_readme_lists_exactly_the_benchmarks_of_the_cli():
    from beliefscope.benchmarks.cli import BENCHMARKS

    text = _read(os.path.join(ROOT, "benchmarks", "README.md"))
    usage = re.search(r"beliefscope bench \{([^}]*)\}", text)
    assert usage and usage.group(1).split(",") == [*BENCHMARKS, "all"], "the usage line and benchmarks/cli.py differ"
    listed = re.findall(r"^### `([a-z_]+)`", text, re.MULTILINE)
    assert listed == list(BENCHMARKS), f"benchmarks/README.md's sections {listed} != benchmarks/cli.py {BENCHMARKS}"
    assert "docs/results/index.md" in text


def test_checker_formats_agree_with_the_script():
    mod = _results_module()
    cases = [(2.8977, "x2"), (1.0, "x3"), (0.0056, "f4"), (4.5e-09, "e1"), (0.717, "pct0"), (7, "int"),
             ({"q1": 2.462, "q3": 3.3139}, "iqr2"), ([0.919, 1.019], "range3"), ([3.29, 3.2], "list2"),
             (True, "yesno"), (False, "met"), ("2026-11-24T04:13:39", "date"), ([1, 2], "len"), ("a|b", "str")]
    for value, fmt in cases:
        assert mod.fmt_value(value, fmt) == expected_text(value, fmt), (value, fmt)


def test_readme_headline_table_is_generated_and_its_figures_are_their_json():
    readme = os.path.join(ROOT, "README.md")
    text = _read(readme)
    res = _results_module()
    assert res.readme_with_table(text, res.Doc(ROOT)) == text, "README.md's headline table is stale: run " \
                                                                "python docs/scripts/results.py"
    block = text.split(res.README_BEGIN)[1].split(res.README_END)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ")][1:]  # less the header
    assert len(rows) == 5 and len(FIG.findall(block)) >= 5
    # every figure is its JSON value (the README's sections need no Source line: its link holds them)
    errors = [e for e in check_page(readme, git_dates=_full_history()) if "no 'Source:' line" not in e]
    assert not errors, "\n".join(errors)
