"""Evaluate a model on a task: greedy exact match (chain of thought) and direct-answer accuracy;
for a Thinking States model, the answer after its own thoughts and the accuracy of the thoughts.

>>> res = evaluate("target", "coinflip", events="1-4", n=40)
>>> res["exact_match"] >= 0.95 and res["answer_accuracy"] >= 0.95
True
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import singledispatch

import torch

from ..tasks import get_task, parse_events_range
from ..tasks.coinflip_free import free_examples
from ..tasks.questions import in_chat
from .forward import forward_module, last_logits_only
from .load import load_model
from .profile import hf_of
from .thinking.data import gold_thought, state_words, thought_state, thought_word_id
from .thinking.model import ThinkingStates
from .tokenizer import answer_token_ids


@torch.no_grad()
def direct_answers(hf_model, tok, examples, batch_size=64, progress=None, top1: list | None = None):
    """Argmax over the task's answer words at the end of each direct prompt; ``progress(n)`` after
    every batch of n prompts. ``top1`` (a list) receives the top token of the whole vocabulary, decoded
    and stripped (what greedy decoding would write first). The forward is the HF model's (`models.forward`), and
    computes the last position's logits alone where it may: every position's, for 64 SmolLM2 prompts of 100
    tokens, take 1.3 GB."""
    names = examples[0].state_names
    ids = torch.tensor(answer_token_ids(tok, names))
    run = forward_module(hf_model)
    last = last_logits_only(run)
    preds = []
    for i in range(0, len(examples), batch_size):
        chunk = examples[i: i + batch_size]
        enc = tok([e.prompt for e in chunk], return_tensors="pt", padding=True).to(_device_of(hf_model))
        pos = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        logits = run(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], position_ids=pos,
                     **last).logits[:, -1]  # [batch, vocab]
        preds += logits[:, ids.to(logits.device)].argmax(-1).tolist()
        if top1 is not None:
            top1 += [tok.decode([t]).strip() for t in logits.argmax(-1).tolist()]
        if progress:
            progress(len(chunk))
    return [names[p] for p in preds]


def _device_of(model) -> torch.device:
    """Where ``model``'s weights are (inputs go there)."""
    return next(model.parameters()).device


def story_split(rendering: str, split: str | None) -> dict:
    """The task keyword for which templates and names to draw: natural English defaults to the
    held-out half (what a model card reports); ``split`` overrides it ("train", "heldout", "all").
    The toy grammar has no split.

    >>> story_split("natural", None), story_split("natural", "train"), story_split("toy", None)
    ({'split': 'heldout'}, {'split': 'train'}, {})
    """
    if split is None:
        return {"split": "heldout"} if rendering == "natural" else {}
    if rendering != "natural":
        raise ValueError(f"split={split!r} needs natural English stories (rendering='natural'); the "
                         f"{rendering!r} rendering has no train / held-out halves")
    if split not in ("train", "heldout", "all", "free"):
        raise ValueError(f"split={split!r} is unknown: use 'train', 'heldout', 'all' or 'free'")
    return {"split": split}


def eval_stories(task: str, rendering: str, fmt: str, split: str | None, n: int, seed: int, events: tuple,
                 questions: str = "fixed", chat: bool = False, tok=None) -> list:
    """The stories an evaluation reads: ``n`` drawn from the task's templates (their train or held-out
    half; ``questions`` "varied" asks in the question forms of that half), or with ``split="free"`` the
    first ``n`` hand-written free-wording stories (`tasks.coinflip_free`); inside ``tok``'s chat
    template when ``chat``."""

    held = story_split(rendering, split)
    if held.get("split") == "free":

        if task != "coinflip" or fmt != "direct":
            raise ValueError(f"split='free' holds direct-answer coin stories: use task coinflip and format direct "
                             f"(got {task!r}, {fmt!r})")
        exs = free_examples()[:n]
    else:
        kw = {"questions": questions} if questions != "fixed" else {}
        exs = get_task(task, rendering=rendering, fmt=fmt, **held, **kw).examples(n, seed, events)
    return [in_chat(ex, tok) for ex in exs] if chat else exs


@torch.no_grad()
def greedy_completions(hf_model, tok, prompts, max_new_tokens, batch_size=64, progress=None):
    """Plain greedy continuations (HF generate), decoded and stripped; ``progress(n)`` after every
    batch of n prompts."""
    outs = []
    for i in range(0, len(prompts), batch_size):
        enc = tok(prompts[i: i + batch_size], return_tensors="pt", padding=True).to(_device_of(hf_model))
        gen = hf_model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        outs += tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        if progress:
            progress(len(prompts[i: i + batch_size]))
    return [o.strip() for o in outs]


