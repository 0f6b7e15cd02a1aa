"""The Results pages of the documentation, generated from the JSON that benchmarks and training runs write.

`write_pages(docs_dir)` writes ``results/*.md`` under ``docs_dir`` from ``benchmarks/results/*.json`` and
``checkpoints/*/model_card.json``, and the pictures those pages show as ``images/results-*.png``. No figure
is typed by hand: each one is read from a JSON file, and each table names the command that produced its
JSON, the machine and the date (the JSON's own record where it has one, else "not recorded" for the
machine and the file's last commit date for the date).

Provenance is machine-readable. Every figure on the pages is one HTML span::

    <span class="fig" title="benchmarks/results/spec.json#/smollm2/best_speedup" data-fmt="x2">2.90x</span>

``title`` is the JSON file and an RFC 6901 pointer into it (``git:PATH`` for a file's commit date), so the
site shows the source when the mouse rests on a figure; ``data-fmt`` says how the value is printed (`FORMATS`).
``tests/test_docs_results.py`` reads every span back, looks its value up and fails on any mismatch.

Pictures are copied (`COPIED`: screenshots and figures that need a model run) or drawn from the JSON
(`DRAWN`); a drawn picture carries the SHA-256 of its inputs in its PNG metadata and is redrawn only when
they change, so that rebuilding the site does not rewrite it.

Run directly (``python docs/scripts/results.py``) to rewrite the pages of this checkout's ``docs/``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import glob
import hashlib
import html
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RES = "benchmarks/results"
DASH = "–"  # en dash: ranges (IQR, intervals) without confusion with a minus sign
NONE = "—"  # em dash: no value
DRAW_VERSION = "1"  # part of every drawn picture's digest: bump it when a drawing function changes

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


# ------------------------------------------------------------------------------------ the pages
SPEC = f"{RES}/spec.json"


def spec_page(d: Doc) -> str:
    intro = """
What `beliefscope bench spec` runs, and against what: `benchmarks/README.md`. A speed-up is the median
over prompts of plain cached greedy decoding's wall time over the method's, on the same model, prompts
and run (IQR: its interquartile range). α is the share of drafted tokens the target accepted; "tokens per
verify" what one verify forward committed; "verify cost" a verify forward's time in decode steps. The
bound is Leviathan et al.'s expected speed-up at the measured α, γ and draft cost; a lookup drafter's
drafts are right or wrong as a whole, so it can beat it ("share of bound" above 1).
"""
    blocks = [picture("results-spec-acceptance.png", "speed-up and acceptance per drafter",
                      "Per drafter, the speed-up over plain greedy (median and IQR), and the tokens one verify "
                      "step committed against what Leviathan's formula expects at the measured α. Drawn from "
                      f"`{SPEC}` by docs/scripts/results.py.")]
    for part, title, anchor in (("smollm2", "SmolLM2, coin-flip rewrites", "smollm2"),
                                ("general", "SmolLM2, Python standard-library docstrings", "general"),
                                ("toy", "Toy target with its draft model", "toy")):
        blocks.append(_spec_part(d, part, title, anchor))
    return page("Speculative decoding", intro, *blocks)


def _spec_part(d: Doc, part: str, title: str, anchor: str) -> str:
    f = functools.partial(d.fig, SPEC)
    o = functools.partial(d.opt, SPEC)
    m = ("methods",)
    rows = []
    for name, r in d.get(SPEC, part, "methods").items():
        k = (part,) + m + (name,)
        if "unsupported" in r:
            rows.append([html.escape(name), "unsupported: " + f(k + ("unsupported",), "str")] + [NONE] * 6)
            continue
        rows.append([html.escape(name), f(k + ("speedup", "median"), "x2"), f(k + ("speedup",), "iqr2"),
                     o(k + ("alpha",), "f2"), o(k + ("tokens_per_verify_step",), "f2"),
                     o(k + ("verify_cost_over_decode_step",), "f2"), o(k + ("share_of_bound",), "f2"),
                     f(k + ("identical_to_plain",), "int") + " / " + f(k + ("n_prompts",), "int")])
    header = ["method", "speed-up", "IQR", "α", "tokens per verify", "verify cost", "share of bound",
              "= plain greedy"]
    workload = (f"Model: {f((part, 'model'), 'str')}; {f((part, 'n_prompts'), 'int')} prompts of "
                f"{f((part, 'mean_prompt_tokens'), 'f1')} tokens on average, up to "
                f"{f((part, 'max_new_tokens'), 'int')} new tokens ({f((part, 'mean_new_tokens'), 'f1')} on "
                f"average). Best: {f((part, 'best'), 'str')}, "
                f"{f((part, 'best_speedup'), 'x2')}; every output identical to plain greedy: "
                f"{f((part, 'outputs_identical'), 'yesno')}.")
    out = [f"## {title} {{#{anchor}}}", workload, table(header, rows)]
    kern = (part, "kernels")
    if d.get(SPEC, *kern, "packed_linears"):
        packing = f(kern + ("packed_plain_over_default_kernels", "median"), "x2")
        out.append(f"Weights packed once for oneDNN (`models.packed`), for every method. Packing alone: plain "
                   f"greedy packed over PyTorch's default kernels {packing}; "
                   f"the best method over unpacked plain greedy "
                   f"{f(kern + ('best_over_default_kernels_plain', 'median'), 'x2')} "
                   f"(IQR {f(kern + ('best_over_default_kernels_plain',), 'iqr2')}).")
    hf = d.get(SPEC, part, "ours_vs_hf_matching")
    if hf:
        hrows = [[html.escape(h), f((part, "ours_vs_hf_matching", h, "ours"), "str"),
                  f((part, "ours_vs_hf_matching", h, "ours_speedup"), "x2"),
                  f((part, "ours_vs_hf_matching", h, "hf_speedup"), "x2"),
                  f((part, "ours_vs_hf_matching", h, "ours_over_hf"), "x2")] for h in hf]
        out += ["Against Hugging Face `generate` with the matching assistance (same prompts and run):",
                table(["HF method", "ours", "ours over plain", "HF over plain", "ours over HF"], hrows)]
    if d.has(SPEC, part, "note"):
        out.append(f'??? note "The run\'s note"\n    {f((part, "note"), "str")}')
    out.append(d.bench_source(SPEC, "spec", part=(part,)))
    return "\n\n".join(out)


CACHE = f"{RES}/cache.json"
CACHE_BA = f"{RES}/cache_before_after.json"


def cache_page(d: Doc) -> str:
    intro = """
