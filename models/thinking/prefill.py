"""Thinking States' speculative prefill, one story or a batch, as a policy of the engine (`decoding.engine`).

Each step drafts up to ``k`` complete chunks of every story that has some left. `models.thinking.drafter`
drafts each chunk's thought, and each drafted chunk gets the S its predecessors' drafted thoughts give.
One backbone forward reads every drafted chunk (tagged DRAFT in the context cache), and T reads them all
in one call (verify). A story keeps its chunks up to and including the first one whose thought T writes
differently from its draft (accept: their S was right), relabelled VERIFIED; the rest is rolled back,
and the story goes on from there (commit).

`decoding.thinking.run_thinking` runs one story as a batch of one (every position's logits kept, the
steps recorded in its run); `decoding.thinking_batch.run_thinking_batch` runs many on one ragged cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...cache import KVCache, Provenance
from ...cache.keep import Keep
from .drafter import ThoughtDrafter


@dataclass
class DraftedChunks:
    """One step's proposal: the chunks drafted for every story, and the forward's inputs."""

    groups: list[list[tuple[int, int]]]  # per story: (start, end) of each drafted chunk ([] when it has none left)
    thoughts: list[list[list[int]]]  # per story: the drafted thought of each of its chunks
    x: torch.Tensor  # [B, w] the drafted tokens, each story right-padded to the widest
    add: torch.Tensor | None  # [B, w, d] the S added to each token at L_in (None: no story has an S yet)
    lens: list[int]  # tokens drafted per story
    before: list[int]  # each story's context length before the forward


@dataclass
class Verified:
    """The verify forward's outputs."""

    logits: torch.Tensor  # [B, n, V]: every position (one story), or those of `keep` (a batch)
    h: torch.Tensor  # [B, w, d] L_out states of the drafted tokens
    written: list[list[list[int]]]  # per story: the thought T wrote after each drafted chunk
    keep: list[int]  # a batch: the positions (in x) whose logits were kept ([]: every position)

    def logits_at(self, b: int, position: int) -> torch.Tensor:
        """Story ``b``'s logits ``[V]`` at ``position`` of the drafted tokens."""
        return self.logits[b, self.keep.index(position) if self.keep else position]


