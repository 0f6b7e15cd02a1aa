"""Shared pieces of every state-tracking task: `Example`, `Event`, per-token labels.

An `Example` knows the character span of every event and the state after it. Token labels are
computed for *any* tokenizer from its offset mapping: a token carries the state after every
event whose span ends at or before the token's end.

>>> from beliefscope.tasks.coinflip import CoinFlip
>>> ex = CoinFlip(rendering="toy").example(seed=0, n_events=2)
>>> ex.states_after_events[-1] in ("heads", "tails")
True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Event:
    """One event of a story, e.g. "Alice flips ." in the toy grammar."""

    span: tuple[int, int]  # character span [start, end) of the event in `Example.text`
    kind: str  # event kind, e.g. "flip" / "stay" / "swap"
    state_after: int  # index into `Example.state_names` after this event
    values: tuple[int, ...] = ()  # multi-variable tasks: every variable's value index after this event


@dataclass(frozen=True)
class TokenLabels:
    """Labels for every token of one example under one tokenizer (all arrays have length T)."""

    input_ids: np.ndarray  # [T] int64 token ids
    offsets: np.ndarray  # [T, 2] int64 character span of each token in the text
    state: np.ndarray  # [T] int64 state index after all events completed by this token
    parity: np.ndarray  # [T] int64 state-change parity relative to the start (coin: flips % 2)
    events_so_far: np.ndarray  # [T] int64 events completed by this token
    is_event_boundary: np.ndarray  # [T] bool, token that completes an event
    in_answer: np.ndarray  # [T] bool, token overlaps the final answer span
    in_prompt: np.ndarray  # [T] bool, token lies inside the prompt part of the text
    values: np.ndarray | None = None  # [T, V] int64 every variable's value index (multi-variable tasks; else None)


@dataclass(frozen=True)
class Example:
    """One state-tracking story, with the spans and states needed to label any tokenization."""

    task: str  # task family, e.g. "coinflip"
    rendering: str  # "toy" (word-level grammar) or "natural" (English for pretrained models)
    fmt: str  # "direct" (answer only) or "cot" (state after each event, then the answer)
    prompt: str  # text a model is given; ends where the model should start answering
    completion: str  # the target continuation (includes a leading space for natural text)
    state_names: tuple[str, ...]  # names of the states, e.g. ("heads", "tails")
    initial: int  # index of the initial state
    events: tuple[Event, ...]  # the events, in order
    answer_span: tuple[int, int]  # character span of the final answer word in `text`
    meta: dict = field(default_factory=dict, compare=False)  # template id, names, seed
    initial_values: tuple[int, ...] = ()  # multi-variable tasks: every variable's value index at the start

    @property
    def text(self) -> str:
        return self.prompt + self.completion

    @property
    def n_events(self) -> int:
        return len(self.events)

    @property
    def answer(self) -> str:
        return self.state_names[self.final_state]

    @property
    def final_state(self) -> int:
        return self.events[-1].state_after if self.events else self.initial

    @property
    def states_after_events(self) -> list[str]:
        return [self.state_names[e.state_after] for e in self.events]

    def labels(self, tokenizer, text: str | None = None, add_special_tokens: bool = True) -> TokenLabels:
        """Tokenize `text` (default: the full text) and label every token.

        Works for any fast tokenizer that returns offset mappings (word-level or BPE).
        Special tokens with an empty (0, 0) span, such as a BOS, get the initial state.
        """
        text = self.text if text is None else text
        if not self.text.startswith(text) and not text.startswith(self.prompt):
            raise ValueError(
                "labels(text=...) must be a prefix of the example text or extend its prompt; "
                f"got {text[:60]!r}"
            )
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=add_special_tokens)
        ids = np.asarray(enc["input_ids"], dtype=np.int64)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        return label_offsets(self, ids, offsets)


def label_offsets(ex: Example, ids: np.ndarray, offsets: np.ndarray) -> TokenLabels:
    """Label tokens given their character offsets (the tokenizer-independent core)."""
    ends = offsets[:, 1]  # [T]
    event_ends = np.asarray([e.span[1] for e in ex.events], dtype=np.int64)  # [E]
    # A token has "seen" event j once its end reaches the end of event j's span.
    # Tokens whose span is empty (special tokens) are treated as seeing nothing.
    empty = offsets[:, 0] == offsets[:, 1]
    done = (ends[:, None] >= event_ends[None, :]) & ~empty[:, None]  # [T, E]
    n_done = done.sum(axis=1).astype(np.int64)  # [T]
    state_seq = np.asarray([ex.initial] + [e.state_after for e in ex.events], dtype=np.int64)  # [E+1]
    state = state_seq[n_done]
    changes = np.asarray([0] + [int(e.kind in CHANGING_KINDS) for e in ex.events], dtype=np.int64)
    parity = np.cumsum(changes)[n_done] % 2
    boundary = np.zeros(len(ids), dtype=bool)
    for end in event_ends:
        # the first non-empty token whose end reaches the event end completes the event
        hit = np.nonzero((ends >= end) & ~empty)[0]
        if len(hit):
            boundary[hit[0]] = True
    a0, a1 = ex.answer_span
    in_answer = (offsets[:, 0] < a1) & (offsets[:, 1] > a0) & ~empty
    in_prompt = (offsets[:, 1] <= len(ex.prompt)) | empty
    values = None
    if ex.initial_values:
        seq = np.asarray([ex.initial_values] + [e.values for e in ex.events], dtype=np.int64)  # [E+1, V]
        values = seq[n_done]  # [T, V]
    return TokenLabels(ids, offsets, state, parity, n_done, boundary, in_answer, in_prompt, values)


CHANGING_KINDS = frozenset({"flip", "swap"})


def parse_events_range(spec: str | tuple[int, int]) -> tuple[int, int]:
    """Parse an events range such as "1-8" (or a (lo, hi) pair) and check it.

    >>> parse_events_range("1-8")
    (1, 8)
    """
    if isinstance(spec, tuple | list):
        lo, hi = int(spec[0]), int(spec[1])
    else:
        parts = str(spec).replace(":", "-").split("-")
        if len(parts) == 1 and parts[0].strip().isdigit():
            lo = hi = int(parts[0])
        elif len(parts) == 2 and all(p.strip().isdigit() for p in parts):
            lo, hi = int(parts[0]), int(parts[1])
        else:
            raise ValueError(f"events range {spec!r} is not of the form LO-HI, e.g. 1-8")
    if lo < 1 or hi < lo:
        raise ValueError(
            f"events range {lo}-{hi} is empty or starts below 1: use LO-HI with 1 <= LO <= HI, "
            f"e.g. {max(min(lo, hi), 1)}-{max(lo, hi)}"
        )
    return lo, hi