`KVCache` against Hugging Face's `DynamicCache`, per decoded token, interleaved in one run
(`beliefscope bench cache`; what it runs: `benchmarks/README.md`). The speed-up is DynamicCache's time over
KVCache's; the paired median and its distribution-free 95% interval come from the per-repeat ratios.
"""
    f = functools.partial(d.fig, CACHE)
    blocks = []
    for part, title in (("toy", "Toy target"), ("smollm2", "SmolLM2")):
        rows = [[f"{n} positions", f((part, n, "ms_per_token_kvcache"), "f2"),
                 f((part, n, "ms_per_token_dynamic"), "f2"),
                 f((part, n, "speedup"), "x3"), f((part, n, "speedup_median_paired"), "x3"),
                 f((part, n, "speedup_ci95_paired"), "range3"), f((part, n, "repeats"), "int"),
                 f((part, n, "max_abs_diff_logits"), "e1")] for n in d.get(CACHE, part)]
        model = f("toy_model" if part == "toy" else "smollm2_model", "str")
        blocks.append(f"## {title} {{#{part}}}\n\nModel: {model}.\n\n" + table(
            ["context", "KVCache ms / token", "DynamicCache ms / token", "speed-up", "paired median", "95% interval",
             "repeats", "max abs diff of logits"], rows) + "\n\n" + d.bench_source(CACHE, "cache"))
    rb = ("rollback",)
    blocks.append("## Rollback {#rollback}\n\n" + table(
        ["context", "median ns", "min ns", "max ns"],
        [[f"{n} positions", f(rb + (n, "median_ns"), "int"), f(rb + (n, "min_ns"), "int"), f(rb + (n, "max_ns"), "int")]
         for n in d.get(CACHE, "rollback") if n.isdigit()])
        + f"\n\nRollback time at the longest context over the shortest: {f(rb + ('ratio_4096_over_128',), 'x2')}; "
        f"outputs identical to DynamicCache: {f('outputs_identical', 'yesno')}.\n\n" + d.bench_source(CACHE, "cache"))
    g = functools.partial(d.fig, CACHE_BA)
    rows = []
    for rnd in d.get(CACHE_BA, "rounds"):
        k = ("rounds", rnd)
        toy, smol = k + ("kvcache_over_dynamic_speedup_toy",), k + ("kvcache_over_dynamic_speedup_smollm2",)
        rows.append([rnd, g(k + ("load_average_1min",), "f2"), g(toy + ("512",), "x3"), g(toy + ("4096",), "x3"),
                     g(smol + ("512",), "x3"), g(smol + ("2048",), "x3"),
                     g(k + ("rollback_ratio_4096_over_128",), "x3"), g(k + ("outputs_identical",), "yesno")])
    blocks.append(
        "## Before and after the cache rework {#before-after}\n\nThe same benchmark at two commits, interleaved "
        f"(head: {g('head', 'str')}).\n\n" + table(
            ["round", "load average", "toy 512", "toy 4096", "SmolLM2 512", "SmolLM2 2048", "rollback 4096 / 128",
             "outputs identical"], rows)
        + "\n\n" + d.source(CACHE_BA, command_keys=("what",), machine="as the recorded command says"))
    t = functools.partial(d.fig, TRACE)
    blocks.append(
        "## One request through draft, verify and rollback {#timeline}\n\n"
        "The cache of one speculative request around its first rejected draft, coloured by the cache's own "
        "provenance of each position, and the drafts accepted at every verify step of that request "
        "(`analyses.plots_decoding.cache_timeline` and `acceptance_chart`, redrawn from the trace's JSON).\n\n"
        + picture("results-cache-timeline.png", "The KV cache of one request through draft, verify and rollback",
                  "Each cell a cache position: prefill (blue), draft (yellow), verified (green), rejected (red).")
        + "\n\n" + picture("results-acceptance.png", "Drafts proposed and accepted per verify step",
                           "Drafts proposed and accepted at each verify step of the same request.")
        + "\n\n" + table(["model", "drafter", "gamma", "prompts", "acceptance", "tokens per verify step",
                           "rejections"],
                          [[t("model", "str"), t("drafter", "str"), t("gamma", "int"), t("n_prompts", "int"),
                            t("acceptance", "f3"), t("tokens_per_step", "f2"), t("n_rejections", "int")]])
        + "\n\n" + d.source(TRACE, command="beliefscope trace --model target --drafter early-exit:2 --n 20 "
                                             "--out trace/trace.png --json", note="the command that wrote it"))
    return page("The KV cache", intro, *blocks)


TRACE = f"{RES}/trace_toy.json"
FORCED = f"{RES}/forced.json"


def forced_page(d: Doc) -> str:
    intro = """
Forced answers at every event boundary of a story: recomputing every prefix against one prefill and a
batch of cache forks (`beliefscope bench forced`; `benchmarks/README.md`). Speed-up: recompute time over
fork time, median of the paired repeats; "max |ΔP|" is the largest difference of the answer
probabilities between the two paths.
"""
    f = functools.partial(d.fig, FORCED)
    goal = d.get(FORCED, "goal", "speedup_512")
    blocks = [(f"Goal on the toy target at 512 tokens: {f(('goal', 'speedup_512'), 'str')}; measured "
               f"{f('speedup_512', 'x2')} ({_status(goal, d.get(FORCED, 'speedup_512'))}). All outputs within "
               f"tolerance {f(('config', 'tolerance'), 'e1')}: {f('all_identical', 'yesno')}.")]
    for part, title in (("toy", "Toy target"), ("smollm2", "SmolLM2")):
        rows = [[f"{n} tokens", f((part, n, "n_tokens"), "int"), f((part, n, "n_boundaries"), "int"),
                 f((part, n, "seconds_recompute", "median"), "f3"), f((part, n, "seconds_fork", "median"), "f3"),
                 f((part, n, "speedup", "median"), "x2"), f((part, n, "speedup"), "iqr2"),
                 f((part, n, "max_abs_diff_p"), "e1")] for n in d.get(FORCED, part)]
        blocks.append(f"## {title} {{#{part}}}\n\n" + table(
            ["story", "tokens", "boundaries", "recompute s", "fork s", "speed-up", "IQR", "max abs ΔP"], rows)
            + "\n\n" + d.bench_source(FORCED, "forced"))
    b = ("toy_breakdown_longest",)
    ms = b + ("ms_median",)
    blocks.append("## Where the time goes (toy, longest story, one fork per boundary) {#breakdown}\n\n" + table(
        ["part", "ms (median)"],
        [["prefill", f(ms + ("prefill",), "f2")], ["one branch", f(ms + ("branch",), "f2")],
         ["the fork alone", f(ms + ("fork_only",), "f3")],
         ["recompute, full prefix", f(ms + ("recompute_full_prefix",), "f2")]])
        + f"\n\nShare of a branch that is the fixed cost of a model call: "
        f"{f(b + ('share_of_branch_that_is_call_overhead',), 'pct0')}.\n\n" + d.bench_source(FORCED, "forced"))
    return page("Forced answers", intro, *blocks)


def _status(goal: str, value: float) -> str:
    """met / missed for goals of the form ">= N" or "<= N" (with an optional remark); else a dash."""
    m = re.fullmatch(r"\s*(>=|<=)\s*([0-9.]+)\s*(\(.*\))?\s*", goal)
    if not m:
        return NONE
    ok = value >= float(m.group(2)) if m.group(1) == ">=" else value <= float(m.group(2))
    return "met" if ok else "missed"


OVERHEAD = f"{RES}/overhead.json"


def overhead_page(d: Doc) -> str:
    intro = """
