"""The GPU page of the Results (docs/scripts/results.py): `gpu_page`, the runs on lent GPUs (every command once,
the determinism sweep, the H200 determinism cost table and overhead), with the paths of the JSON it reads
(`GPU`, `SWEEP_GPU`, `DET_H200`). A function of a `results_doc.Doc`; it imports results_doc and the decoding
pages' shared helpers.
"""

from __future__ import annotations

import functools
import html

from results_decoding import OVERHEAD_H100, _goal_name, _shape_of
from results_doc import RES, Doc, page, table

GPU = f"{RES}/gpu_check.json"
SWEEP_GPU = f"{RES}/gpu_check_sweep_h100.json"  # the determinism sweep alone, after its schedulers were shared


def gpu_page(d: Doc) -> str:
    intro = """
Every command once on a CUDA device, offline (`make gpu-check`): each check runs a command and compares what
it must (`beliefscope.gpu_check`). Then the cost of determinism (LLM-42's table) and of the instrument on an
H200, from one `python -m beliefscope.benchmarks.gpu_session` run.
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
                         note="the Makefile's gpu-check target", machine=machine), sweep_block,
                _determinism_h200(d), _overhead_h200(d))


DET_H200 = f"{RES}/determinism_h200_bf16.json"
OVERHEAD_H200 = {"bfloat16": f"{RES}/overhead_h200_bf16.json", "float32": f"{RES}/overhead_h200_fp32.json"}
SESSION_H200 = f"{RES}/gpu_session_h200.json"  # the session's summary (the same figures, by part)


def _h200_source(d: Doc, rel: str) -> str:
    """The source line of an H200 result: the command, GPU and driver its ``measured`` record names."""
    machine = (d.fig(rel, ("measured", "gpu"), "str") + ", driver " + d.fig(rel, ("measured", "driver"), "str")
               + ", " + d.machine(rel))
    return d.source(rel, command_keys=("measured", "command"), machine=machine, date_keys=("measured", "date"))


def _determinism_h200(d: Doc) -> str:
    """`bench determinism` on the SmolLM2-shaped model in bf16 on an H200, replayed as CUDA graphs."""
    rel, k = DET_H200, ("models", "smollm2")
    f, c = functools.partial(d.fig, rel), k + ("config",)
    rows = [[html.escape(r["config"]), f(k + ("rows", i, "deterministic_requests"), "int"),
             f(k + ("rows", i, "window"), "int"), f(k + ("rows", i, "ratio", "median"), "x3"),
             f(k + ("rows", i, "ratio"), "iqr3"), f(k + ("rows", i, "tokens_per_s"), "f1"),
             f(k + ("rows", i, "verify_forwards"), "int"), f(k + ("rows", i, "verify_rows"), "int")]
            for i, r in enumerate(d.get(rel, *k, "rows"))]
    fixed = next(i for i, r in enumerate(d.get(rel, *k, "rows")) if r["config"] == "fixed shape")
    goals = "; ".join(f"{_goal_name(g)}: goal {f(k + ('goals', g, 'goal'), 'x2')}, measured "
                      f"{f(k + ('goals', g, 'measured'), 'x3')}, {f(k + ('goals', g, 'met'), 'met')}"
                      for g in d.get(rel, *k, "goals"))
    return (
        "## The determinism cost table on an H200 {#determinism-h200}\n\n"
        "`bench determinism` on a model with SmolLM2-135M-Instruct's config and tokenizer and random weights (the "
        "machine has no network), in bfloat16 on " + f("device", "str") + ", its forwards replayed as CUDA graphs "
        "(`SchedulerConfig(compile=True)`; `compile` in its config: " + f(c + ("compile",), "yesno") + "). "
        + f(c + ("n_requests",), "int") + " requests of " + f(c + ("new_tokens", 0), "int") + " to "
        + f(c + ("new_tokens", 1), "int") + " new tokens (" + f(k + ("tokens",), "int") + " in all), max batch "
        + f(c + ("max_batch",), "int") + ", " + f(c + ("repeats",), "int") + " repeats after "
        + f(k + ("warmup_runs",), "int") + " warm-up run. Throughput is a ratio to \"share 0%\" (every request "
        "on the fast path) in the same interleaved run; on a GPU in bfloat16 the deterministic requests are "
        "verified at a fixed shape (verify kernels: " + f(k + ("rows", 1, "verify_kernels"), "str") + "). "
        "\"Fixed shape\" is the batch-invariant baseline: every request decoded at one fixed shape, one "
        "token per forward, no fast path.\n\n"
        + table(["configuration", "deterministic requests", "window", "throughput ratio", "IQR", "tokens / s",
                 "verify forwards", "verify rows"], rows) + "\n\n"
        "Throughput at 10% / 50% / 100% deterministic: " + f("ratio_at_10pct", "x3") + " / "
        + f("ratio_at_50pct", "x3") + " / " + f("ratio_at_100pct", "x3") + " of the all-fast-path run; "
        "deterministic outputs identical at every share: " + f("outputs_identical", "yesno") + ". " + goals
        + ". The fixed-shape baseline ran at " + f(k + ("rows", fixed, "ratio", "median"), "x3") + " of share 0% "
        "on this machine and model. The LLM-42 paper reports its own overheads, on its own models and hardware; "
        "these figures are not comparable with them one to one.\n\n" + _h200_source(d, rel)
        + "\n\nThe session's summary of the same run: `" + SESSION_H200 + "` (part seconds: "
        + d.fig(SESSION_H200, ("parts", "determinism", "seconds"), "f1") + ").")


def _overhead_h200(d: Doc) -> str:
    """`bench overhead` on the H200, bf16 and fp32: ratios over the bare HF model, and which tokens agreed."""
    rows = []
    for dtype, rel in OVERHEAD_H200.items():
        for part in ("tiny", "smollm2"):
            g = functools.partial(d.fig, rel)
            rows.append([f"{dtype}, {'tiny Llama' if part == 'tiny' else 'SmolLM2 shape'}",
                         g((part, "forward", "ours_ratio"), "x2"), g((part, "capture", "ours_ratio"), "x2"),
                         g((part, "generate", "ours_ratio"), "x2"), g((part, "generate", "compiled_ratio"), "x2"),
                         g((part, "generate_tokens_equal"), "yesno"),
                         g((part, "compiled_tokens_equal_ours"), "yesno") + " / "
                         + g((part, "compiled_tokens_equal_hf"), "yesno")])
    bf = OVERHEAD_H200["bfloat16"]
    return ("## What the instrument costs on an H200 {#overhead-h200}\n\n"
            "`bench overhead` in the same session, each figure a time ratio over the bare HF model on the same "
            "GPU (below 1 is faster): our forward, a capture of every `resid_post`, greedy generation, and "
            "`generate --compile` (CUDA graphs) against HF's eager `generate`. Inputs: SmolLM2 shape "
            + _shape_of(d, bf, "smollm2") + ", tiny Llama " + _shape_of(d, bf, "tiny") + ".\n\n"
            + table(["dtype, model", "forward", "capture", "generate", "generate, compiled",
                     "generated tokens = HF", "compiled tokens = ours / HF"], rows) + "\n\n"
            "In bfloat16 on the SmolLM2-shaped model the compiled decode's tokens did not equal our eager decode's ("
            + d.fig(bf, ("smollm2", "compiled_tokens_equal_ours"), "yesno") + ") nor HF's ("
            + d.fig(bf, ("smollm2", "compiled_tokens_equal_hf"), "yesno") + "), as on the H100 ("
            + d.fig(OVERHEAD_H100["bfloat16"], ("smollm2", "compiled_tokens_equal_ours"), "yesno")
            + "); in float32, and on the tiny Llama in both dtypes, they did. The model has random weights, "
            "whose top logits can be near-ties in bfloat16, and a compiled step may reduce in another order than "
            "an eager one (its attention runs over the cache's whole capacity, masked), so greedy can part there. "
            "Each JSON's `outputs_identical` "
            "covers the eager paths only (forward, capture, generation, prefill): "
            + d.fig(bf, "outputs_identical", "yesno") + " in bfloat16, "
            + d.fig(OVERHEAD_H200["float32"], "outputs_identical", "yesno") + " in float32.\n\n"
            + "\n\n".join(_h200_source(d, rel) for rel in OVERHEAD_H200.values()))