@dataclass
class EvalConfig:
    """`beliefscope eval`: which model, on which stories, in which prompt format."""

    model: str = ""  # checkpoint folder, shipped name (target, draft, thinking, smollm2-thinking, ...) or hub name
    task: str = "coinflip"  # task family: coinflip, cups or variables
    events: str = "1-8"  # inclusive range of event counts, e.g. 1-8
    n: int = 500  # prompts per format
    seed: int = 12345  # seed of the sampled stories (model cards report this one)
    rendering: str | None = None  # toy or natural (None: the model's own, natural for smollm2)
    split: str | None = None  # natural English only: which templates and names the stories use (None: heldout,
    #   what model cards report; train separates length generalisation from new wordings; free: the hand-written
    #   free-wording coin stories of tasks.coinflip_free, where --n caps the count and --events is not used)
    questions: str = "fixed"  # natural English: "fixed" questions ending in "A:", or "varied" question forms of
    #   the split's half, after or before the story, with or without "A:" (tasks.questions)
    chat: bool = False  # give each story as a user turn of the model's chat template (SmolLM2's ChatML)
    format: str | None = None  # prompts: direct answers, chain of thought, or both (None: both for toy models,
    #   direct for natural English ones; smollm2-cot answers after its chain: --format cot)
    table: bool = False  # natural English: every row of models.evaluate_free.ROWS instead (template bands with
    #   --n stories each, varied question forms, the free-wording stories; each plain and in the chat template)
    into_card: bool = False  # with --table: write the table into the model folder's model_card.json
    #   (eval_questions, and eval for the template bands), so the card's figures come from this command
    misses: str | None = None  # Thinking States models: write each story with a wrong answer or thought to this
    #   JSONL file (its chunks, the gold and the model's thought per chunk) to see which sentences fail


def evaluate(model, task: str = "coinflip", events="1-8", n: int = 500, seed: int = 12345,
             tokenizer=None, rendering: str = "toy", batch_size: int = 64, formats=("direct", "cot"),
             split: str | None = None, progress=None, questions: str = "fixed", chat: bool = False,
             misses: list | None = None) -> dict:
    """Exact match of full CoT + answer, and direct-answer accuracy, overall and by event count
    (natural English: on the held-out templates and names unless ``split`` says "train" or "all",
    as for Thinking States models).

    `model` is a name/path (loaded with `models.load.load_model`) or an HF model with `tokenizer`.
    ``formats`` picks the prompts: direct answers, chain of thought, or both. ``progress(n)`` is
    called as n more prompts are done (``n * len(formats)`` in all; a Thinking States model: n).
    ``questions`` / ``chat``: how the stories ask (`eval_stories`). ``answer_accuracy`` is the argmax over
    the state words; ``answer_top1`` counts an answer right only when the top token of the whole
    vocabulary is the right state word (an end-of-text or any other word is wrong). ``misses``: see
    `evaluate_thinking` (Thinking States models only).
    """
    lo, hi = parse_events_range(events)
    if n < 1:
        raise ValueError(f"n must be at least 1 prompt, got {n}")
    if isinstance(model, str):

        model, tokenizer = load_model(model)
    return _evaluate_loaded(model, tokenizer, task, (lo, hi), n, seed, rendering, batch_size, formats, split, progress,
                            questions, chat, misses)


