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

The code lives beside this file, by page family: ``results_doc.py`` (formats, `Doc`, the Markdown pieces),
``results_decoding.py``, ``results_gpu.py`` and ``results_models.py`` (the pages), ``results_pictures.py`` (the
pictures); this module holds the index, the README's table and the entry points, and re-exports what callers read.

Run directly (``python docs/scripts/results.py``) to rewrite the pages of this checkout's ``docs/``.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # loaded by file path (tests, generate.py): its sibling modules must be importable
    sys.path.insert(0, HERE)

from results_decoding import (  # noqa: E402
    CACHE,
    DET,
    FORCED,
    OVERHEAD,
    SPEC,
    cache_page,
    determinism_page,
    forced_page,
    overhead_page,
    spec_page,
)
from results_doc import FORMATS, NONE, RES, ROOT, Doc, _status, fmt_value, page, table  # noqa: E402
from results_gpu import DET_H200, GPU, gpu_page  # noqa: E402
from results_models import (  # noqa: E402
    HARVEST,
    PROBES,
    THINK,
    THINK_SMOL,
    _card,
    instrument_page,
    models_page,
    probes_page,
    thinking_page,
)
from results_pictures import COPIED, DRAWN, picture_digest, write_pictures  # noqa: E402

# what callers read from this module (tests/test_docs_results.py, generate.py), wherever it is defined
__all__ = ["COPIED", "DRAWN", "Doc", "FORMATS", "PAGES", "README_BEGIN", "README_END", "fmt_value", "index_page",
           "main", "picture_digest", "readme_table", "readme_with_table", "render_pages", "write_pages",
           "write_pictures", "write_readme"]


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
        ["Throughput with 50% / 100% deterministic requests, SmolLM2 shape (random weights), H200, CUDA graphs",
         both(DET_H200, "ratio_at_50pct", "ratio_at_100pct", "x3"),
         both(DET_H200, det + ("ratio_at_50pct", "goal"), det + ("ratio_at_100pct", "goal"), "x2"),
         both(DET_H200, det + ("ratio_at_50pct", "met"), det + ("ratio_at_100pct", "met"), "met"),
         d.fig(DET_H200, ("measured", "date"), "date"), "[on a GPU](gpu.md#determinism-h200)"],
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