The instrument beside the bare Hugging Face model, same weights and inputs (`beliefscope bench overhead`;
`benchmarks/README.md`). Each figure is a time ratio over the bare model: our forward, a capture of every
`resid_post` (against `output_hidden_states`), and greedy generation; "wrapped" is the TransformerLens-wrapped
path used before `models.bare`.
"""
    f = functools.partial(d.fig, OVERHEAD)
    rows = []
    for part in ("tiny", "smollm2"):
        for what in ("forward", "capture", "generate"):
            k = (part, what)
            rows.append([f"{'tiny Llama' if part == 'tiny' else 'SmolLM2'}, {what}", f(k + ("hf_ms",), "f1"),
                         f(k + ("ours_ratio",), "x2"), f(k + ("wrapped_ratio",), "x2"),
                         d.opt(OVERHEAD, k + ("transformerlens_ratio",), "x2"),
                         d.opt(OVERHEAD, k + ("nnsight_ratio",), "x2")])
    models = " ".join(f"{t}: {f((p, 'model'), 'str')}, input {_shape(d, p)}." for p, t in (("tiny", "Tiny"),
                                                                                           ("smollm2", "SmolLM2")))
    equal = ", ".join(f"{p} forward {f((p, 'forward_bit_equal'), 'yesno')}, "
                      f"capture {f((p, 'capture_bit_equal'), 'yesno')}, "
                      f"generated tokens {f((p, 'generate_tokens_equal'), 'yesno')}" for p in ("tiny", "smollm2"))
    return page("What the instrument costs", intro,
                models + "\n\n" + table(["model, path", "bare HF ms", "ours", "wrapped (before)", "TransformerLens",
                                         "nnsight"], rows),
                f"Bit-equal to the bare model: {equal}.", d.bench_source(OVERHEAD, "overhead"),
                _overhead_gpu(d), _compiled_gpu(d))


OVERHEAD_H100 = {"bfloat16": f"{RES}/overhead_h100_bf16.json", "float32": f"{RES}/overhead_h100_fp32.json"}
COMPILED_H100 = f"{RES}/compiled_decode_h100.json"


def _overhead_gpu(d: Doc) -> str:
    """The same table on an H100, bf16 and fp32 (a SmolLM2-shaped model with random weights)."""
    rows, first = [], OVERHEAD_H100["bfloat16"]
    for dtype, rel in OVERHEAD_H100.items():
        for part in ("tiny", "smollm2"):
            for what in ("forward", "capture", "generate"):
                k = (part, what)
                compiled = NONE
                if what == "generate" and d.has(rel, part, "generate", "compiled_ratio"):
                    compiled = (d.fig(rel, k + ("compiled_ratio",), "x2") + ", tokens equal: "
                                + d.fig(rel, (part, "compiled_tokens_equal_ours"), "yesno"))  # to our eager decode
                rows.append([f"{dtype}, {'tiny Llama' if part == 'tiny' else 'SmolLM2 shape'}, {what}",
                             d.fig(rel, k + ("hf_ms",), "f1"), d.fig(rel, k + ("ours_ratio",), "x2"),
                             d.fig(rel, k + ("wrapped_ratio",), "x2"),
                             d.opt(rel, k + ("transformerlens_ratio",), "x2"), compiled])
    gpu = d.fig(COMPILED_H100, ("machine", "gpu"), "str") + ", torch " + d.fig(first, ("machine", "torch"), "str")
    return ("## On an H100\n\nThe SmolLM2 rows use a model with SmolLM2-135M-Instruct's config and random weights "
            f"(the machine has no network), input {_shape_of(d, first, 'smollm2')}; the tiny Llama's input is "
            f"{_shape_of(d, first, 'tiny')}.\n\n"
            + table(["dtype, model, path", "bare HF ms", "ours", "wrapped (before)", "TransformerLens",
                     "compiled (`--compile`)"], rows) + "\n\n"
            + "The compiled column is `generate --compile` (CUDA graphs over the cache's buffers) in the same "
            "interleaved run, as a ratio to HF's eager `generate` (below 1 is faster). Its tokens are compared with "
            "our eager decode: in bfloat16 a compiled step's attention reduces over the cache's whole capacity "
            "(masked), the eager one over the filled length only, so greedy may part where two logits are within "
            "rounding "
            "(see [Use a GPU](../howto/gpu.md)).\n\n"
            + "\n\n".join(d.source(rel, command="python -m beliefscope.benchmarks.gpu_session --parts overhead",
                                    note="benchmarks/gpu_session.py", machine=gpu, date_keys=("machine", "date"))
                           for rel in OVERHEAD_H100.values()))


def _compiled_gpu(d: Doc) -> str:
    """`SpecConfig(compile=True)` (CUDA graphs) against the eager decode, on the H100."""
    rel, rows = COMPILED_H100, []
    for dtype in ("float32", "bfloat16"):
        for how in ("plain", "ngram:3"):
            k = ("compiled", dtype, how)
            rows.append([f"{dtype}, {how}", d.fig(rel, k + ("tokens_equal",), "str"),
                         d.fig(rel, k + ("ms_per_token_eager",), "f2"),
                         d.fig(rel, k + ("ms_per_token_compiled",), "f2")])
    return ("## Compiled decoding on an H100\n\n`SpecConfig(compile=True)` (`generate --compile`) replays each decode "
            "forward as a CUDA graph over the cache's buffers. " + d.fig(rel, "workload", "str") + ".\n\n"
            + table(["dtype, decoding", "tokens equal to eager", "eager ms / token", "compiled ms / token"], rows)
            + "\n\nHF's eager `generate` in the same process, bfloat16: "
            + d.fig(rel, "hf_generate_bf16_ms_per_token", "f2") + " ms / token ("
            + d.fig(rel, "hf_generate_reference", "str") + "); compiled plain decoding is "
            + d.fig(rel, "speedup_vs_hf_generate_bf16", "x2") + " faster. " + d.fig(rel, "note", "str") + ".\n\n"
            + d.source(rel, command_keys=("command",), machine=d.fig(rel, ("machine", "gpu"), "str"),
                       date_keys=("machine", "date")))


def _shape_of(d: Doc, rel: str, part: str) -> str:
    return " × ".join(d.fig(rel, (part, "shape", i), "int") for i in range(len(d.get(rel, part, "shape"))))


def _shape(d: Doc, part: str) -> str:
    return " × ".join(d.fig(OVERHEAD, (part, "shape", i), "int") for i in range(len(d.get(OVERHEAD, part, "shape"))))


HARVEST, PROBES = f"{RES}/harvest.json", f"{RES}/probes.json"


def probes_page(d: Doc) -> str:
    intro = """
Harvesting activations into the sharded store, and training linear probes on them (`beliefscope bench
harvest`, `beliefscope bench probes`; `benchmarks/README.md`).
"""
    f = functools.partial(d.fig, HARVEST)
    rows = [[t, f((p, "n_hooks"), "int"), f((p, "n_prompts"), "int"), f((p, "tokens_per_s_bare"), "f1"),
             f((p, "tokens_per_s_harvest"), "f1"), f((p, "overhead"), "f3"),
             f((p, "time_ratio_harvest_over_bare"), "iqr3")]
            for p, t in (("toy", "toy target"), ("smollm2", "SmolLM2"))]
    tr = ("torchrun",)
    harvest = ("## Harvest {#harvest}\n\nOverhead: harvest time over the bare forwards, minus one. Goal "
               f"{f(('goal', 'overhead'), 'str')}: "
               f"{_status(d.get(HARVEST, 'goal', 'overhead'), d.get(HARVEST, 'overhead'))} "
               f"on the toy target.\n\n"
               + table(["model", "hooks", "prompts", "bare tokens / s", "harvest tokens / s", "overhead",
                        "IQR of the time ratio"], rows)
               + f"\n\ntorchrun, two processes over one: {f(tr + ('speedup_2_over_1_procs', 'median'), 'x2')} "
               f"(IQR {f(tr + ('speedup_2_over_1_procs',), 'iqr2')}); the stores are equal: "
               f"{f(tr + ('stores_equal',), 'yesno')}.")
    parts = d.get(HARVEST, "toy_profile", "parts")
    prof = table(["part", "seconds", "share"],
                 [[p, f(("toy_profile", "parts", p, "cumulative_s"), "f3"),
                   f(("toy_profile", "parts", p, "share"), "pct1")]
                  for p in parts])
    harvest += ("\n\nWhere the toy harvest's time goes (cProfile, which inflates Python-heavy parts):\n\n" + prof
                + "\n\n" + d.bench_source(HARVEST, "harvest"))
    g = functools.partial(d.fig, PROBES)
    layers = [[f"`{html.escape(layer['hook'])}`", g(("toy", "layers", i, "accuracy_sklearn"), "f3"),
               g(("toy", "layers", i, "accuracy_torch"), "f3")]
              for i, layer in enumerate(d.get(PROBES, "toy", "layers"))]
    probes = ("## Probe training {#probes}\n\nOne probe per layer on the toy target: scikit-learn's loop over layers "
              "against the batched torch trainer, same rows, held out by prompt.\n\n"
              + table(["figure", "value"], [
                  ["speed-up (scikit-learn time over torch)", g(("toy", "speedup", "median"), "x2")],
                  ["IQR", g(("toy", "speedup"), "iqr2")],
                  ["scikit-learn seconds (median)", g(("toy", "seconds_sklearn", "median"), "f1")],
                  ["torch seconds (median)", g(("toy", "seconds_torch", "median"), "f1")],
                  ["largest accuracy gap between the trainers", g(("toy", "max_accuracy_diff"), "f4")],
                  ["goal", g(("goal", "speedup"), "str") + " (" + _status(d.get(PROBES, "goal", "speedup"),
                                                                          d.get(PROBES, "speedup")) + ")"]])
              + "\n\n" + table(["hook", "scikit-learn accuracy", "torch accuracy"], layers)
              + "\n\nThe probe-report row of the benchmark (a whole `beliefscope probe` report on SmolLM2) is not in "
              "the committed JSON.\n\n" + d.bench_source(PROBES, "probes"))
    return page("Harvest and probes", intro, harvest, probes)


DET = f"{RES}/determinism.json"
DET_RUNS = ("fp32", "bf16", "verified", "paths", "grid", "grid_fixed_shape")


def determinism_page(d: Doc) -> str:
    intro = """
