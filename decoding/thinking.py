"""Thinking States inference, chunk by chunk, on `cache.KVCache` (what the model really runs).

For each chunk of the prompt, the backbone appends the chunk to the context cache with S_i added
at the input of block ``l_in`` (``blocks.{l_in}.hook_resid_pre``); when the chunk is
complete, the Thinking block T reads its ``blocks.{l_out}.hook_resid_post`` states in its own
`KVCache`, writes the thought tokens there tagged ``THOUGHT`` (`models.thinking.THOUGHT`, a `cache.Tag`),
and the span is rolled back (dropped, kept in ``thought_cache.recorder.rejected`` for study). C turns the thought
into S_{i+1}.
The backbone's context only ever holds the input and the answer.

>>> from beliefscope.models import load_model
>>> model, tok = load_model("thinking")
>>> run = run_thinking(model, tok("A coin is heads . Alice flips . State ?")["input_ids"], max_new_tokens=1)
>>> [(tok.decode(z)) for _, z in run.thoughts], tok.decode(run.tokens)
(['heads <eos>', 'tails <eos>'], 'tails')
>>> run.cache.seq_len, run.thought_cache.seq_len   # the context holds the prompt; thoughts were dropped
(10, 0)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..cache import KVCache
from ..models.thinking.chunked import ChunkedThinking, ThoughtDecode
from ..models.thinking.config import THOUGHT
from ..models.thinking.drafter import ThoughtDrafter
from ..models.thinking.prefill import SpeculativePrefill
from . import engine
from .config import PREFILL_K


@dataclass
class ThinkingRun:
    """What one chunk-by-chunk run produced."""

    prompt_len: int  # tokens in the prompt
    tokens: list[int]  # generated tokens (the answer)
    thoughts: list[tuple[int, list[int]]]  # (chunk end position, thought tokens) per complete chunk
    logits: torch.Tensor  # [positions, vocab] backbone logits at every prompt and generated position
    states: list[torch.Tensor] = field(default_factory=list)  # S_{i+1} per thought, each [d_model]
    cache: KVCache | None = None  # the backbone's context cache (chunks and answer only)
    thought_cache: KVCache | None = None  # T's cache: thoughts written then rolled back (see .rejected)
    chunk_steps: list[tuple[int, int]] = field(default_factory=list)  # (start, end) of each chunk forward
    spec_steps: list[tuple[int, int, int]] = field(default_factory=list)  # speculative prefill: (start,
    #   drafted end, kept end) of each drafting forward
    spec_thoughts: list[list[tuple[int, list[int]]]] = field(default_factory=list)  # per drafting forward:
    #   (chunk end, thought T wrote) for every drafted chunk, kept or rolled back
    spec_drafts: list[list[list[int]]] = field(default_factory=list)  # per drafting forward: the thought
    #   drafted for every chunk (models.thinking.drafter); a draft is cut at the first one T contradicts


def _check_room(model, n_total: int) -> None:
    limit = model.backbone.config.max_position_embeddings
    if n_total > limit:
        raise ValueError(f"the prompt and answer need {n_total} positions but the model addresses {limit}; "
                         f"shorten the prompt or lower max_new_tokens")


@torch.no_grad()
def _chunk_forward(model, ids: list[int], cache: KVCache, S: torch.Tensor | None):
    """Append `ids` to the context with S added at L_in; return (logits [n, V], h_out [n, d]).
    It runs the plain backbone (`ThinkingStates.backbone_forward`, two PyTorch hooks), not the
    TransformerBridge: the bridge's per-component wrappers were 65% of a toy run's time, and
    nothing here needs its hook points (capture activations by calling the model itself)."""
    dev = next(model.backbone.parameters()).device
    x = torch.tensor([ids], device=dev)  # [1, n]
    add = None if S is None else S.to(dev).expand(1, len(ids), -1)  # [1, n, d]
    logits, h = model.backbone_forward(x, None, add, past_key_values=cache)
    return logits[0], h[0]


@torch.no_grad()
def think_cached(model, h: torch.Tensor, tcache: KVCache) -> list[int]:
    """T writes one thought after a chunk (chunk states ``h [c, d]``) in its own cache, greedily;
    the thought span is tagged THOUGHT, then the cache is rolled back to empty."""
    with tcache.tentative(keep_dropped=True):  # the thought span ends in recorder.rejected (keep_thoughts)
        hidden = model.T(inputs_embeds=h[None], past_key_values=tcache).last_hidden_state  # [1, c, d]
        with tcache.recorder.tagging(THOUGHT):
            return engine.run(ThoughtDecode(model, hidden, tcache)).thought


@torch.no_grad()
def run_thinking(model, prompt_ids, max_new_tokens: int = 8, intervene=None, keep_thoughts: bool = True,
                 stop_at_eos: bool = True, prefill: str = "chunked", k: int = PREFILL_K,
                 thought_drafter: ThoughtDrafter | None = None) -> ThinkingRun:
    """Run a Thinking States model chunk by chunk on KV caches and decode greedily.

    ``intervene(j, S) -> S`` may replace the state added to chunk j (the causal check).
    ``keep_thoughts`` keeps the dropped thought spans in ``thought_cache.recorder.rejected`` (and, with
    speculative prefill, the rolled-back chunks in ``cache.recorder.rejected``).

    ``prefill="speculative"`` (the paper's speculative prefill) drafts up to ``k`` complete chunks
    in one backbone forward. The paper gives them all the current S, as if every thought before
    them were empty; here ``thought_drafter`` (`models.thinking.drafter`; a fresh one by default,
    which learns from the story's own thoughts) drafts each chunk's thought, and the next chunk
    gets the S that thought gives. T reads all of them in one batched call; the chunks up to and
    including the first thought T writes differently from its draft are kept (their S was right),
    the rest is rolled back, and the run goes on from there. The thoughts and the answer are those
    of ``prefill="chunked"``; ``run.spec_steps`` holds ``(start, drafted_end, kept_end)`` of every
    drafting forward, ``run.spec_drafts`` the drafted thoughts."""
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("the prompt is empty: give at least one token")
    if prefill not in ("chunked", "speculative"):
        raise ValueError(f"prefill={prefill!r} is unknown: use 'chunked' or 'speculative'")
    if prefill == "speculative" and (k < 1 or intervene is not None):
        raise ValueError(f"speculative prefill needs k >= 1 (got {k}) and no intervene (the chunks of one draft "
                         "share one S): use prefill='chunked' to intervene")
    _check_room(model, len(ids) + max_new_tokens)
    cache = KVCache.for_model(model.backbone, capacity=len(ids) + max_new_tokens + 1,
                              keep_rejected=keep_thoughts and prefill == "speculative")
    tcache = KVCache.for_model(model.T, capacity=64, keep_rejected=keep_thoughts)
    run = ThinkingRun(prompt_len=len(ids), tokens=[], thoughts=[], logits=torch.empty(0), cache=cache,
                      thought_cache=tcache)
    logits_all, S, j = [], None, 0

    def after_chunk(h, end, z=None):
        nonlocal S, j
        z = think_cached(model, h, tcache) if z is None else z
        if model.carries(z):  # an empty thought: S stays (zeros before the first state)
            s = S if S is not None else torch.zeros(model.out_proj.weight.shape[0], device=h.device)
        else:
            s = model.state_from_thoughts([z])[0]
        run.thoughts.append((end, z))
        run.states.append(s)
        j += 1
        S = s if intervene is None else intervene(j, s)

    spans = model.spans(ids)
    if prefill == "speculative":
        drafter = thought_drafter if thought_drafter is not None else ThoughtDrafter(model.eos_id)

        def after(draft, out, last):  # one drafting forward kept up to chunk last[0] of its group
            g, m = draft.groups[0], last[0]
            a0, e1, end = g[0][0], g[-1][1], g[m][1]
            logits_all.append(out.logits[0, : end - a0])
            run.spec_steps.append((a0, e1, end))
            run.spec_thoughts.append([(e, z) for (_, e), z in zip(g, out.written[0], strict=True)])
            run.spec_drafts.append(draft.thoughts[0])
            run.chunk_steps.append((a0, end))
            for (a, e), z in zip(g[: m + 1], out.written[0][: m + 1], strict=True):
                after_chunk(out.h[0, a - a0: e - a0], e, z)

        policy = engine.run(SpeculativePrefill(model, [ids], [[(a, e) for a, e, c in spans if c]], k, cache,
                                               drafter, lambda b: S, after))
        spans = [sp for sp in spans if sp[0] >= policy.end()]

    def forward(step):  # one story: its chunk (or answer token) with the current S, every position's logits kept
        logits, h = _chunk_forward(model, step.x[0, : step.lens[0]].tolist(), cache, S)
        if step.prefill:
            start = cache.seq_len - step.lens[0]
            run.chunk_steps.append((start, cache.seq_len))
        logits_all.append(logits)
        return {0: logits[step.need[0]]} if step.need else {}, h[None]

    def completed(states, rows, ends):
        for h, end in zip(states, ends, strict=True):
            after_chunk(h, end)

    last = [logits_all[-1][-1]] if logits_all else None  # a speculative prefill that read the prompt's end
    run.tokens = engine.run(ChunkedThinking(model, [ids], max_new_tokens, stop_at_eos, forward, completed, [spans],
                                            last)).tokens[0]
    run.logits = torch.cat(logits_all)
    return run


@dataclass
class ThinkingReadout:
    """At every complete chunk of a story: the thought, and the forced answer after it."""

    ends: list[int]  # chunk end positions (the chunk's last token is ends[k] - 1)
    thoughts: list[list[int]]  # thought tokens written after each chunk
    p_answer: torch.Tensor  # [n_chunks, n_answers] answer distribution of the forced question


@torch.no_grad()
def thinking_readouts(model, story_ids, question_ids, answer_ids: list[int]) -> ThinkingReadout:
    """Run the story chunk by chunk once; after each complete chunk, fork the context cache at
    the chunk's end, append the question (with the state from that chunk's thought), read the
    answer distribution and drop the fork: a forced answer, the way the model itself runs."""
    q = [int(t) for t in question_ids]
    run = run_thinking(model, story_ids, max_new_tokens=0)
    probs = []
    for (end, _), S in zip(run.thoughts, run.states, strict=True):
        with run.cache.fork(at=end) as branch:
            logits, _ = _chunk_forward(model, q, branch, S)
        probs.append(torch.softmax(logits[-1, answer_ids].double(), -1))
    return ThinkingReadout(ends=[e for e, _ in run.thoughts], thoughts=[z for _, z in run.thoughts],
                           p_answer=torch.stack(probs) if probs else torch.empty(0, len(answer_ids)))
