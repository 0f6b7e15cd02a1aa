"""The decoding pages of the Results (docs/scripts/results.py): speculative decoding (`spec_page`), the KV
cache (`cache_page`), forced answers (`forced_page`), what the instrument costs (`overhead_page`),
determinism (`determinism_page`), with their private helpers and the paths of the JSON each one reads
(`SPEC`, `CACHE`, `TRACE`, `FORCED`, `OVERHEAD`, `DET`, ...); the GPU page is results_gpu.py. Each
page is a function of a `results_doc.Doc`; this module imports only results_doc.
"""

from __future__ import annotations

import functools
import html
import re

from results_doc import NONE, RES, Doc, _status, page, picture, table

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


OVERHEAD = f"{RES}/overhead.json"


def overhead_page(d: Doc) -> str:
    intro = """
The instrument beside the bare Hugging Face model, same weights and inputs (`beliefscope bench overhead`;
`benchmarks/README.md`). Each figure is a time ratio over the bare model: our forward, a capture of every
`resid_post` (against `output_hidden_states`), greedy generation, and "prefill": greedy generation of a few
tokens after a long prompt, where the prompt's forward dominates. "Before" is the TransformerLens-wrapped path
(a copy of the model with its bridge built: what every forward cost before the Runner built the bridge only on
demand), and for the prefill a prefill that computes every prompt position's logits, as each
did before it asked for the last position's alone (HF's `logits_to_keep`, what HF's own `generate` does).
"""
    f = functools.partial(d.fig, OVERHEAD)
    rows = []
    for part in ("tiny", "smollm2"):
        for what in ("forward", "capture", "generate", "prefill"):
            k = (part, what)
            if not d.has(OVERHEAD, *k):  # a result written before the row existed
                continue
            rows.append([f"{'tiny Llama' if part == 'tiny' else 'SmolLM2'}, {what}", f(k + ("hf_ms",), "f1"),
                         f(k + ("ours_ratio",), "x2"),
                         d.opt(OVERHEAD, k + ("all_logits_ratio" if what == "prefill" else "wrapped_ratio",), "x2"),
                         d.opt(OVERHEAD, k + ("transformerlens_ratio",), "x2"),
                         d.opt(OVERHEAD, k + ("nnsight_ratio",), "x2")])
    models = " ".join(f"{t}: {f((p, 'model'), 'str')}, input {_shape(d, p)}." for p, t in (("tiny", "Tiny"),
                                                                                           ("smollm2", "SmolLM2")))
    if d.has(OVERHEAD, "config", "long_prompt_len"):
        models += (f" Prefill: a prompt of {f(('config', 'long_prompt_len'), 'int')} tokens, then "
                   f"{f(('config', 'long_new_tokens'), 'int')} new tokens.")
    equal = ", ".join(f"{p} forward {f((p, 'forward_bit_equal'), 'yesno')}, "
                      f"capture {f((p, 'capture_bit_equal'), 'yesno')}, "
                      f"generated tokens {f((p, 'generate_tokens_equal'), 'yesno')}"
                      + (f", after the long prompt {f((p, 'prefill_tokens_equal'), 'yesno')}"
                         if d.has(OVERHEAD, p, "prefill_tokens_equal") else "") for p in ("tiny", "smollm2"))
    return page("What the instrument costs", intro,
                models + "\n\n" + table(["model, path", "bare HF ms", "ours", "before", "TransformerLens", "nnsight"],
                                        rows),
                f"Bit-equal to the bare model: {equal}.", d.bench_source(OVERHEAD, "overhead"),
                _overhead_gpu(d), _compiled_gpu(d))


OVERHEAD_H100 = {"bfloat16": f"{RES}/overhead_h100_bf16.json", "float32": f"{RES}/overhead_h100_fp32.json"}
COMPILED_H100 = f"{RES}/compiled_decode_h100.json"


def _overhead_gpu(d: Doc) -> str:
    """The same table on an H100, bf16 and fp32 (a SmolLM2-shaped model with random weights)."""
    rows, first = [], OVERHEAD_H100["bfloat16"]
    for dtype, rel in OVERHEAD_H100.items():
        for part in ("tiny", "smollm2"):
            for what in ("forward", "capture", "generate", "prefill"):
                k = (part, what)
                if not d.has(rel, *k):  # a result written before the row existed
                    continue
                compiled = NONE
                if what == "generate" and d.has(rel, part, "generate", "compiled_ratio"):
                    compiled = (d.fig(rel, k + ("compiled_ratio",), "x2") + ", tokens equal: "
                                + d.fig(rel, (part, "compiled_tokens_equal_ours"), "yesno"))  # to our eager decode
                rows.append([f"{dtype}, {'tiny Llama' if part == 'tiny' else 'SmolLM2 shape'}, {what}",
                             d.fig(rel, k + ("hf_ms",), "f1"), d.fig(rel, k + ("ours_ratio",), "x2"),
                             d.opt(rel, k + ("all_logits_ratio" if what == "prefill" else "wrapped_ratio",), "x2"),
                             d.opt(rel, k + ("transformerlens_ratio",), "x2"), compiled])
    gpu = d.fig(COMPILED_H100, ("machine", "gpu"), "str") + ", torch " + d.fig(first, ("machine", "torch"), "str")
    return ("## On an H100\n\nThe SmolLM2 rows use a model with SmolLM2-135M-Instruct's config and random weights "
            f"(the machine has no network), input {_shape_of(d, first, 'smollm2')}; the tiny Llama's input is "
            f"{_shape_of(d, first, 'tiny')}.\n\n"
            + table(["dtype, model, path", "bare HF ms", "ours", "before", "TransformerLens",
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
    return _shape_of(d, OVERHEAD, part)


DET = f"{RES}/determinism.json"
DET_RUNS = ("fp32", "bf16", "verified", "paths", "grid", "grid_fixed_shape")


def determinism_page(d: Doc) -> str:
    intro = """
Deterministic requests among others under continuous batching (`beliefscope bench determinism`;
`benchmarks/README.md`): throughput as a ratio to the same workload with every request on the fast path,
as the share of deterministic requests grows. Below, `beliefscope determinism` sweeps: how many distinct
outputs one prompt gets across batch compositions. The same table on a GPU, with CUDA graphs:
[On a GPU](gpu.md#determinism-h200).
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
