"""Teacher-forced batches for Thinking States: gold thoughts from the task's per-token labels.

The gold thought after a complete chunk is the state at its last token, then <eos>
("tails <eos>"; every variable's value for variables, "3 3 _ <eos>"): the running belief the
model is trained to write down.

>>> from beliefscope.models.tokenizer import toy_tokenizer
>>> from beliefscope.models.thinking import ThinkingConfig
>>> from beliefscope.tasks import get_task
>>> tok = toy_tokenizer()
>>> ex = get_task("coinflip").example(seed=1, n_events=2)
>>> b = make_batch([ex], tok, ThinkingConfig())
>>> [tok.decode(t[: int(n)]) for t, n in zip(b.thought_ids, b.thought_len)] == \\
...     [f"{s} <eos>" for s in [ex.state_names[ex.initial], *ex.states_after_events]]
True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...tasks.variables import VARIABLES
from .config import ThinkingConfig, chunk_spans


@dataclass
class ThinkingBatch:
    """Token ids, LM labels, gold thoughts and the index tensors that route them."""

    ids: torch.Tensor  # [B, T] right-padded token ids (prompt + completion + <eos>)
    mask: torch.Tensor  # [B, T] 1 on real tokens
    labels: torch.Tensor  # [B, T] LM targets: the completion and <eos>, -100 elsewhere
    thought_ids: torch.Tensor  # [N, K] gold thought of every complete chunk, right-padded with <eos>
    thought_len: torch.Tensor  # [N] tokens in each thought
    feed: torch.Tensor  # [B, T] index of the thought whose state is added to this token (-1: none)
    t_row: torch.Tensor  # [N] batch row of each thought's chunk
    t_src: torch.Tensor  # [N, L] T's input: position of a chunk token in its row (-1: not a chunk token)
    t_tok: torch.Tensor  # [N, L] T's input: a thought token id (-1: not a thought token)
    t_is_tok: torch.Tensor  # [N, L] bool, the slot holds a thought token
    t_mask: torch.Tensor  # [N, L] 1 on real slots (left padding)
    t_target: torch.Tensor  # [N, L] thought token predicted at each slot (-100: none)
    spans: list  # per row: chunk_spans of its tokens
    n_prompt: list  # per row: number of prompt tokens


def thought_word_id(tok, word: str) -> int:
    """The one token a thought uses for a state word: the word as it follows a space in running
    text (" heads" for a BPE vocabulary, "heads" for the toy word-level one).

    >>> from beliefscope.models.tokenizer import toy_tokenizer
    >>> tok = toy_tokenizer()
    >>> thought_word_id(tok, "heads") == tok.convert_tokens_to_ids("heads")
    True
    """
    ids = tok(" " + word, add_special_tokens=False)["input_ids"]
    if len(ids) == 1:
        return int(ids[0])
    alone = tok.convert_tokens_to_ids(word)
    if alone is not None and alone != tok.unk_token_id:
        return int(alone)
    raise ValueError(f"the state word {word!r} is {len(ids)} tokens in this tokenizer ({ids}); a thought needs one "
                     "token per state: rename the state or pick a tokenizer that has the word")


def state_words(ex, lab, end: int) -> tuple[str, ...]:
    """The words of the state at token ``end - 1`` (``end`` may run one past the labels, onto the
    final <eos>): every variable's value for a multi-variable task, else the one state word."""
    t = min(end, len(lab.state)) - 1
    if lab.values is not None:
        return tuple(ex.state_names[int(v)] for v in lab.values[t])
    return (ex.state_names[int(lab.state[t])],)


def gold_thought(ex, tok, lab, end: int, cfg: ThinkingConfig, prev: tuple | None) -> list[int]:
    """Gold thought after a chunk ending at token ``end``: the state's words then <eos>; a bare <eos>
    when ``cfg.empty_unchanged`` and the state words are ``prev`` (those before the chunk)."""
    now = state_words(ex, lab, end)
    if cfg.empty_unchanged and prev is not None and now == prev:
        return [tok.eos_token_id]
    return [thought_word_id(tok, w) for w in now] + [tok.eos_token_id]


