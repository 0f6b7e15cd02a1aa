"""Thinking States' plain decoding as policies of the engine (`decoding.engine`): `ChunkedThinking`, the
chunked prefill and greedy answer of one story or a batch, and `ThoughtDecode`, T writing one thought
in its own cache.

Each step is one backbone forward. While any story has prompt chunks left, step j feeds chunk j of
every story that has one (``[B, width]``, shorter chunks padded); then each step feeds the last
answer token of every story still decoding (``[B, 1]``). Nothing is drafted, so the verify forward
keeps everything it is given and nothing is rolled back: this is the engine's plain-decoding policy
for a model whose every complete chunk is followed by a thought.

What differs between one story and a batch is handed in, as `prefill.SpeculativePrefill` takes it:

- ``forward(step) -> (logits, h)``: runs ``step.x`` with each story's current S added at L_in and
  returns ``logits[b]`` ``[V]`` for every story ``b`` in ``step.need`` and the L_out states
  ``h [B, w, d]``. One story keeps every position's logits in its run; a batch only those it needs.
- ``completed(states, rows, ends)``: the chunks that ended at this step (L_out states ``[c, d]``,
  story, end position), in story order. T reads them and C sets the next S before the next step.

>>> import torch
>>> class Echo:  # a stand-in: every chunk of 2 tokens is complete, the next token is the last one + 1
...     eos_id = 99
...     def spans(self, ids): return [(a, min(a + 2, len(ids)), a + 2 <= len(ids)) for a in range(0, len(ids), 2)]
>>> def forward(step):
...     logits = {b: torch.nn.functional.one_hot(step.x[b, p] + 1, 100).float() for b, p in step.need.items()}
...     return logits, torch.zeros(*step.x.shape, 1)
>>> seen = []
>>> policy = ChunkedThinking(Echo(), [[1, 2, 3]], 3, True, forward, lambda hs, rows, ends: seen.append(ends))
>>> from beliefscope.decoding import engine
>>> engine.run(policy).tokens, seen  # answer 4, 5, 6; chunks end at 2 (prompt), 4 and 6 (decoding)
([[4, 5, 6]], [[2], [], [4], []])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...cache.keep import Keep


@dataclass
class ChunkStep:
    """One step's proposal: the tokens of one backbone forward."""

    x: torch.Tensor  # [B, w] this forward's tokens, each story right-padded to the widest (host)
    lens: list[int]  # real tokens per story (0: the story sits this step out)
    need: dict[int, int]  # story -> position in x whose logits the step needs (a prompt's end, an answer token)
    prefill: bool  # prompt chunks (else one answer token per story still decoding)


