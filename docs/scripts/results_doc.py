"""The building blocks of the Results pages that docs/scripts/results.py writes: the paths and dashes every
page uses (`ROOT`, `RES`, `DASH`, `NONE`), the value formats (`FORMATS`, `fmt_value`), `Doc`, which reads a
checkout's JSON and prints each value as a figure with its source, the Markdown pieces a page is made of
(`span`, `table`, `page`, `picture`), `git_date` for JSON that records no date, and `_status` for a goal the
JSON records. It imports none of the other results modules; they all import it.
"""

from __future__ import annotations

import datetime
import functools
import html
import json
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RES = "benchmarks/results"
DASH = "–"  # en dash: ranges (IQR, intervals) without confusion with a minus sign
NONE = "—"  # em dash: no value

# how a figure's value is printed; tests/test_docs_results.py implements the same names on its own
FORMATS = """
str      the value as text                       date     an ISO date or date-time: its first 10 characters
int      an integral number                      len      the number of items of a list or object
f<d>     fixed point, d decimals                 x<d>     fixed point, d decimals, then "x" (a ratio)
e<d>     scientific, d decimals                  pct<d>   100 times the value, d decimals, then "%"
iqr<d>   an object's q1 and q3, joined by "–"    range<d> a pair [a, b], joined by "–"
list<d>  a list of numbers, joined by ", "       yesno    a boolean as yes / no
met      a boolean as met / missed               gitdate  (pointer git:PATH) the file's last commit date
"""


# ------------------------------------------------------------------------------------------ values
def fmt_value(value, fmt: str) -> str:
    """`value` printed the way ``data-fmt`` says (see `FORMATS`)."""
    if fmt in ("str", "gitdate"):
        if not isinstance(value, str):
            raise TypeError(f"{fmt}: expected text, got {value!r}")
        return value
    if fmt == "date":
        if not (isinstance(value, str) and re.match(r"\d{4}-\d\d-\d\d", value)):
            raise ValueError(f"date: not an ISO date: {value!r}")
        return value[:10]
    if fmt in ("yesno", "met"):
        if not isinstance(value, bool):
            raise TypeError(f"{fmt}: expected a boolean, got {value!r}")
        return ("yes", "no")[not value] if fmt == "yesno" else ("met", "missed")[not value]
    if fmt == "len":
        return str(len(value))
    if fmt == "int":
        if isinstance(value, bool) or not float(value).is_integer():
            raise ValueError(f"int: not an integral number: {value!r}")
        return str(int(value))
    m = re.fullmatch(r"(f|x|e|pct|iqr|range|list)(\d)", fmt)
    if not m:
        raise ValueError(f"unknown format {fmt!r}")
    kind, d = m.group(1), int(m.group(2))
    num = functools.partial(_num, d=d)
    if kind == "iqr":
        return f"{num(value['q1'])}{DASH}{num(value['q3'])}"
    if kind == "range":
        a, b = value
        return f"{num(a)}{DASH}{num(b)}"
    if kind == "list":
        return ", ".join(num(v) for v in value)
    if kind == "e":
        return f"{_real(value):.{d}e}"
    if kind == "pct":
        return f"{100 * _real(value):.{d}f}%"
    return num(value) + ("x" if kind == "x" else "")


def _real(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"expected a number, got {v!r}")
    return float(v)


def _num(v, d: int) -> str:
    return f"{_real(v):.{d}f}"


def pointer(keys) -> str:
    """RFC 6901 JSON pointer of a key path."""
    return "".join("/" + str(k).replace("~", "~0").replace("/", "~1") for k in keys)


def git_date(root: str, rel: str) -> str:
    """The date (YYYY-MM-DD) of the last commit that touched ``rel``; today's date while the file has
    uncommitted changes (the date it gets when committed today); "not recorded" outside a git checkout."""
    try:
        changed = subprocess.run(["git", "status", "--porcelain", "--", rel], cwd=root, capture_output=True,
                                 text=True, check=True).stdout.strip()
        if changed:
            return datetime.date.today().isoformat()
        out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", rel], cwd=root, capture_output=True,
                             text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not recorded"
    return out or "not recorded"


def _esc(text: str, quote: bool = False) -> str:
    """HTML-escaped, and ``|`` too (it would end a table cell)."""
    return html.escape(text, quote=quote).replace("|", "&#124;")