Deterministic requests among others under continuous batching (`beliefscope bench determinism`;
`benchmarks/README.md`): throughput as a ratio to the same workload with every request on the fast path,
as the share of deterministic requests grows. Below, `beliefscope determinism` sweeps: how many distinct
outputs one prompt gets across batch compositions.
"""
    f = functools.partial(d.fig, DET)
    blocks = [picture("results-determinism.png", "distinct outputs per prompt, and the cost of determinism",
                      "Left: distinct outputs of one prompt across batch compositions (the sweeps below). Right: "
                      f"throughput against the deterministic share (`{DET}`). Drawn by "
                      "`analyses.determinism.chart` from the JSON.")]
    for model, title in (("smollm2", "SmolLM2"), ("target", "Toy target")):
        k = ("models", model)
        c = k + ("config",)
        rows = [[html.escape(r["config"]), f(k + ("rows", i, "deterministic_requests"), "int"),
                 f(k + ("rows", i, "ratio", "median"), "x3"), f(k + ("rows", i, "ratio"), "iqr3"),
                 f(k + ("rows", i, "tokens_per_s"), "f1"), f(k + ("rows", i, "verify_forwards"), "int")]
                for i, r in enumerate(d.get(DET, *k, "rows"))]
        goals = "; ".join(f"{_goal_name(g)}: goal {f(k + ('goals', g, 'goal'), 'x2')}, measured "
                          f"{f(k + ('goals', g, 'measured'), 'x3')}, {f(k + ('goals', g, 'met'), 'met')}"
                          for g in d.get(DET, *k, "goals"))
        blocks.append(
            f"## {title} {{#{model}}}\n\n{f(c + ('n_requests',), 'int')} requests of "
            f"{f(c + ('new_tokens', 0), 'int')} to {f(c + ('new_tokens', 1), 'int')} new tokens, max batch "
            f"{f(c + ('max_batch',), 'int')}, window {f(c + ('window',), 'int')}, "
            f"{f(c + ('repeats',), 'int')} repeats; deterministic outputs identical at every share: "
            f"{f(k + ('deterministic_outputs_identical',), 'yesno')}.\n\n"
            + table(["configuration", "deterministic requests", "throughput ratio", "IQR", "tokens / s",
                     "verify forwards"], rows) + f"\n\n{goals}.\n\n" + d.bench_source(DET, "determinism"))
    rows, sources = [], []
    for run in DET_RUNS:
        rel = f"{RES}/determinism_smollm2_{run}.json"
        g = functools.partial(d.opt, rel)
        rows.append([run, d.fig(rel, "fast_path_dtype", "str"), d.fig(rel, "prompts", "int"),
                     d.fig(rel, "n_configurations", "int"), g("fast_path_unique_overall_max", "int"),
                     g("fast_path_prompts_diverged", "int"), g("first_divergence_position", "int"),
                     g("verified_unique_overall_max", "int"), g("verified_acceptance", "f3")])
        measured = d.has(rel, "measured")  # "<date> <times> UTC, <machine>"
        sources.append("- " + d.source(rel, command_keys=("command",) if d.has(rel, "command") else None,
                                       machine=d.fig(rel, "measured", "str") if measured else None,
                                       date_keys=("measured",) if measured else None))
    blocks.append(
        "## Distinct outputs across batch compositions {#sweeps}\n\nSmolLM2; \"unique\" is the most distinct "
        "outputs one prompt got across the configurations, on the unverified fast path and with verified "
        "(deterministic) requests.\n\n"
        + table(["run", "fast-path dtype", "prompts", "configurations", "fast path: unique", "prompts diverged",
                 "first divergence (token)", "verified: unique", "verified acceptance"], rows)
        + "\n\n" + "\n".join(sources))
    return page("Determinism", intro, *blocks)


def _goal_name(key: str) -> str:
    m = re.fullmatch(r"ratio_at_(\d+)pct", key)
    return f"Throughput at {m.group(1)}% deterministic" if m else html.escape(key)


THINK, THINK_SMOL = f"{RES}/thinking.json", f"{RES}/thinking_smollm2.json"
PREFILL_H200, BATCH_H200 = f"{RES}/thinking_prefill_h200.json", f"{RES}/thinking_batch_prefill_h200.json"


def thinking_page(d: Doc) -> str:
    intro = """
Thinking States against chain of thought on the same stories, wall time (`beliefscope bench thinking`;
`benchmarks/README.md`). A speed-up is the median over stories of CoT's time over Thinking States' time,
paired per story: chunk by chunk, and with speculative prefill (k chunks drafted per backbone forward).
"Batch 32" runs 32 stories at once against CoT's batched `generate`.
"""
    blocks = []
    for rel, title, anchor, name in ((THINK, "Toy models", "toy", "thinking"),
                                     (THINK_SMOL, "SmolLM2", "smollm2", "thinking")):
        f = functools.partial(d.fig, rel)
        rows = []
        for band in d.get(rel, "bands"):
            k = ("bands", band)
            rows.append([f"{band} events", f(k + ("speedup_vs_cot_chunked", "median"), "x2"),
                         f(k + ("speedup_vs_cot_speculative", "median"), "x2"),
                         f(k + ("speedup_vs_cot_speculative",), "iqr2"), f(k + ("k_chosen",), "int"),
                         f(k + ("chunks_per_forward", "median"), "f2"),
                         f(k + ("batched", "speedup_vs_cot", "median"), "x2"),
                         f(k + ("answer_accuracy_thinking",), "f2") + " / " + f(k + ("answer_accuracy_cot",), "f2"),
                         f(k + ("context_tokens_generated_thinking", "median"), "f1") + " / "
                         + f(k + ("context_tokens_generated_cot", "median"), "f1"),
                         f(k + ("speculative_equals_chunked",), "pct0")])
        cfg = ("config",)
        blocks.append(
            f"## {title} {{#{anchor}}}\n\n{f(cfg + ('model',), 'str')} against {f(cfg + ('cot_model',), 'str')}, "
            f"{f(cfg + ('n_prompts',), 'int')} held-out stories per band, {f(cfg + ('repeats',), 'int')} repeats, "
            f"thought drafter {f(cfg + ('thought_drafter',), 'str')}.\n\n"
            + table(["stories", "chunk by chunk", "speculative prefill", "IQR", "k", "chunks per forward",
                     "batch 32", "answers: thinking / CoT", "context tokens: thinking / CoT",
                     "speculative = chunk by chunk"], rows)
            + "\n\nCoT's drafters timed on its calibration stories (seconds; the fastest is CoT's decoding "
            "above):\n\n" + table(["CoT drafter", "seconds"], [
                [f"`{html.escape(dr)}`", f(("bands", next(iter(d.get(rel, "bands"))), "cot_drafter_seconds", dr), "f3")]
                for dr in d.get(rel, "bands", next(iter(d.get(rel, "bands"))), "cot_drafter_seconds")])
            + "\n\n" + d.bench_source(rel, name))
    blocks.append(picture("results-speculative-prefill.png", "speculative prefill of one request",
                          "One request with speculative prefill: drafts, thoughts, kept and rolled-back chunks "
                          "(`analyses.thinking_view.speculative_prefill_figure`; it needs a model run, so the "
                          "committed `benchmarks/results/speculative_prefill.png` is shown as it is, dated "
                          f"{d.gitdate(f'{RES}/speculative_prefill.png')}).")
                  )
    f = functools.partial(d.fig, PREFILL_H200)
    rows = [[f"{b} events", f((b, "n"), "int"), f((b, "equal_to_chunked"), "int"), f((b, "speedup"), "x2"),
             f((b, "speedup_vs_cot"), "x2"),
             f((b, "answers_right"), "int") + " / " + f((b, "cot_answers_right"), "int"),
             f((b, "chunks_per_drafting_forward"), "f2")] for b in ("1-8", "17-32")]
    g = functools.partial(d.fig, BATCH_H200)
    brows = [[k.replace("_", ", ").replace("batch", "batch "), g((k, "equal"), "yesno"), g((k, "speedup"), "x2"),
              g((k, "forwards_chunked"), "int") + " → " + g((k, "forwards_speculative"), "int")]
             for k in d.data(BATCH_H200) if k.startswith("batch")]
    blocks.append(
        "## On a GPU {#gpu}\n\nOne story at a time, a fresh drafter per story, k "
        f"{f('k', 'int')}, {f('model', 'str')}; speed-up over chunk by chunk, and against CoT's Hugging Face "
        "`generate`:\n\n"
        + table(["stories", "n", "equal to chunk by chunk", "speed-up", "against CoT", "answers right: thinking / CoT",
                 "chunks per drafting forward"], rows)
        + "\n\n" + d.source(PREFILL_H200, machine=f("device", "str"))
        + "\n\nThe batched path (`run_thinking_batch`) with speculative prefill, k "
        f"{g('k', 'int')}, chunked time over speculative:\n\n"
        + table(["batch, stories", "equal to chunk by chunk", "speed-up", "backbone forwards"], brows)
        + "\n\n" + d.source(BATCH_H200, machine=g("device", "str")))
    return page("Thinking States", intro, *blocks)


INSTRUMENT = (("instrument", "Toy models: coin flips", "toy"),
              ("instrument_smollm2", "SmolLM2: coin flips", "smollm2"),
              ("instrument_cups", "Three cups", "cups"),
              ("instrument_variables", "Variable binding", "variables"),
              ("instrument_variables_next_token", "Variable binding, read one token after each boundary",
               "variables-next-token"))


def instrument_command(d: Doc, rel: str) -> str:
    """The `beliefscope instrument` command line of a result, rebuilt from its recorded ``config``."""
    c = d.get(rel, "config")
    cmd = ["beliefscope instrument", "--models " + ",".join(c["models"])]
    if c.get("task"):
        cmd.append(f"--task {c['task']}")
    cmd += [f"--n-train {c['n_train']}", f"--n-test {c['n_test']}", "--bands " + ",".join(c["bands"]),
            f"--seed {c['seed']}", f"--causal-n {c['causal_n']}"]
    if not c.get("random_init", True):
        cmd.append("--no-random-init")
    if c.get("probe_offset"):
        cmd.append(f"--probe-offset {c['probe_offset']}")
    cmd.append(f"--threads {c['threads']}")
    return " ".join(cmd)


def instrument_page(d: Doc) -> str:
    intro = """