def thought_state(ex, thought: list[int], words: list[int]) -> int:
    """The state a thought names for ``ex``'s question: the index of its word in ``words`` (the
    state words' ids), read at the queried variable's place for a multi-variable task; -1 when the
    thought names no state there."""
    k = 0
    if ex.initial_values:

        k = VARIABLES.index(ex.meta["query"])
    return words.index(thought[k]) if len(thought) > k and thought[k] in words else -1


def make_batch(examples, tok, cfg: ThinkingConfig, device=None) -> ThinkingBatch:
    """Build a `ThinkingBatch` from task examples (direct format), on ``device`` (None: torch's default)."""
    boundary = tok.convert_tokens_to_ids(cfg.boundary) if cfg.chunking == "events" else None
    rows, labs, spans, thoughts, owner, n_prompt = [], [], [], [], [], []
    for ex in examples:
        lab = ex.labels(tok)
        ids = lab.input_ids.tolist() + [tok.eos_token_id]
        p = len(tok(ex.prompt)["input_ids"])
        n_prompt.append(p)
        rows.append(ids)
        labs.append([-100] * p + ids[p:])
        sp = chunk_spans(ids, cfg, boundary)
        spans.append(sp)
        prev = None
        for j, (a, e, complete) in enumerate(sp):
            if complete:
                thoughts.append(gold_thought(ex, tok, lab, e, cfg, prev))
                owner.append((len(rows) - 1, j, a, e))
                prev = state_words(ex, lab, e)
    B, T = len(rows), max(map(len, rows))
    ids = torch.full((B, T), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    for b, (r, lb) in enumerate(zip(rows, labs, strict=True)):
        ids[b, : len(r)], mask[b, : len(r)], labels[b, : len(lb)] = torch.tensor(r), 1, torch.tensor(lb)
    N, K = len(thoughts), max((len(t) for t in thoughts), default=1)
    thought_ids = torch.full((max(N, 1), K), tok.eos_token_id, dtype=torch.long)
    thought_len = torch.ones(max(N, 1), dtype=torch.long)
    for n, t in enumerate(thoughts):
        thought_ids[n, : len(t)], thought_len[n] = torch.tensor(t), len(t)
    feed = torch.full((B, T), -1, dtype=torch.long)
    by_chunk = {(b, j): n for n, (b, j, _, _) in enumerate(owner)}
    for b, sp in enumerate(spans):
        last = -1  # the thought whose state chunk j receives: the previous one, or with empty thoughts the
        for j, (a, e, _) in enumerate(sp):  # last non-empty one (an empty thought carries S over)
            prev = by_chunk.get((b, j - 1))
            if prev is not None and (not cfg.empty_unchanged or len(thoughts[prev]) > 1):
                last = prev
            if last >= 0:
                feed[b, a:e] = last
    L = max((e - a + len(t) - 1 for (_, _, a, e), t in zip(owner, thoughts, strict=True)), default=1)
    t_src = torch.full((max(N, 1), L), -1, dtype=torch.long)
    t_tok = torch.full((max(N, 1), L), -1, dtype=torch.long)
    t_target = torch.full((max(N, 1), L), -100, dtype=torch.long)
    t_mask = torch.zeros(max(N, 1), L, dtype=torch.long)
    t_row = torch.zeros(max(N, 1), dtype=torch.long)
    for n, ((b, _, a, e), t) in enumerate(zip(owner, thoughts, strict=True)):
        c, k = e - a, len(t)
        off = L - (c + k - 1)  # left padding
        t_row[n] = b
        t_src[n, off: off + c] = torch.arange(a, e)
        t_tok[n, off + c: L] = torch.tensor(t[:-1], dtype=torch.long)
        t_target[n, off + c - 1: L] = torch.tensor(t, dtype=torch.long)
        t_mask[n, off:] = 1
    out = ThinkingBatch(ids=ids, mask=mask, labels=labels, thought_ids=thought_ids, thought_len=thought_len,
                        feed=feed, t_row=t_row, t_src=t_src, t_tok=t_tok, t_is_tok=t_tok >= 0, t_mask=t_mask,
                        t_target=t_target, spans=spans, n_prompt=n_prompt)
    if device is not None:
        for k, v in vars(out).items():
            if torch.is_tensor(v):
                setattr(out, k, v.to(device))
    return out
