"""Thinking States vs chain of thought: tokens per answer and wall time, measured in one run.

Both models share the backbone (4x128 Llama), data and step budget. Per prompt, Thinking States
runs chunk by chunk on its KV caches (`decoding.thinking.run_thinking`: the context holds only
the story and the answer; T writes 2 thought tokens per chunk in its own one-block cache); the
CoT model decodes its chain of states and the answer greedily on a `KVCache` (plain cached
greedy). Times are interleaved per prompt, so the ratio is paired. The paper reports Thinking
States 2.66x faster than CoT on GSM8K (Amos et al. 2026).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from beliefscope.benchmarks.common import header, interleaved, spread, write_result


@dataclass
class ThinkingBenchConfig:
    """What the benchmark times."""

    events: str = "17-32"  # story lengths timed (the Thinking States model was trained on 1-8)
    n_prompts: int = 20  # prompts, each timed `repeats` times per model
    repeats: int = 3  # timed calls per prompt and model (interleaved)
    threads: int = 1  # torch threads


QUICK = ThinkingBenchConfig(events="3-4", n_prompts=2, repeats=1)


def _cot_answer(model, tok, prompt: str, max_new: int) -> list[int]:
    from beliefscope.decoding import SpecConfig, generate

    ids = tok(prompt)["input_ids"]
    return generate(model, ids, SpecConfig(max_new_tokens=max_new, stop_at_eos=True)).tokens


def main(quick: bool = False, progress=None, config: ThinkingBenchConfig | None = None) -> dict:
    """Run, write ``thinking.json`` and return the result."""
    from beliefscope.models import load_model
    from beliefscope.decoding.thinking import run_thinking
    from beliefscope.tasks import get_task

    cfg = config or (QUICK if quick else ThinkingBenchConfig())
    torch.set_num_threads(cfg.threads)
    thinking, tok = load_model("thinking")
    cot, ctok = load_model("cot-rope")
    direct = get_task("coinflip", fmt="direct").examples(cfg.n_prompts, 777, cfg.events)
    chain = get_task("coinflip", fmt="cot").examples(cfg.n_prompts, 777, cfg.events)
    ratios, t_think, t_cot, tok_think, tok_cot, thought_toks, right = [], [], [], [], [], [], [0, 0]
    for d, c in zip(direct, chain, strict=True):
        ids = tok(d.prompt)["input_ids"]
        max_new = len(ctok(c.completion)["input_ids"]) + 2
        res = interleaved({"cot": lambda c=c, m=max_new: _cot_answer(cot, ctok, c.prompt, m),
                           "thinking": lambda ids=ids: run_thinking(thinking, ids, max_new_tokens=2)},
                          repeats=cfg.repeats, warmup=0, progress=progress)
        run, cot_tokens = res["thinking"]["outputs"], res["cot"]["outputs"]
        ratios.append(res["thinking"]["speedup"]["median"])
        t_think.append(res["thinking"]["seconds"]["median"])
        t_cot.append(res["cot"]["seconds"]["median"])
        tok_think.append(len(run.tokens))
        tok_cot.append(len(cot_tokens))
        thought_toks.append(sum(len(z) for _, z in run.thoughts))
        right[0] += int(tok.decode(run.tokens[:1]) == d.answer)
        right[1] += int((ctok.decode(cot_tokens, skip_special_tokens=True).split() or [""])[-1] == c.answer)
    result = header("thinking", quick, config=vars(cfg),
                    speedup_vs_cot=spread(ratios, 4), seconds_thinking=spread(t_think), seconds_cot=spread(t_cot),
                    context_tokens_generated_thinking=spread(tok_think, 2),
                    context_tokens_generated_cot=spread(tok_cot, 2),
                    thought_tokens_per_prompt=spread(thought_toks, 2),
                    answer_accuracy_thinking=right[0] / len(direct), answer_accuracy_cot=right[1] / len(chain))
    result["speedup"] = result["speedup_vs_cot"]["median"]
    write_result("thinking", result, quick)
    return result


def table(result: dict) -> list[list]:
    s = result["speedup_vs_cot"]
    return [["Thinking States vs CoT", f"{result['config']['events']} events"],
            ["speedup (paired median, IQR)", f"{s['median']:.2f}x ({s['q1']:.2f}-{s['q3']:.2f})"],
            ["tokens generated in the context: thinking / CoT",
             f"{result['context_tokens_generated_thinking']['median']:.0f} / "
             f"{result['context_tokens_generated_cot']['median']:.0f}"],
            ["thought tokens (T's own cache, dropped)", f"{result['thought_tokens_per_prompt']['median']:.0f}"],
            ["answer accuracy: thinking / CoT",
             f"{result['answer_accuracy_thinking']:.2f} / {result['answer_accuracy_cot']:.2f}"]]