class SpeculativePrefill:
    """Drafts, verifies and keeps every story's complete chunks (see the module docstring).

    ``state_of(b)`` is story b's current S (None before its first). After each step,
    ``after(draft, out, last)`` is told what was kept (``last[b]``: the index of story b's last kept
    chunk in ``draft.groups[b]``); it records the thoughts and updates the states before the next
    step drafts. One story's forward keeps every position's logits; a batch's, the positions
    ``keep(draft)`` names."""

    def __init__(self, model, prompts: list[list[int]], chunks: list[list[tuple[int, int]]], k: int,
                 cache: KVCache, drafter: ThoughtDrafter, state_of, after, keep=None):
        self.model, self.prompts, self.chunks, self.k, self.cache = model, prompts, chunks, k, cache
        self.drafter, self.state_of, self.after = drafter, state_of, after
        self.logit_positions = keep  # keep(draft): the positions whose logits a batch's forward keeps
        self.next = [0] * len(prompts)  # each story's next undrafted complete chunk
        self.key = [None] * len(prompts)  # each story's drafter state: its last non-empty thought
        self.forwards = 0  # backbone forwards run

    def done(self) -> bool:
        return all(self.next[b] >= len(c) for b, c in enumerate(self.chunks))

    def propose(self) -> DraftedChunks:
        model, n = self.model, len(self.prompts)
        groups = [c[self.next[b]: self.next[b] + self.k] for b, c in enumerate(self.chunks)]
        lens = [g[-1][1] - g[0][0] if g else 0 for g in groups]
        x = torch.full((n, max(lens)), pad_id(model), dtype=torch.long)  # [B, w]
        spans: list[list[tuple[torch.Tensor | None, int, int]]] = []  # per story: (S, start, end) in x
        thoughts: list[list[list[int]]] = []
        for b, g in enumerate(groups):
            spans.append([])
            thoughts.append([])
            s, st = self.state_of(b), self.key[b]
            for a, e in g:  # each drafted chunk gets the S its predecessors' drafted thoughts give
                x[b, a - g[0][0]: e - g[0][0]] = torch.tensor(self.prompts[b][a:e])
                spans[b].append((s, a - g[0][0], e - g[0][0]))
                z = self.drafter.predict(st, self.prompts[b][a:e])
                thoughts[b].append(z)
                s = s if model.carries(z) else model.state_from_thoughts([z])[0]
                st = self.drafter.next_state(st, z, model.carries(z))
        return DraftedChunks(groups, thoughts, x, _per_token_states(model, spans, x.shape), lens,
                             list(self.cache.lengths))

    def verify(self, draft: DraftedChunks) -> Verified:
        model, cache = self.model, self.cache
        dev = next(model.backbone.parameters()).device
        add = None if draft.add is None else draft.add.to(dev)
        keep: list[int] = []
        with cache.recorder.tagging(Provenance.DRAFT):
            if len(self.prompts) == 1:  # one story: no padding, no mask, every position's logits
                logits, h = model.backbone_forward(draft.x.to(dev), None, add, past_key_values=cache)
            else:
                keep = self.logit_positions(draft)
                logits, h = forward_rows(model, cache, draft.x.to(dev), add, draft.lens, keep)
        self.forwards += 1
        rows = [(b, a - g[0][0], e - g[0][0]) for b, g in enumerate(draft.groups) for a, e in g]
        zs = model.think([h[b, a:e] for b, a, e in rows]) if rows else []  # T once for every drafted chunk
        written: list[list[list[int]]] = [[] for _ in draft.groups]
        for (b, _, _), z in zip(rows, zs, strict=True):
            written[b].append(list(z))
        return Verified(logits, h, written, keep)

    def accept(self, draft: DraftedChunks, out: Verified) -> tuple[list[int], Verified]:
        """Per story, the index of its last kept chunk (the first mis-drafted one; -1: none drafted)."""
        last = [next((i for i, (z, dz) in enumerate(zip(out.written[b], draft.thoughts[b])) if z != dz), len(g) - 1)
                for b, g in enumerate(draft.groups)]
        return last, out

    def keep(self, draft: DraftedChunks, accepted: tuple[list[int], Verified]) -> Keep:
        """Each story keeps its chunks up to its last kept one (later chunks saw a wrong S), labelled VERIFIED."""
        last, _ = accepted
        ends = list(draft.before)
        for b, g in enumerate(draft.groups):
            if g:
                ends[b] = draft.before[b] + g[last[b]][1] - g[0][0]
        return Keep(ends, verified=tuple((b, draft.before[b], ends[b]) for b, g in enumerate(draft.groups) if g))

    def commit(self, draft: DraftedChunks, accepted: tuple[list[int], Verified]) -> None:
        last, out = accepted
        for b, g in enumerate(draft.groups):
            if not g:
                continue
            for i in range(last[b] + 1):
                a, e = g[i]
                z = out.written[b][i]
                self.drafter.record(self.key[b], self.prompts[b][a:e], z)
                self.key[b] = self.drafter.next_state(self.key[b], z, self.model.carries(z))
            self.next[b] += last[b] + 1
        self.after(draft, out, last)

    def end(self, b: int = 0) -> int:
        """Where story ``b``'s kept chunks end (0 before any)."""
        return self.chunks[b][self.next[b] - 1][1] if self.next[b] else 0


def _per_token_states(model, spans, shape) -> torch.Tensor | None:
    """``[B, w, d]`` S per drafted token from each story's ``[(S or None, start, end)]``; None when no
    chunk has one (before the first state nothing is added; adding zeros is the same)."""
    if all(s is None for row in spans for s, _, _ in row):
        return None
    w = model.out_proj.weight
    add = w.new_zeros(shape[0], shape[1], w.shape[0])
    for b, row in enumerate(spans):
        for s, a, e in row:
            if s is not None:
                add[b, a:e] = s
    return add


def forward_rows(model, cache: KVCache, x: torch.Tensor, S: torch.Tensor, lens: list[int], keep: list[int]):
    """One ``[B, w]`` backbone forward of ``x`` with each row's S ``[B, d]`` (or each token's, ``[B, w, d]``)
    added at L_in. Every row writes ``w`` positions; the engine then keeps each row's own ``lens[b]`` new tokens,
    or fewer (the policy's `Keep`: the padding becomes holes the cache's mask hides). Returns (logits
    ``[B, len(keep), V]``, h_out ``[B, w, d]``)."""
    w = x.shape[1]
    kw = cache.forward_kwargs(w)
    add = S[:, None, :].expand(-1, w, -1) if S.dim() == 2 else S  # [B, w, d]: one S per row, or per token
    return model.backbone_forward(x, kw["attention_mask"], add, kw["position_ids"],
                                  keep_logits=torch.tensor(keep or [0]), past_key_values=cache)


def pad_id(model) -> int:
    """The filler of a row shorter than its batch: the tokenizer's pad id, else 0."""
    tok = getattr(model, "tokenizer", None)
    return (tok.pad_token_id if tok is not None else 0) or 0
