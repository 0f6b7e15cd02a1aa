"""Batched Thinking States inference: many stories at once on one ragged `cache.KVCache`.

`decoding.thinking.run_thinking` runs one story chunk by chunk. Here a list of stories goes in,
and every backbone forward, every T call and every C call serves all of them:

- step j feeds chunk j of every story that has one in one ``[B, width]`` forward (shorter chunks
  padded; each row is then rolled back to its own length, so the pads become holes the cache's
  mask hides, and each row keeps its own positions);
- T reads the chunks completed at step j in one batched call (`ThinkingStates.think`), and C
  compresses the non-empty thoughts in one call; an empty thought leaves the row's S as it was;
- the answer is decoded the same way, one ``[B, 1]`` forward per token, and a chunk completed by
  decoding gets its thought as in the one-story run.

- with ``prefill="speculative"`` each forward drafts up to k complete chunks of every story
  (`models.thinking.drafter` drafts their thoughts, one drafter for the batch), T reads them all in
  one call, and each story keeps its chunks up to its first mis-drafted thought.

A story's thoughts and answer are those it gets alone (``tests/test_thinking_batch.py``: stories
of 1 to 32 events in one batch, chunked or speculative). Calls per story fall from about five per chunk to five per
chunk index divided by the batch, which is what makes batches fast on a small model.

>>> from beliefscope.models import load_model
>>> model, tok = load_model("thinking")
>>> stories = ["A coin is heads . Alice flips . State ?", "A coin is tails . Bob stays . Eve flips . State ?"]
>>> out = run_thinking_batch(model, [tok(s)["input_ids"] for s in stories], max_new_tokens=1)
>>> [tok.decode(t) for t in out.tokens]
['tails', 'heads']
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache import KVCache
from ..models.thinking.chunked import ChunkedThinking
from ..models.thinking.drafter import ThoughtDrafter
from ..models.thinking.prefill import SpeculativePrefill, forward_rows, pad_id
from . import engine
from .config import PREFILL_K
from .thinking import _check_room


@dataclass
class BatchThinkingRun:
    """What one batched run produced, per story in input order."""

    tokens: list[list[int]]  # generated tokens (the answer) per story
    thoughts: list[list[tuple[int, list[int]]]]  # per story: (chunk end, thought tokens) per complete chunk
    backbone_forwards: int  # [B, width] backbone forwards (prefill steps + decode steps)
    think_calls: int  # batched T calls
    cache: KVCache  # the backbone's ragged context cache (prompts and answers)


@torch.no_grad()
def run_thinking_batch(model, prompts, max_new_tokens: int = 1, stop_at_eos: bool = True, prefill: str = "chunked",
                       k: int = PREFILL_K, thought_drafter: ThoughtDrafter | None = None) -> BatchThinkingRun:
    """Run Thinking States over every prompt (lists of token ids) together; see the module doc.

    ``prefill="speculative"``: each forward drafts up to ``k`` complete chunks of every story, each
    chunk with the S its predecessors' drafted thoughts give (``thought_drafter``, one for the whole
    batch, a fresh one by default); T reads every drafted chunk of every story in one call, and each
    story keeps its chunks up to and including the first thought T writes differently from its draft
    (as `decoding.thinking.run_thinking` does for one story). Thoughts and answers are unchanged."""
    if prefill not in ("chunked", "speculative"):
        raise ValueError(f"prefill={prefill!r} is unknown: use 'chunked' or 'speculative'")
    if prefill == "speculative" and k < 1:
        raise ValueError(f"speculative prefill needs k >= 1 (got {k})")
    prompts = [[int(t) for t in p] for p in prompts]
    if not prompts or any(not p for p in prompts):
        raise ValueError(f"give at least one non-empty prompt (got {len(prompts)} prompts, "
                         f"{sum(not p for p in prompts)} empty)")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1 (the answer is at least one token)")
    for p in prompts:
        _check_room(model, len(p) + max_new_tokens)
    n, d = len(prompts), model.out_proj.weight.shape[0]
    dev = next(model.backbone.parameters()).device
    spans = [model.spans(p) for p in prompts]
    widths = [max(s[j][1] - s[j][0] for s in spans if j < len(s)) for j in range(max(len(s) for s in spans))]
    cache = KVCache.for_model(model.backbone, batch=n, capacity=sum(widths) + max_new_tokens + 1)
    state = _States(model, n, d, dev)
    last = [None] * n  # logits [V] at each story's last prompt token
    forwards = 0
    if prefill == "speculative":
        drafter = thought_drafter if thought_drafter is not None else ThoughtDrafter(model.eos_id)

        def keep(draft):  # logits at the last drafted token of every story whose prompt it ends
            return sorted({draft.lens[b] - 1 for b, g in enumerate(draft.groups) if g and g[-1][1] == len(prompts[b])})

        def after(draft, out, kept):  # thoughts and states of every kept chunk (C once), prompt ends' logits
            done = [(b, g[i][1], out.written[b][i]) for b, g in enumerate(draft.groups) for i in range(kept[b] + 1)]
            for b, g in enumerate(draft.groups):
                if g and g[-1][1] == len(prompts[b]) and kept[b] == len(g) - 1:
                    last[b] = out.logits_at(b, draft.lens[b] - 1)
            state.think_written([z for _, _, z in done], [b for b, _, _ in done], [e for _, e, _ in done])

        policy = engine.run(SpeculativePrefill(model, prompts, [[(a, e) for a, e, c in s if c] for s in spans], k,
                                               cache, drafter, lambda b: state.S[b], after, keep=keep))
        forwards = state.calls = policy.forwards  # one T call per drafting forward
        spans = [[sp for sp in s if not sp[2]] for s in spans]  # what is left: each story's incomplete chunk
    else:
        spans = None  # every chunk is left for the chunked policy

    def forward(step):  # one [B, w] forward; only the logits the step needs are kept
        nonlocal forwards
        keep = sorted(set(step.need.values()))
        logits, h = forward_rows(model, cache, step.x.to(dev), state.S, step.lens, keep=keep)
        forwards += 1
        return {b: logits[b, keep.index(p)] for b, p in step.need.items()}, h

    policy = engine.run(ChunkedThinking(model, prompts, max_new_tokens, stop_at_eos, forward, state.think, spans, last,
                                        pad=pad_id(model), cache=cache))
    return BatchThinkingRun(tokens=policy.tokens, thoughts=state.thoughts, backbone_forwards=forwards,
                            think_calls=state.calls, cache=cache)


class _States:
    """Every story's current S ``[B, d]`` and thoughts; T and C batched over the stories given."""

    def __init__(self, model, n: int, d: int, dev):
        self.model, self.S, self.calls = model, torch.zeros(n, d, device=dev), 0
        self.thoughts: list[list[tuple[int, list[int]]]] = [[] for _ in range(n)]

    def think(self, chunk_states: list[torch.Tensor], rows: list[int], ends: list[int]) -> None:
        if not rows:
            return
        zs = self.model.think(chunk_states)  # T once for every chunk completed at this step
        self.calls += 1
        self.think_written(zs, rows, ends)

    def think_written(self, zs: list[list[int]], rows: list[int], ends: list[int]) -> None:
        """Record thoughts T has written (row ``rows[i]``'s chunk ending at ``ends[i]``, in reading order)."""
        said = [i for i, z in enumerate(zs) if not self.model.carries(z)]  # an empty thought keeps S
        if said:
            S = self.model.state_from_thoughts([zs[i] for i in said])  # C once: [len(said), d]
            for k, i in enumerate(said):
                self.S[rows[i]] = S[k]
        for b, e, z in zip(rows, ends, zs, strict=True):
            self.thoughts[b].append((e, z))