class Doc:
    """Reads the JSON files of a checkout and prints their values as figures with their source."""

    def __init__(self, root: str = ROOT):
        self.root = root
        self._json: dict = {}

    def data(self, rel: str):
        if rel not in self._json:
            with open(os.path.join(self.root, rel), encoding="utf-8") as f:
                self._json[rel] = json.load(f)
        return self._json[rel]

    def get(self, rel: str, *keys):
        v = self.data(rel)
        for k in keys:
            v = v[int(k)] if isinstance(v, list) else v[k]
        return v

    def has(self, rel: str, *keys) -> bool:
        try:
            return self.get(rel, *keys) is not None
        except (KeyError, IndexError, TypeError):
            return False

    def fig(self, rel: str, keys, fmt: str) -> str:
        """One figure: the value at ``keys`` in ``rel``, printed as ``fmt``, with its source."""
        keys = (keys,) if isinstance(keys, str) else tuple(keys)
        return span(f"{rel}#{pointer(keys)}", fmt, fmt_value(self.get(rel, *keys), fmt))

    def opt(self, rel: str, keys, fmt: str) -> str:
        """`fig`, or a dash where the JSON has no such value (or null)."""
        keys = (keys,) if isinstance(keys, str) else tuple(keys)
        return self.fig(rel, keys, fmt) if self.has(rel, *keys) else NONE

    def gitdate(self, rel: str) -> str:
        return span(f"git:{rel}", "gitdate", git_date(self.root, rel))

    # ---------------------------------------------------------------- provenance lines
    def machine(self, rel: str, keys=("machine",)) -> str:
        """A benchmark's ``machine`` record: CPU, cores, torch threads, versions, load."""
        k = tuple(keys)
        parts = [self.fig(rel, k + ("cpu",), "str"), self.fig(rel, k + ("cpu_count",), "int") + " cores",
                 "torch threads " + self.fig(rel, k + ("torch_threads",), "int"),
                 "torch " + self.fig(rel, k + ("torch",), "str"),
                 "transformers " + self.fig(rel, k + ("transformers",), "str")]
        if self.has(rel, *k, "load_average_1min"):
            parts.append("load average " + self.fig(rel, k + ("load_average_1min",), "f2"))
        return ", ".join(parts)

    def source(self, rel: str, *, command: str | None = None, command_keys=None, machine: str | None = None,
               date_keys=None, note: str = "", recorded: str = "recorded") -> str:
        """The line under a table: the JSON file, the command, the machine and the date.

        command: a command derived from the code (said so); command_keys: where the JSON records its own.
        machine: figures built by the caller, else "not recorded". date_keys: the JSON's recorded date,
        else the file's commit date."""
        if command_keys is not None:
            cmd = self.fig(rel, command_keys, "str") + f" ({recorded})"
        elif command:
            cmd = f"`{command}` (not recorded in the JSON; {note or 'from benchmarks/cli.py'})"
        else:
            cmd = "not recorded"
        date = (self.fig(rel, date_keys, "date") + " (recorded)" if date_keys is not None
                else self.gitdate(rel) + " (commit date of the file)")
        return (f"Source: `{rel}` · command: {cmd} · machine: {machine or 'not recorded'} · date: {date}")

    def bench_source(self, rel: str, name: str, part=()) -> str:
        """`source` for a `beliefscope bench NAME` result with its ``machine`` record (under ``part``)."""
        from_cli = _bench_names(self.root)
        if name not in from_cli:
            raise ValueError(f"{name!r} is not a benchmark of benchmarks/cli.py ({', '.join(from_cli)})")
        k = tuple(part) + ("machine",)
        return self.source(rel, command=f"beliefscope bench {name}", machine=self.machine(rel, k),
                           date_keys=k + ("date",))


def span(src: str, fmt: str, text: str) -> str:
    return f'<span class="fig" title="{_esc(src, quote=True)}" data-fmt="{fmt}">{_esc(text)}</span>'


@functools.cache
def _bench_names(root: str) -> tuple[str, ...]:
    """`BENCHMARKS` of benchmarks/cli.py, read from the source (no import of the benchmarks)."""
    with open(os.path.join(root, "benchmarks", "cli.py"), encoding="utf-8") as f:
        m = re.search(r"^BENCHMARKS = \(([^)]*)\)", f.read(), re.MULTILINE)
    return tuple(re.findall(r'"([^"]+)"', m.group(1)))


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table. Its first column is the row's label; every other cell holds figures (spans),
    dashes or words, never a bare number (the test checks)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def page(title: str, intro: str, *blocks: str) -> str:
    head = (f"<!-- Generated by docs/scripts/results.py from benchmarks/results/*.json and the model cards: "
            f"do not edit by hand; run `python docs/scripts/results.py`. -->\n\n# {title}\n\n{intro.strip()}\n")
    return head + "".join("\n" + b.strip() + "\n" for b in blocks if b)


def picture(name: str, alt: str, caption: str) -> str:
    return f"![{alt}](../images/{name})\n\n*{caption}*"


def _status(goal: str, value: float) -> str:
    """met / missed for goals of the form ">= N" or "<= N" (with an optional remark); else a dash."""
    m = re.fullmatch(r"\s*(>=|<=)\s*([0-9.]+)\s*(\(.*\))?\s*", goal)
    if not m:
        return NONE
    ok = value >= float(m.group(2)) if m.group(1) == ">=" else value <= float(m.group(2))
    return "met" if ok else "missed"