class ChunkedThinking:
    """Chunked prefill, then greedy decoding, of every story (see the module docstring).

    ``spans[b]``: story b's chunks left to prefill, ``(start, end, complete)`` as `ThinkingStates.spans`
    gives them (after a speculative prefill, what it left). ``last[b]``: story b's logits ``[V]`` at its
    last prompt token when that was already read (a speculative prefill that ended the prompt).
    ``max_new_tokens=0`` runs the prompt only."""

    def __init__(self, model, prompts: list[list[int]], max_new_tokens: int, stop_at_eos: bool, forward, completed,
                 spans: list[list[tuple[int, int, bool]]] | None = None, last: list | None = None, pad: int = 0,
                 cache=None):
        n = len(prompts)
        self.cache = cache  # a ragged batch's cache: each row keeps its own real tokens of a step (`keep`)
        self._before: list[int] = []  # the cache's lengths before this step's forward
        self.model, self.prompts, self.forward, self.completed, self.pad = model, prompts, forward, completed, pad
        self.max_new_tokens, self.stop_at_eos = max_new_tokens, stop_at_eos
        self.spans = [model.spans(p) for p in prompts] if spans is None else spans
        self.steps = max((len(s) for s in self.spans), default=0)  # prefill steps
        self.j = 0  # the next prefill step
        self.last = list(last) if last is not None else [None] * n  # logits [V] at each story's last token
        self.tokens: list[list[int]] = [[] for _ in range(n)]  # the answer per story
        self.seqs = [list(p) for p in prompts]  # prompt + answer so far
        # where each story's chunk in progress starts: its incomplete last prompt chunk, else its prompt's end
        self.starts = [s[-1][0] if s and not s[-1][2] else len(p) for s, p in zip(self.spans, prompts)]
        self.cur_h: list[list[torch.Tensor]] = [[] for _ in range(n)]  # L_out states of each chunk in progress
        self.active = list(range(n))  # stories still decoding
        self.rounds = 0  # answer tokens proposed so far (one per story still decoding, per round)
        self.finished = max_new_tokens == 0

    def done(self) -> bool:
        return self.j >= self.steps and self.finished

    def propose(self) -> ChunkStep | None:
        if self.j < self.steps:  # prompt chunk j of every story that has one
            j = self.j
            lens = [s[j][1] - s[j][0] if j < len(s) else 0 for s in self.spans]
            x = torch.full((len(self.prompts), max(lens)), self.pad, dtype=torch.long)  # [B, w]
            for b, s in enumerate(self.spans):
                if lens[b]:
                    x[b, : lens[b]] = torch.tensor(self.prompts[b][s[j][0]: s[j][1]])
            need = {b: lens[b] - 1 for b, s in enumerate(self.spans) if j == len(s) - 1}  # prompts ending here
            return ChunkStep(x, lens, need, prefill=True)
        for b in self.active:  # plain greedy proposes each story's argmax
            nxt = int(self.last[b].argmax())
            self.tokens[b].append(nxt)
            self.seqs[b].append(nxt)
        self.rounds += 1
        self.active = [b for b in self.active if not (self.stop_at_eos and self.tokens[b][-1] == self.model.eos_id)]
        if not self.active or self.rounds == self.max_new_tokens:
            self.finished = True  # the last token is returned, not fed back
            return None
        lens = [1 if b in self.active else 0 for b in range(len(self.prompts))]
        x = torch.tensor([[self.seqs[b][-1] if lens[b] else self.pad] for b in range(len(self.prompts))])  # [B, 1]
        return ChunkStep(x, lens, {b: 0 for b in self.active}, prefill=False)

    def verify(self, step: ChunkStep):
        if self.cache is not None:
            self._before = list(self.cache.lengths)
        return self.forward(step)

    def accept(self, step: ChunkStep, out):
        return out  # nothing was drafted: the forward keeps all it was given

    def keep(self, step: ChunkStep, out) -> Keep | None:
        """Each row keeps its real tokens of the step, not the padding of a ragged batch (None without a cache:
        a forward of one story writes no padding)."""
        if self.cache is None:
            return None
        return Keep([a + n for a, n in zip(self._before, step.lens, strict=True)])

    def commit(self, step: ChunkStep, out) -> None:
        logits, h = out
        for b in step.need:
            self.last[b] = logits[b]
        if step.prefill:
            j, spans = self.j, self.spans
            done = [b for b, s in enumerate(spans) if step.lens[b] and s[j][2]]
            self.completed([h[b, : step.lens[b]] for b in done], done, [spans[b][j][1] for b in done])
            for b, s in enumerate(spans):
                if j == len(s) - 1 and not s[j][2]:
                    self.cur_h[b] = [h[b, : step.lens[b]]]
            self.j += 1
            return
        done = []
        for b in self.active:
            self.cur_h[b].append(h[b, :1])
            if self.model.spans(self.seqs[b][self.starts[b]:])[0][2]:  # the chunk in progress just completed
                done.append(b)
        self.completed([torch.cat(self.cur_h[b]) for b in done], done, [len(self.seqs[b]) for b in done])
        for b in done:
            self.starts[b], self.cur_h[b] = len(self.seqs[b]), []


class ThoughtDecode:
    """T writes one thought greedily in its own cache, one token per forward: plain decoding as a policy of
    the engine. ``hidden [1, n, d]``: T's last hidden states after it read the chunk. The caller tags the
    writes (`config.THOUGHT`) and rolls the thought back once it is read; ``thought`` is what T wrote."""

    def __init__(self, model, hidden: torch.Tensor, cache):
        self.model, self.hidden, self.cache = model, hidden, cache
        self.head = model.backbone.get_output_embeddings()
        self.thought: list[int] = []

    def done(self) -> bool:
        z = self.thought
        return bool(z) and (z[-1] == self.model.eos_id or len(z) == self.model.thinking_config.max_thought)

    def propose(self) -> int | None:
        self.thought.append(int(self.head(self.hidden[0, -1]).argmax()))
        return None if self.done() else self.thought[-1]  # the last token is kept, not fed back

    def verify(self, token: int) -> torch.Tensor:
        emb = self.model.embed(torch.tensor([[token]], device=self.hidden.device))  # [1, 1, d]
        return self.model.T(inputs_embeds=emb, past_key_values=self.cache).last_hidden_state  # [1, 1, d]

    def accept(self, token: int, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def keep(self, token: int, hidden: torch.Tensor) -> None:
        """None: each thought token is kept (the thought is dropped as a whole after the run)."""
        return None

    def commit(self, token: int, hidden: torch.Tensor) -> None:
        self.hidden = hidden