@singledispatch
def _evaluate_loaded(model, tokenizer, task, events, n, seed, rendering, batch_size, formats, split, progress,
                     questions, chat, misses) -> dict:
    """`evaluate` of a loaded model; ``events``: ``(lo, hi)``. A Thinking States model has its overload below."""
    lo, hi = events
    if misses is not None:
        raise ValueError(f"misses lists the wrong thoughts of a Thinking States model; "
                         f"{getattr(model, 'name_or_path', 'this model')} is not a Thinking States model: drop it")
    hf, tok = hf_of(model), tokenizer
    by_ev: dict[int, list] = defaultdict(lambda: [0, 0, 0, 0])  # em_ok, em_n, ans_ok, ans_n
    held = story_split(rendering, split)
    result = {"n": n, "task": task, "events": f"{lo}-{hi}", "seed": seed, "formats": list(formats), **held,
              "questions": questions, "chat": chat}
    if "direct" in formats:
        direct = eval_stories(task, rendering, "direct", split, n, seed, (lo, hi), questions, chat, tok)
        result["n"] = len(direct)
        top1: list = []
        preds = direct_answers(hf, tok, direct, batch_size, progress, top1=top1)
        result["answer_top1"] = sum(t == e.answer for t, e in zip(top1, direct)) / len(direct)
        for ex, p in zip(direct, preds, strict=True):
            by_ev[ex.n_events][2] += int(p == ex.answer)
            by_ev[ex.n_events][3] += 1
        result["answer_accuracy"] = sum(p == e.answer for p, e in zip(preds, direct)) / len(direct)
    if "cot" in formats:
        cot = eval_stories(task, rendering, "cot", split, n, seed, (lo, hi), questions, chat, tok)  # the same stories
        max_new = max(len(tok(e.completion)["input_ids"]) for e in cot) + 1
        comps = greedy_completions(hf, tok, [e.prompt for e in cot], max_new, batch_size, progress)
        for ex, c in zip(cot, comps, strict=True):
            by_ev[ex.n_events][0] += int(c == ex.completion.strip())
            by_ev[ex.n_events][1] += 1
        result["exact_match"] = sum(c == e.completion.strip() for c, e in zip(comps, cot)) / len(cot)
        # the answer a chain-of-thought model gives after its own chain (last word of its completion)
        result["cot_answer_accuracy"] = sum((c.split() or [""])[-1] == e.answer for c, e in zip(comps, cot)) / len(cot)
        result.setdefault("answer_accuracy", result["cot_answer_accuracy"])
        result["exact_match_by_events"] = {str(k): round(v[0] / v[1], 4) for k, v in sorted(by_ev.items()) if v[1]}
    if "direct" in formats:
        result["answer_accuracy_by_events"] = {str(k): round(v[2] / v[3], 4) for k, v in sorted(by_ev.items())
                                               if v[3]}
    return result


@_evaluate_loaded.register(ThinkingStates)
def _evaluate_with_thoughts(model, tokenizer, task, events, n, seed, rendering, batch_size, formats, split, progress,
                            questions, chat, misses) -> dict:
    return evaluate_thinking(model, tokenizer, task, "{}-{}".format(*events), n, seed, batch_size, rendering=rendering,
                             split=split, progress=progress, questions=questions, chat=chat, misses=misses)