The belief instrument (`beliefscope instrument`): at every event boundary of held-out stories, a linear probe
of the residual stream (its layer chosen on other stories), the answer the model gives when asked there
(forced), and, for Thinking States models, the thought it writes, each against the true state. "Control" is
the probe on a control task (a random label per token type and position), "random-init" the probe on the
model with random weights. The causal check swaps the state vector S at one chunk for another state's.
"""
    blocks = []
    for stem, title, anchor in INSTRUMENT:
        rel = f"{RES}/{stem}.json"
        f = functools.partial(d.fig, rel)
        o = functools.partial(d.opt, rel)
        rows, causal, variables = [], [], []
        for name, m in d.get(rel, "models").items():
            k = ("models", name)
            for band in m["bands"]:
                b = k + ("bands", band)
                rows.append([f"{html.escape(name)}, {band}", f(b + ("probe_accuracy",), "f3"),
                             f(b + ("forced_accuracy",), "f3"), o(b + ("thought_accuracy",), "f3"),
                             o(b + ("probe_thought_agreement",), "f3"), f(b + ("control_accuracy",), "f3"),
                             f(k + ("random_init_probe_accuracy",), "f3")])
                if "variable_probe_accuracy" in m["bands"][band]:
                    vk = b + ("variable_probe_accuracy",)
                    variables.append([f"{html.escape(name)}, {band}"] + [
                        f(vk + (v,), "f3") for v in m["bands"][band]["variable_probe_accuracy"]])
            if m.get("causal"):
                c = k + ("causal",)
                causal.append([html.escape(name), f(c + ("n",), "int"), f(c + ("answer_flip_rate_swap",), "f2"),
                               o(c + ("answer_follows_swap",), "f2"), f(c + ("downstream_thoughts_follow_swap",), "f2"),
                               f(c + ("answer_flip_rate_random",), "f2"), o(c + ("answer_follows_random",), "f2"),
                               f(c + ("downstream_thoughts_follow_random",), "f2")])
        hooks = "; ".join(f"`{html.escape(n)}` at {f(('models', n, 'hook'), 'str')}" for n in d.get(rel, "models"))
        out = [f"## {title} {{#{anchor}}}", f"Probe layers: {hooks}.",
               table(["model, events", "probe", "forced", "thought", "probe = thought", "control", "random-init"],
                     rows)]
        if variables:
            first = next(iter(d.get(rel, "models").values()))
            names = next(iter(first["bands"].values()))["variable_probe_accuracy"]
            out += ["A probe for every variable's value:",
                    table(["model, updates"] + [f"variable {html.escape(v)}" for v in names], variables)]
        if causal:
            out += [("Causal check: how often swapping S changes the answer, makes it the one the swapped-in state "
                     "leads to, and makes every later thought follow; then the same for a random vector of equal "
                     "norm."),
                    table(["model", "stories", "answer changes", "answer follows", "thoughts follow",
                           "random: changes", "random: follows", "random: thoughts"], causal)]
        out += [_checkpoint_line(d, rel, name) for name in d.get(rel, "models")
                if _checkpoint_line(d, rel, name)]
        models = list(d.get(rel, "models"))
        if models != d.get(rel, "config", "models"):
            out.append(f"The JSON's config lists {_names(d, rel)}; its other rows come from another run with "
                       "the same settings.")
        out.append(picture(f"results-instrument-{anchor}.png", f"instrument bars, {title}",
                           f"Probe, forced answer, thought and control by band (`analyses.instrument.figure`, drawn "
                           f"from `{rel}`)."))
        if all("trajectory" in m for m in d.get(rel, "models").values()) and anchor != "variables-next-token":
            out.append(picture(f"results-trajectory-{anchor}.png", f"one story token by token, {title}",
                               "One held-out story token by token: the truth, the probe (its cell fades with its "
                               "probability), the forced answer and the thought at each boundary "
                               f"(`analyses.state_strips.strips_figure`, drawn from `{rel}`)."))
        threads = "not recorded (its config: torch threads " + f(("config", "threads"), "int") + ")"
        out.append(d.source(rel, command=instrument_command(d, rel), machine=threads,
                            note="rebuilt from the JSON's recorded config"))
        blocks.append("\n\n".join(out))
    blocks.append("## The viewer {#viewer}\n\n" + picture(
        "results-view.png", "the belief viewer",
        "The viewer (`beliefscope view`): thinking above target on the same story, coloured by the probe's "
        f"belief; a screenshot, `benchmarks/results/view.png`, dated {d.gitdate(f'{RES}/view.png')}."))
    return page("The belief instrument", intro, *blocks)


def _checkpoint_line(d: Doc, rel: str, name: str) -> str:
    """Whether a model's rows were measured on the checkpoint shipped now (its card's model_sha256), on an
    earlier one, or on one the JSON does not name ("" for a model without a card hash, e.g. a hub model)."""
    card = _card(name)
    if not os.path.isfile(os.path.join(d.root, card)) or not d.has(card, "model_sha256"):
        return ""
    now = d.get(card, "model_sha256")
    if not d.has(rel, "models", name, "model_sha256"):
        return (f"`{html.escape(name)}`'s rows do not record the checkpoint they were measured on; the one shipped "
                f"now is dated {d.gitdate(card)}: they may predate it.")
    then = d.get(rel, "models", name, "model_sha256")
    if then == now:
        return f"`{html.escape(name)}`'s rows were measured on the checkpoint shipped now."
    return (f"`{html.escape(name)}`'s rows were measured on an earlier checkpoint than the one shipped now "
            f"(dated {d.gitdate(card)}).")


def _names(d: Doc, rel: str) -> str:
    n = len(d.get(rel, "config", "models"))
    return ", ".join(d.fig(rel, ("config", "models", i), "str") for i in range(n))


CARD_GROUPS = (
    ("Coin flips, toy models", "coinflip", ("coinflip-target", "coinflip-draft", "coinflip-thinking",
                                            "coinflip-thinking-empty", "coinflip-direct-rope", "coinflip-cot-rope")),
    ("Three cups", "cups", ("cups-thinking", "cups-direct-rope", "cups-cot-rope")),
    ("Variable binding", "variables", ("variables-thinking", "variables-direct-rope", "variables-cot-rope")),
    ("SmolLM2, natural coin-flip stories", "smollm2", ("smollm2-thinking", "smollm2-direct", "smollm2-cot")),
)
TRAIN_SPLIT, COST_H100 = f"{RES}/smollm2_thinking_train_split.json", f"{RES}/smollm2_training_cost_h100.json"


def _card(name: str) -> str:
    return f"checkpoints/{name}/model_card.json"


def _accuracy_cell(d: Doc, rel: str, k: tuple) -> str:
    ev = d.get(rel, *k)
    cell = d.fig(rel, k + ("answer_accuracy",), "f3")
    if ev.get("thought_accuracy") is not None:
        cell += " (thoughts " + d.fig(rel, k + ("thought_accuracy",), "f3") + ")"
    elif ev.get("formats") == ["cot"] and ev.get("exact_match") is not None:
        cell += " (chain " + d.fig(rel, k + ("exact_match",), "f3") + ")"
    return cell


def models_page(d: Doc) -> str:
    intro = """
