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
  (`decoding.thought_drafter` drafts their thoughts, one drafter for the batch), T reads them all in
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
from beliefscope.cache import KVCache
from beliefscope.decoding.thinking import _check_room
from beliefscope.decoding.thought_drafter import ThoughtDrafter


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
                       k: int = 4, thought_drafter: ThoughtDrafter | None = None) -> BatchThinkingRun:
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
        forwards = _speculative_prefill(model, prompts, spans, k, cache, state, last, drafter)
        spans = [[sp for sp in s if not sp[2]] for s in spans]  # what is left: each story's incomplete chunk
    steps = max(len(s) for s in spans)
    widths = [max((s[j][1] - s[j][0] for s in spans if j < len(s)), default=0) for j in range(steps)]
    pad = _pad_id(model)
    cur_h: list[list[torch.Tensor]] = [[] for _ in range(n)]  # L_out states of an incomplete last chunk
    for j in range(steps):
        lens = [s[j][1] - s[j][0] if j < len(s) else 0 for s in spans]
        x = torch.full((n, widths[j]), pad or 0, dtype=torch.long)
        for b, s in enumerate(spans):
            if lens[b]:
                x[b, : lens[b]] = torch.tensor(prompts[b][s[j][0]: s[j][1]])
        ends = [b for b, s in enumerate(spans) if j == len(s) - 1]  # stories whose prompt ends at this step
        logits, h = _step(model, cache, x.to(dev), state.S, lens, keep=sorted({lens[b] - 1 for b in ends}))
        forwards += 1
        for b in ends:
            last[b] = logits[b, sorted({lens[c] - 1 for c in ends}).index(lens[b] - 1)]
        done = [b for b, s in enumerate(spans) if lens[b] and s[j][2]]
        state.think([h[b, : lens[b]] for b in done], done, [spans[b][j][1] for b in done])
        for b, s in enumerate(spans):
            if j == len(s) - 1 and not s[j][2]:
                cur_h[b] = [h[b, : lens[b]]]
    tokens: list[list[int]] = [[] for _ in range(n)]
    seqs = [list(p) for p in prompts]
    starts = [s[-1][0] if s and not s[-1][2] else len(p) for s, p in zip(spans, prompts)]  # incomplete chunk start
    active = list(range(n))
    for i in range(max_new_tokens):
        for b in active:
            nxt = int(last[b].argmax())
            tokens[b].append(nxt)
            seqs[b].append(nxt)
        active = [b for b in active if not (stop_at_eos and tokens[b][-1] == model.eos_id)]
        if not active or i + 1 == max_new_tokens:
            break  # the last token is returned, not fed back
        lens = [1 if b in active else 0 for b in range(n)]
        x = torch.tensor([[seqs[b][-1] if lens[b] else (pad or 0)] for b in range(n)])
        logits, h = _step(model, cache, x.to(dev), state.S, lens, keep=[0])
        forwards += 1
        done = []
        for b in active:
            last[b] = logits[b, 0]
            cur_h[b].append(h[b, :1])
            if model.spans(seqs[b][starts[b]:])[0][2]:  # the chunk in progress just completed
                done.append(b)
        state.think([torch.cat(cur_h[b]) for b in done], done, [len(seqs[b]) for b in done])
        for b in done:
            starts[b], cur_h[b] = len(seqs[b]), []
    return BatchThinkingRun(tokens=tokens, thoughts=state.thoughts, backbone_forwards=forwards,
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


def _step(model, cache: KVCache, x: torch.Tensor, S: torch.Tensor, lens: list[int], keep: list[int]):
    """One ``[B, w]`` forward of ``x`` with each row's S ``[B, d]`` (or each token's, ``[B, w, d]``)
    added at L_in; every row is then rolled back
    to its own ``lens[b]`` new tokens. Returns (logits ``[B, len(keep), V]``, h_out ``[B, w, d]``)."""
    before = cache.lengths
    w = x.shape[1]
    kw = cache.forward_kwargs(w)
    add = S[:, None, :].expand(-1, w, -1) if S.dim() == 2 else S  # [B, w, d]: one S per row, or per token
    logits, h = model.backbone_forward(x, kw["attention_mask"], add, kw["position_ids"],
                                       keep_logits=torch.tensor(keep or [0]), past_key_values=cache)
    cache.rollback([a + k for a, k in zip(before, lens, strict=True)])
    return logits, h


def _pad_id(model) -> int:
    tok = getattr(model, "tokenizer", None)
    return (tok.pad_token_id if tok is not None else 0) or 0


def _speculative_prefill(model, prompts, spans, k, cache, state, last, drafter) -> int:
    """Every story's complete chunks, up to ``k`` drafted per story and forward (see `run_thinking_batch`);
    fills ``state`` (thoughts and S) and ``last`` (for a story whose prompt ends a chunk). Returns the
    number of forwards."""
    n = len(prompts)
    chunks = [[(a, e) for a, e, c in s if c] for s in spans]
    nxt = [0] * n  # each story's next undrafted complete chunk
    key = [None] * n  # each story's drafter state: its last non-empty thought
    forwards = 0
    while any(nxt[b] < len(chunks[b]) for b in range(n)):
        groups = [chunks[b][nxt[b]: nxt[b] + k] for b in range(n)]
        lens = [g[-1][1] - g[0][0] if g else 0 for g in groups]
        x = torch.full((n, max(lens)), _pad_id(model), dtype=torch.long)
        add = torch.zeros(n, max(lens), state.S.shape[1], device=state.S.device)  # [B, w, d] S per token
        drafts: list[list[list[int]]] = []
        for b, g in enumerate(groups):
            drafts.append([])
            s, st = state.S[b], key[b]
            for a, e in g:  # each drafted chunk gets the S its predecessors' drafted thoughts give
                x[b, a - g[0][0]: e - g[0][0]] = torch.tensor(prompts[b][a:e])
                add[b, a - g[0][0]: e - g[0][0]] = s
                z = drafter.predict(st, prompts[b][a:e])
                drafts[b].append(z)
                s = s if model.carries(z) else model.state_from_thoughts([z])[0]
                st = drafter.next_state(st, z, model.carries(z))
        ends = [b for b, g in enumerate(groups) if g and g[-1][1] == len(prompts[b])]  # may keep the prompt's end
        keep = sorted({lens[b] - 1 for b in ends})
        before = cache.lengths
        logits, h = _step(model, cache, x.to(add.device), add, lens, keep=keep)
        forwards += 1
        rows = [(b, i) for b, g in enumerate(groups) for i in range(len(g))]
        zs = model.think([h[b, groups[b][i][0] - groups[b][0][0]: groups[b][i][1] - groups[b][0][0]]
                          for b, i in rows]) if rows else []  # T once for every drafted chunk of every story
        written = {r: list(z) for r, z in zip(rows, zs, strict=True)}
        kept, done = list(before), []
        state.calls += 1
        for b, g in enumerate(groups):
            if not g:
                continue
            m = next((i for i in range(len(g)) if written[(b, i)] != drafts[b][i]), len(g) - 1)
            kept[b] = before[b] + g[m][1] - g[0][0]  # later chunks saw a wrong S: rolled back below
            for i in range(m + 1):
                a, e = g[i]
                z = written[(b, i)]
                drafter.record(key[b], prompts[b][a:e], z)
                key[b] = drafter.next_state(key[b], z, model.carries(z))
                done.append((b, e, z))
            if b in ends and m == len(g) - 1:
                last[b] = logits[b, keep.index(lens[b] - 1)]
            nxt[b] += m + 1
        state.think_written([z for _, _, z in done], [b for b, _, _ in done], [e for _, e, _ in done])  # C once
        cache.rollback(kept)
    return forwards
