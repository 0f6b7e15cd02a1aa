"""`beliefscope bench {spec,cache,forced,harvest,probes,all} [--quick] [--json]`.

Each benchmark writes ``benchmarks/results/<name>.json`` (``benchmarks/results/quick/`` with
``--quick``, which never overwrites the committed full results) and prints a table; ``--json``
prints the headline figures as JSON instead.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

# order of `all` (cheap first)
BENCHMARKS = ("forced", "spec", "harvest", "probes", "cache", "determinism", "thinking", "overhead")


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="speed benchmarks (ratios against a baseline, measured in one run)",
                              description=__doc__.split("\n")[0])
    p.add_argument("which", choices=[*BENCHMARKS, "all"], help="benchmark to run, or all of them")
    p.add_argument("--quick", action="store_true",
                   help="tiny smoke run (< 3 min for all); checks outputs only, writes benchmarks/results/quick/")
    p.add_argument("--json", action="store_true", help="print the headline figures as JSON")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (0 = torch's default). Default: all cores for spec (decoding speed is "
                        "what a user gets with every core), 1 for the others (stable ratios on a shared machine)")
    p.set_defaults(func=run)


def headline(name: str) -> str:
    """The key of the figure a benchmark is summed up by (its module's HEADLINE)."""
    return importlib.import_module(f"beliefscope.benchmarks.{name}").HEADLINE


def run_one(name: str, quick: bool, no_progress: bool = False) -> dict:
    """Run one benchmark and return its result dict. Every benchmark module keeps one contract:
    ``main(quick=False, progress=None, config=None) -> dict`` writes ``results/<name>.json`` (or
    ``results/quick/``) and returns it, ``HEADLINE`` names its figure, ``table(result)`` (optional)
    gives the rows printed, and one of OUTPUT_FLAGS says whether its outputs matched the baseline."""
    module = importlib.import_module(f"beliefscope.benchmarks.{name}")
    return module.main(quick=quick, progress=_progress(name, disable=no_progress))


def _progress(name: str, disable: bool = False):
    from beliefscope.base.progress import progress_bar

    bar = progress_bar(f"bench {name}", disable=disable)
    return lambda: bar.update(1)


def run(args) -> int:
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    names = BENCHMARKS if args.which == "all" else (args.which,)
    summary, failed = {}, []
    for name in names:
        threads = args.threads if args.threads is not None else ((os.cpu_count() or 1) if name == "spec" else 1)
        if threads > 0:
            torch.set_num_threads(threads)
        t0 = time.perf_counter()
        try:
            result = run_one(name, args.quick, args.no_progress)
        except ImportError as e:  # an area whose API has not landed yet
            summary[name] = {"skipped": f"{type(e).__name__}: {e}"}
            failed.append(name)
            continue
        key = headline(name)
        summary[name] = {key: result.get(key), "seconds": round(time.perf_counter() - t0, 1),
                         "outputs_ok": outputs_ok(name, result)}
        if not args.json:
            print_result(name, result)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_table([["benchmark", "headline", "value", "outputs ok", "seconds"]]
                    + [[n, headline(n), s.get(headline(n), s.get("skipped")), s.get("outputs_ok"), s.get("seconds")]
                       for n, s in summary.items()])
    bad = [n for n, s in summary.items() if s.get("outputs_ok") is False]
    if bad:
        print(f"beliefscope bench: outputs differ from the baseline in: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad or failed else 0


OUTPUT_FLAGS = ("all_identical", "outputs_identical", "accuracy_equal", "stores_equal")  # correctness flags


def outputs_ok(name: str, result: dict):
    """The correctness flag each benchmark records (None when it has none)."""
    for key in OUTPUT_FLAGS:
        if key in result:
            return bool(result[key])
    return None


def print_result(name: str, result: dict) -> None:
    module = importlib.import_module(f"beliefscope.benchmarks.{name}")
    print(f"\n== bench {name} ({'quick' if result.get('quick') else 'full'}) ==")
    if hasattr(module, "table"):
        for rows in _as_tables(module.table(result)):
            print_table(rows)
    key = headline(name)
    print(f"{key} = {result.get(key)}")


def _as_tables(t):
    return t if t and isinstance(t[0], list) and t[0] and isinstance(t[0][0], list) else [t]


def print_table(rows: list[list]) -> None:
    """Left-aligned columns; floats with 4 significant digits."""
    cells = [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(max(map(len, cells)))]
    for j, r in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))