Held-out accuracy of the shipped models, from each model card's `eval` (written by the training run that
made the checkpoint; `beliefscope eval --model NAME --events BAND --n N` repeats one band, seed 12345 by
default). A cell is the answer accuracy; for Thinking States models the share of thoughts that name the
right state follows in parentheses, for chain-of-thought models the share of whole chains right.
Models were trained on the first band only.
"""
    blocks = []
    for title, anchor, names in CARD_GROUPS:
        bands = list(dict.fromkeys(b for n in names for b in d.get(_card(n), "eval")))
        bands.sort(key=lambda b: int(b.split("-")[0]))
        rows = []
        for n in names:
            rel = _card(n)
            rows.append([n] + [_accuracy_cell(d, rel, ("eval", b)) if d.has(rel, "eval", b) else NONE
                                      for b in bands])
        if anchor == "smollm2":
            rows.append(["smollm2-thinking, train templates and names"] + [
                _accuracy_cell(d, TRAIN_SPLIT, ("bands", b)) if d.has(TRAIN_SPLIT, "bands", b) else NONE
                for b in bands])
        n_line = "; ".join(f"`{n}` {d.fig(_card(n), ('eval', bands[0], 'n'), 'int')}" for n in names
                           if d.has(_card(n), "eval", bands[0]))
        sources = []
        for n in names:
            rel = _card(n)
            if d.has(rel, "rebuild"):
                line = d.source(rel, command_keys=("rebuild",), machine=_trained_on(d, rel),
                                recorded="the card's rebuild")
            else:
                line = d.source(rel, machine=_trained_on(d, rel)) + (
                    " · note: " + d.fig(rel, "note", "str") if d.has(rel, "note") else "")
            sources.append("- " + line)
        if anchor == "smollm2":
            sources.append("- " + d.source(TRAIN_SPLIT, command_keys=("command",), date_keys=("date",)))
        blocks.append(f"## {title} {{#{anchor}}}\n\n" + table(["model"] + [f"{b} events" for b in bands], rows)
                      + f"\n\nStories per band: {n_line}.\n\n" + "\n".join(sources))
    card = _card("smollm2-thinking")
    q = ("eval_questions",)
    rows = [[html.escape(s), d.fig(card, q + (s, "n"), "int"), d.fig(card, q + (s, "answer_accuracy"), "f3"),
             d.fig(card, q + (s, "thought_accuracy"), "f3"), d.fig(card, q + (s, "answer_follows_thought"), "f3")]
            for s in d.get(card, *q)]
    blocks.append(
        "## `smollm2-thinking` beyond the templates {#smollm2-thinking}\n\nQuestion forms and hand-written "
        "free-wording stories (`free`: `beliefscope eval --split free`; `+chat`: inside SmolLM2's chat template).\n\n"
        + table(["stories", "n", "answers", "thoughts", "answer names its own last thought"], rows)
        + f"\n\nThe card's own summary (`generalises_to`): {d.fig(card, 'generalises_to', 'str')}\n\n"
        + picture("results-loss-smollm2-thinking.png", "training loss of smollm2-thinking",
                  "Training loss of `smollm2-thinking` (the card's `history`; `checkpoints/smollm2-thinking/loss.png`, "
                  f"dated {d.gitdate('checkpoints/smollm2-thinking/loss.png')}).")
        + "\n\n" + d.source(card, command_keys=("rebuild",), recorded="the card's rebuild"))
    tc = ("training_cost",)
    rows = [[f"{html.escape(o)}, CPU", d.fig(card, tc + (o, "trained_params"), "int"),
             d.fig(card, tc + (o, "autocast"), "str"),
             d.fig(card, tc + (o, "threads"), "int"), d.fig(card, tc + (o, "tokens"), "int"),
             d.fig(card, tc + (o, "seconds"), "list2")] for o in d.get(card, *tc)]
    rows += [[f"{html.escape(o)}, GPU", d.fig(COST_H100, ("options", o, "trained_params"), "int"),
              d.fig(COST_H100, ("options", o, "autocast"), "str"), d.fig(COST_H100, ("options", o, "threads"), "int"),
              d.fig(COST_H100, ("options", o, "tokens"), "int"), d.fig(COST_H100, ("options", o, "seconds"), "list2")]
             for o in d.get(COST_H100, "options")]
    blocks.append(
        "## The cost of a training step {#training-cost}\n\nSeconds per optimiser step of `smollm2-thinking`'s "
        "training, one step after another, for each choice of what is trained (`beliefscope train --preset "
        "smollm2-thinking --measure-cost`). The GPU rows use a SmolLM2-shaped model with random weights: "
        f"{d.fig(COST_H100, 'note', 'str')}.\n\n"
        + table(["trained, device", "trained parameters", "autocast", "threads", "tokens per step", "seconds per step"],
                rows)
        + "\n\n- " + d.source(card, command="beliefscope train --preset smollm2-thinking --measure-cost",
                               note="the flag that writes training_cost", machine=_cost_machine(d, card))
        + f"\n- {d.source(COST_H100, machine=d.fig(COST_H100, 'device', 'str'))}")
    return page("Trained models", intro, *blocks)


def _trained_on(d: Doc, rel: str) -> str | None:
    """The device a card says it was trained on (``trained_on`` names a device on some cards, the data on
    others); the evaluation's machine is never recorded."""
    if d.has(rel, "trained_on") and re.search(r"\b(cpu|cuda|NVIDIA)\b", d.get(rel, "trained_on")):
        return "trained on " + d.fig(rel, "trained_on", "str") + " (the evaluation's machine not recorded)"
    return None


def _cost_machine(d: Doc, rel: str) -> str:
    first = next(iter(d.get(rel, "training_cost")))
    return "device " + d.fig(rel, ("training_cost", first, "device"), "str") + " (the rest not recorded)"


GPU = f"{RES}/gpu_check.json"
SWEEP_GPU = f"{RES}/gpu_check_sweep_h100.json"  # the determinism sweep alone, after its schedulers were shared


def gpu_page(d: Doc) -> str:
    intro = """
Every command once on a CUDA device, offline (`make gpu-check`): each check runs a command and compares what
it must (`beliefscope.gpu_check`).
"""
    f = functools.partial(d.fig, GPU)
    rows = [[f"`{html.escape(c)}`", f(("checks", c, "ok"), "yesno"), f(("checks", c, "seconds"), "f2")]
            for c in d.get(GPU, "checks")]
    env = ("environment",)
    machine = ", ".join([f(env + ("gpu",), "str"), "CUDA " + f(env + ("cuda",), "str"),
                         "torch " + f(env + ("torch",), "str"),
                         "transformers " + f(env + ("transformers",), "str"), "Python " + f(env + ("python",), "str"),
                         "CPU threads " + f(env + ("threads",), "int")])
    s = functools.partial(d.fig, SWEEP_GPU)
    sweep, js = ("checks", "determinism_sweep"), ("checks", "determinism_sweep", "json")
    gpu = ", ".join([s(env + ("gpu",), "str"), "torch " + s(env + ("torch",), "str")])
    sweep_block = (
        "## The determinism sweep, again\n\nThe sweep alone (" + s(("config", "sweep"), "str")
        + ": prompts x new tokens : other requests), after a sweep kept one scheduler and its recordings for "
        "every batch limit and both paths: " + s(sweep + ("seconds",), "f1") + " s, start-up included (the run "
        "above: " + f(sweep + ("seconds",), "f1") + " s). Distinct verified outputs per prompt, at most: "
        + s(js + ("verified_unique_max",), "int") + "; fast path: " + s(js + ("fast_path_unique_max",), "int")
        + " (" + s(js + ("fast_path_prompts_diverged",), "int") + " prompt parted, from new token "
        + s(js + ("first_divergence_position",), "int") + "); replayed as " + s(js + ("compiled",), "str")
        + ".\n\n" + d.source(SWEEP_GPU, command="python -m beliefscope.gpu_check --device cuda --only "
                              "determinism_sweep --sweep 12x64:0,15,31", note="beliefscope/gpu_check.py",
                              machine=gpu))
    return page("On a GPU", intro,
                f"{f('checks', 'len')} checks, {f('failed', 'len')} failed, {f('seconds', 'f1')} s in all.\n\n"
                + table(["check", "passed", "seconds"], rows),
                d.source(GPU, command=f"python -m beliefscope.gpu_check --device {d.get(GPU, 'config', 'device')}",
                         note="the Makefile's gpu-check target", machine=machine), sweep_block)


# ------------------------------------------------------------------------------------------ index
PAGES = {  # file: (title, builder)
    "speculative.md": ("Speculative decoding", spec_page),
    "thinking-states.md": ("Thinking States", thinking_page),
    "instrument.md": ("The belief instrument", instrument_page),
    "models.md": ("Trained models", models_page),
    "determinism.md": ("Determinism", determinism_page),
    "forced.md": ("Forced answers", forced_page),
    "cache.md": ("The KV cache", cache_page),
    "overhead.md": ("What the instrument costs", overhead_page),
    "probes.md": ("Harvest and probes", probes_page),
    "gpu.md": ("On a GPU", gpu_page),
}