@torch.no_grad()
def evaluate_thinking(model, tok, task: str = "coinflip", events="1-8", n: int = 500, seed: int = 12345,
                      batch_size: int = 64, rendering: str = "toy", split: str | None = None,
                      progress=None, questions: str = "fixed", chat: bool = False, misses: list | None = None) -> dict:
    """Answer accuracy of a Thinking States model after its own thoughts, and thought accuracy:
    the share of chunks whose thought starts as the gold thought does (the state's words, or a bare
    <eos> where the model was trained to leave an unchanged state unsaid). Natural English is
    drawn from the held-out templates and names unless ``split`` says "train" or "all".
    ``progress(n)`` is called as n more stories are done. ``questions`` / ``chat``: how the stories ask
    (`eval_stories`). Beside the answer (argmax over the state words) it reports ``answer_top1`` (the
    top token of the whole vocabulary is the right state word) and ``answer_follows_thought`` (the
    answer names the state of the model's own last non-empty thought). ``misses``, when a list, gets one
    record per story with a wrong answer or a wrong thought (`miss_record`)."""

    lo, hi = parse_events_range(events)
    exs = eval_stories(task, rendering, "direct", split, n, seed, (lo, hi), questions, chat, tok)
    names = exs[0].state_names
    ans = torch.tensor([thought_word_id(tok, s) for s in names])
    ok, t_ok, t_n, p_exact, top_ok, follows = [], 0, 0, 0, 0, 0
    by_ev: dict[int, list] = defaultdict(lambda: [0, 0])
    for i in range(0, len(exs), batch_size):
        chunk = exs[i: i + batch_size]
        labs = [e.labels(tok, e.prompt) for e in chunk]
        lengths = [len(lb.input_ids) for lb in labs]
        ids = torch.full((len(chunk), max(lengths)), tok.pad_token_id, dtype=torch.long)
        for b, lb in enumerate(labs):
            ids[b, : lengths[b]] = torch.as_tensor(lb.input_ids)
        if _cached_inference(model):  # chunk by chunk on a KV cache: O(length) per story
            runs = []
            for lb in labs:
                runs.append(model.cached_states(lb.input_ids.tolist()))
                if progress:
                    progress(1)
            thoughts = [t for _, t in runs]
            last = torch.stack([lg[ans.to(lg.device)] for lg, _ in runs]).argmax(-1)  # [batch]
            top = torch.stack([lg.argmax() for lg, _ in runs])  # [batch] top token of the vocabulary
        else:  # batched, one recompute per chunk index: faster for a small backbone
            ids = ids.to(_device_of(model))
            mask = (ids != tok.pad_token_id).long()
            add, thoughts = model.self_states(ids, lengths)
            logits, _ = model.backbone_forward(ids, mask, add)
            rows, ends = torch.arange(len(chunk), device=ids.device), torch.tensor(lengths, device=ids.device) - 1
            last = logits[rows, ends][:, ans.to(ids.device)].argmax(-1)  # [batch]
            top = logits[rows, ends].argmax(-1)  # [batch]
            if progress:
                progress(len(chunk))
        for b, ex in enumerate(chunk):
            good = names[int(last[b])] == ex.answer
            ok.append(good)
            top_ok += int(int(top[b]) == int(ans[names.index(ex.answer)]))
            said = [thought_state(ex, list(z), ans.tolist()) for _, z in thoughts[b]]
            said = [s for s in said if s >= 0]
            follows += int(bool(said) and said[-1] == int(last[b]))
            by_ev[ex.n_events][0] += int(good)
            by_ev[ex.n_events][1] += 1
            right, golds, prev = [], [], None
            for end, z in thoughts[b]:
                gold = gold_thought(ex, tok, labs[b], end, model.thinking_config, prev)
                k = max(1, len(gold) - 1)  # the state's words (or the bare <eos> of an empty thought)
                right.append(z[:k] == gold[:k])
                golds.append(gold[:k])
                prev = state_words(ex, labs[b], end)
            t_ok, t_n, p_exact = t_ok + sum(right), t_n + len(right), p_exact + int(all(right))
            if misses is not None and not (good and all(right)):
                misses.append(miss_record(tok, ex, labs[b].input_ids, thoughts[b], golds, right, names[int(last[b])]))
    return {"answer_accuracy": sum(ok) / len(ok), "answer_top1": top_ok / len(ok),
            "answer_follows_thought": follows / len(ok), "thought_accuracy": t_ok / max(1, t_n),
            "thought_exact": p_exact / len(ok), "thoughts": t_n, "n": len(exs), "task": task, "events": f"{lo}-{hi}",
            "seed": seed, **story_split(rendering, split), "questions": questions, "chat": chat,
            "answer_accuracy_by_events": {str(k): round(v[0] / v[1], 4) for k, v in sorted(by_ev.items())}}


def miss_record(tok, ex, ids, thoughts, golds, right, answer: str) -> dict:
    """One story a Thinking States model got wrong: its prompt, the true and the given answer, and each
    chunk's text with the gold and the model's thought (decoded), ``ok`` per chunk."""
    ids, start, chunks = list(ids), 0, []
    for (end, z), gold, ok in zip(thoughts, golds, right):
        chunks.append({"text": tok.decode(ids[start:end]), "gold": tok.decode(gold),
                       "got": tok.decode(list(z)[:len(gold)]), "ok": bool(ok)})
        start = end
    return {"id": ex.meta.get("id"), "prompt": ex.prompt, "truth": ex.answer, "answer": answer, "chunks": chunks}


def _cached_inference(model) -> bool:
    """Evaluate chunk by chunk on a KV cache (ThinkingStates.cached_states) rather than by batched recompute: for
    backbones above 20M parameters, where recomputing the story per chunk costs more than the calls."""
    return sum(p.numel() for p in model.backbone.parameters()) > 20e6


BANDS = ("1-8", "9-16", "17-32", "33-64")


def evaluate_bands(model, tok, task: str = "coinflip", n: int = 500, fmt: str = "direct",
                   bands=None, seed: int = 12345, rendering: str = "toy") -> dict:
    """`evaluate` (or `evaluate_thinking`) on each band of event counts (None: the task's own bands)."""
    bands = bands or getattr(get_task(task), "bands", BANDS)
    return {band: evaluate(model, task, band, n, seed, tokenizer=tok, formats=(fmt,), rendering=rendering)
            for band in bands}