def index_page(d: Doc) -> str:
    intro = """
Every figure on these pages is read from the JSON a benchmark or a training run wrote
(`benchmarks/results/*.json`, `checkpoints/*/model_card.json`) by `docs/scripts/results.py`; none is typed by
hand. Under each table: the command that produced it, the machine and the date. Rest the mouse on a figure to
see the file and the key it comes from; `tests/test_docs_results.py` checks every one against its JSON.
What each benchmark runs, and how: `benchmarks/README.md`.
"""
    sp, th, ts, smol = SPEC, THINK, THINK_SMOL, f"{RES}/instrument_smollm2.json"
    det = ("models", "smollm2", "goals")

    def goal(rel, keys, value_keys):
        if not d.has(rel, *keys):
            return [NONE, NONE]
        return [d.fig(rel, keys, "str"), _status(d.get(rel, *keys), d.get(rel, *value_keys))]

    def both(rel, a, b, fmt):
        return d.fig(rel, a, fmt) + " / " + d.fig(rel, b, fmt)

    def when(rel, part=()):
        return d.fig(rel, tuple(part) + ("machine", "date"), "date")

    rows = [
        ["Speculative decoding, SmolLM2, coin-flip rewrites: best drafter over plain greedy",
         d.fig(sp, "best_speedup_smollm2", "x2"),
         *goal(sp, ("goal", "best_speedup_smollm2"), ("best_speedup_smollm2",)),
         when(sp, ("smollm2",)), "[speculative decoding](speculative.md#smollm2)"],
        ["Speculative decoding, SmolLM2, docstrings: best drafter", d.fig(sp, "best_speedup_smollm2_general", "x2"),
         *goal(sp, ("goal", "best_speedup_smollm2_general"), ("best_speedup_smollm2_general",)),
         when(sp, ("general",)), "[speculative decoding](speculative.md#general)"],
        ["Thinking States over chain of thought, toy, 1-8 / 17-32 events (speculative prefill)",
         both(th, "speedup_vs_cot_1_8", "speedup_vs_cot_17_32", "x2"), NONE, NONE, when(th),
         "[Thinking States](thinking-states.md#toy)"],
        ["Thinking States over chain of thought, SmolLM2, 1-8 / 17-32 events",
         both(ts, "speedup_vs_cot_1_8", "speedup_vs_cot_17_32", "x2"), NONE, NONE, when(ts),
         "[Thinking States](thinking-states.md#smollm2)"],
        ["Held-out answers of `smollm2-thinking`, 17-32 events (trained on 1-8)",
         d.fig(_card("smollm2-thinking"), ("eval", "17-32", "answer_accuracy"), "f3"), NONE, NONE,
         d.gitdate(_card("smollm2-thinking")), "[trained models](models.md#smollm2)"],
        ["Best-layer probe of `smollm2-thinking` at event boundaries, 17-32 events",
         d.fig(smol, ("models", "smollm2-thinking", "bands", "17-32", "probe_accuracy"), "f3"), NONE, NONE,
         d.gitdate(smol), "[belief instrument](instrument.md#smollm2)"],
        ["Throughput with 50% / 100% deterministic requests, SmolLM2",
         both(DET, "ratio_at_50pct", "ratio_at_100pct", "x3"),
         both(DET, det + ("ratio_at_50pct", "goal"), det + ("ratio_at_100pct", "goal"), "x2"),
         both(DET, det + ("ratio_at_50pct", "met"), det + ("ratio_at_100pct", "met"), "met"), when(DET),
         "[determinism](determinism.md#smollm2)"],
        ["Forced answers on cache forks over recompute, toy, 512 tokens", d.fig(FORCED, "speedup_512", "x2"),
         *goal(FORCED, ("goal", "speedup_512"), ("speedup_512",)), when(FORCED), "[forced answers](forced.md)"],
        ["`KVCache` over `DynamicCache`, toy at 4096 positions / SmolLM2 at 2048",
         both(CACHE, "speedup_longest", "speedup_longest_smollm2", "x3"), NONE, NONE, when(CACHE),
         "[KV cache](cache.md)"],
        ["Forward through the instrument over the bare model, tiny Llama / SmolLM2",
         both(OVERHEAD, "forward_ratio_tiny", ("smollm2", "forward", "ours_ratio"), "x2"), NONE, NONE,
         when(OVERHEAD), "[instrument cost](overhead.md)"],
        ["Harvest overhead over bare forwards, toy", d.fig(HARVEST, "overhead", "f3"),
         *goal(HARVEST, ("goal", "overhead"), ("overhead",)), when(HARVEST), "[harvest](probes.md#harvest)"],
        ["Probe training, torch over scikit-learn", d.fig(PROBES, "speedup", "x2"),
         *goal(PROBES, ("goal", "speedup"), ("speedup",)), when(PROBES), "[probes](probes.md#probes)"],
        ["Checks run / failed on CUDA", both(GPU, "checks", "failed", "len"), NONE, NONE, d.gitdate(GPU),
         "[on a GPU](gpu.md)"],
    ]
    pages = "\n".join(f"- [{title}]({name})" for name, (title, _) in PAGES.items())
    return page("Results", intro,
                table(["result", "figure", "goal (as recorded)", "status", "measured", "details"], rows),
                "Goals are given where the JSON records them; `benchmarks/README.md` lists every benchmark's goal. "
                "\"Measured\" is the date the JSON records, else the date its file was last committed.",
                "## Pages\n\n" + pages)



README_BEGIN = "<!-- results:begin (written by docs/scripts/results.py from the JSON it names; do not edit by hand) -->"
README_END = "<!-- results:end -->"


def readme_table(d: Doc) -> str:
    """The README's five headline results, each linking to its results page (paths from the repo root)."""
    smol, card = f"{RES}/instrument_smollm2.json", _card("smollm2-thinking")
    q = ("eval_questions",)
    rows = [
        ["`smollm2-thinking` answers stories 4x longer than trained on (held-out wordings, 17-32 events)",
         d.fig(card, ("eval", "17-32", "answer_accuracy"), "f3"), "[trained models](docs/results/models.md)"],
        ["... and stories written by hand, plain / inside the chat template",
         d.fig(card, q + ("free", "answer_top1"), "f3") + " / " + d.fig(card, q + ("free+chat", "answer_top1"), "f3"),
         "[trained models](docs/results/models.md)"],
        ["Best-layer probe of `smollm2-thinking` at event boundaries, 17-32 events",
         d.fig(smol, ("models", "smollm2-thinking", "bands", "17-32", "probe_accuracy"), "f3"),
         "[belief instrument](docs/results/instrument.md)"],
        ["Speculative decoding on SmolLM2, best drafter over plain greedy (same tokens)",
         d.fig(SPEC, "best_speedup_smollm2", "x2"), "[speculative decoding](docs/results/speculative.md)"],
        ["A forward through the instrument over the bare HF model, SmolLM2",
         d.fig(OVERHEAD, ("smollm2", "forward", "ours_ratio"), "x2"), "[instrument cost](docs/results/overhead.md)"],
    ]
    return table(["result", "figure", "details"], rows)


def readme_with_table(text: str, d: Doc) -> str:
    """``text`` (README.md) with the block between its results markers replaced by `readme_table`."""
    if text.count(README_BEGIN) != 1 or text.count(README_END) != 1:
        raise ValueError("README.md needs exactly one results:begin and one results:end marker")
    head, rest = text.split(README_BEGIN)
    _, tail = rest.split(README_END)
    return f"{head}{README_BEGIN}\n{readme_table(d).strip()}\n{README_END}{tail}"


def write_readme(root: str = ROOT) -> str:
    """Rewrite the headline block of ``root``/README.md from the JSON (only when its bytes change)."""
    from beliefscope.base.files import atomic_write_text

    path = os.path.join(root, "README.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = readme_with_table(text, Doc(root))
    if new != text:
        atomic_write_text(path, new)
    return path

# --------------------------------------------------------------------------------------- pictures
COPIED = {  # docs/images/<name>: a picture that needs a model run or a browser, copied as committed
    "results-view.png": f"{RES}/view.png",
    "results-speculative-prefill.png": f"{RES}/speculative_prefill.png",
    "results-loss-smollm2-thinking.png": "checkpoints/smollm2-thinking/loss.png",
}
_DET_SWEEPS = tuple(f"{RES}/determinism_smollm2_{r}.json" for r in ("fp32", "bf16", "paths", "verified"))
DRAWN = {  # docs/images/<name>: (its JSON inputs, the function that draws it from them)
    "results-spec-acceptance.png": ((SPEC,), "draw_spec"),
    "results-cache-timeline.png": ((TRACE,), "draw_timeline"),
    "results-acceptance.png": ((TRACE,), "draw_acceptance"),
    "results-determinism.png": (_DET_SWEEPS + (DET,), "draw_determinism"),
    **{f"results-instrument-{anchor}.png": ((f"{RES}/{stem}.json",), "draw_instrument")
       for stem, _, anchor in INSTRUMENT},
    **{f"results-trajectory-{anchor}.png": ((f"{RES}/{stem}.json",), "draw_trajectory")
       for stem, _, anchor in INSTRUMENT if anchor in ("smollm2", "cups", "variables")},
}


def draw_spec(inputs: list[dict]):
    """Speed-up (median, IQR) and tokens per verify step against Leviathan's expectation, per method, for
    the two SmolLM2 workloads of spec.json."""
    import numpy as np
    from matplotlib.figure import Figure

    res = inputs[0]
    parts = [("smollm2", "SmolLM2, coin-flip rewrites"), ("general", "SmolLM2, docstrings")]
    n = max(len(res[p]["methods"]) for p, _ in parts)
    fig = Figure(figsize=(12, 0.3 * n * len(parts) + 1.5))
    axes = fig.subplots(len(parts), 2, squeeze=False)
    colours = {"plain": "#9e9e9e", "plain-default": "#bdbdbd", "ours": "#2e86ab"}
    for row, (p, title) in zip(axes, parts, strict=True):
        methods = [(k, m) for k, m in res[p]["methods"].items() if m.get("speedup")]
        y = np.arange(len(methods))[::-1]
        med = [m["speedup"]["median"] for _, m in methods]
        err = [[a - m["speedup"]["q1"] for a, (_, m) in zip(med, methods)],
               [m["speedup"]["q3"] - a for a, (_, m) in zip(med, methods)]]
        col = [colours.get(m.get("kind"), "#f2994a") for _, m in methods]
        row[0].barh(y, med, xerr=err, color=col, capsize=2)
        row[0].axvline(1, color="k", lw=0.7)
        row[0].set_yticks(y, [k for k, _ in methods], fontsize=7)
        row[0].set_xlabel("speed-up over plain greedy (median, IQR)", fontsize=8)
        row[0].set_title(f"{title}: speed-up (HF in orange)", fontsize=9)
        drafted = [(k, m) for k, m in methods if m.get("tokens_per_verify_step") is not None]
        y2 = np.arange(len(drafted))[::-1]
        row[1].barh(y2 + 0.2, [m["tokens_per_verify_step"] for _, m in drafted], 0.4, color="#27ae60",
                    label="tokens per verify step (measured)")
        row[1].barh(y2 - 0.2, [m["expected_tokens_per_step_at_alpha"] for _, m in drafted], 0.4, color="#bdbdbd",
                    label="expected at the measured α (Leviathan)")
        row[1].set_yticks(y2, [f"{k}  α {m['alpha']:.2f}" for k, m in drafted], fontsize=7)
        row[1].set_xlabel("tokens committed per verify step", fontsize=8)
        row[1].set_title(f"{title}: acceptance", fontsize=9)
    fig.legend(*axes[0][1].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def draw_timeline(inputs: list[dict]):
    """The cache timeline `beliefscope trace` drew, from the rows its JSON records."""
    from beliefscope.analyses.plots_decoding import cache_timeline

    tl = inputs[0]["featured"]["timeline"]
    return cache_timeline([tuple(r) for r in tl["rows"]], **({"title": tl["title"]} if tl["title"] else {}),
                          start=tl["start"])


def draw_acceptance(inputs: list[dict]):
    """Drafts proposed and accepted per verify step of the trace's featured request."""
    from beliefscope.analyses.plots_decoding import acceptance_chart

    steps = inputs[0]["featured"]["steps"]
    return acceptance_chart([len(s["proposals"]) for s in steps], [s["accepted"] for s in steps],
                            title="Drafts per verify step, featured request")


def draw_determinism(inputs: list[dict]):
    """`analyses.determinism.chart` over the SmolLM2 sweeps, with the bench result's throughput panel; the
    `paths` sweep gives only its batch-invariant series (its other series repeat the dedicated runs)."""
    from beliefscope.analyses.determinism import chart

    fp32, bf16, paths, verified, costs = inputs
    paths = {**paths, "fast_path_unique_max": None, "verified_unique_max": None}
    return chart([fp32, bf16, paths, verified], costs=costs)


def draw_instrument(inputs: list[dict]):
    from beliefscope.analyses.instrument import figure

    return figure(inputs[0])


def draw_trajectory(inputs: list[dict]):
    from beliefscope.analyses.state_strips import strips_figure

    res = inputs[0]
    first = next(iter(res["models"].values()))
    panels = [{"name": name, **r["trajectory"]} for name, r in res["models"].items()]
    band = list(first["bands"])[-1]
    return strips_figure(panels, first["state_names"],
                         f"One held-out {first['task']} story ({band} events), token by token")


def picture_digest(root: str, name: str) -> str:
    """SHA-256 of a drawn picture's inputs (and `DRAW_VERSION`): stored in the PNG, checked before redrawing."""
    inputs, fn = DRAWN[name]
    h = hashlib.sha256(f"{name}\0{fn}\0{DRAW_VERSION}\0".encode())
    for rel in inputs:
        with open(os.path.join(root, rel), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _write_if_changed(path: str, data: bytes) -> None:
    from beliefscope.base.files import atomic_write_bytes

    if os.path.exists(path):
        with open(path, "rb") as f:
            if f.read() == data:
                return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_bytes(path, data)


def write_pictures(docs_dir: str, root: str = ROOT) -> list[str]:
    """Copy `COPIED` and draw `DRAWN` into ``docs_dir/images``; a drawn picture whose PNG already carries
    the digest of its current inputs is left as it is. Returns their paths."""
    import io

    out = []
    for name, rel in COPIED.items():
        path = os.path.join(docs_dir, "images", name)
        with open(os.path.join(root, rel), "rb") as f:
            _write_if_changed(path, f.read())
        out.append(path)
    for name, (inputs, fn) in DRAWN.items():
        path = os.path.join(docs_dir, "images", name)
        digest = picture_digest(root, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                if digest.encode() in f.read():
                    out.append(path)
                    continue
        import matplotlib

        matplotlib.use("Agg")
        data = []
        for rel in inputs:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                data.append(json.load(f))
        fig = globals()[fn](data)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, metadata={"Software": None, "Source": f"sha256:{digest}"})
        _write_if_changed(path, buf.getvalue())
        out.append(path)
    return out


# ------------------------------------------------------------------------------------------ entry
def render_pages(root: str = ROOT) -> dict[str, str]:
    """Every results page: ``{file name: Markdown}``."""
    d = Doc(root)
    pages = {"index.md": index_page(d)}
    for name, (_, build) in PAGES.items():
        pages[name] = build(d)
    return pages


def write_pages(docs_dir: str, *, root: str = ROOT, pictures: bool = True) -> list[str]:
    """Write ``docs_dir/results/*.md`` (and, with ``pictures``, ``docs_dir/images/results-*.png``) from the
    JSON of the checkout at ``root``; files whose bytes would not change are not rewritten, and results
    pages no longer generated are removed. Returns the paths of the files it owns (pages, then pictures)."""
    from beliefscope.base.files import atomic_write_text

    folder = os.path.join(docs_dir, "results")
    os.makedirs(folder, exist_ok=True)
    pages = render_pages(root)
    out = []
    for name, text in pages.items():
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    out.append(path)
                    continue
        atomic_write_text(path, text)
        out.append(path)
    for stale in sorted(set(glob.glob(os.path.join(folder, "*.md"))) - set(out)):
        os.remove(stale)
    if pictures:
        out += write_pictures(docs_dir, root)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", default=os.path.join(ROOT, "docs"), help="the docs folder to write into")
    p.add_argument("--no-pictures", action="store_true", help="write the pages only")
    args = p.parse_args(argv)
    for path in write_pages(args.docs, pictures=not args.no_pictures):
        print(os.path.relpath(path, args.docs))
    print(os.path.relpath(write_readme(), ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
