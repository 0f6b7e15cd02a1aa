"""Coin stories in free wording, written by hand rather than drawn from templates: the evaluation
set of how a Thinking States model does on the stories and questions a person writes.

``tasks/data/coinflip_free.jsonl`` holds one story per line::

    {"id": "free-001", "initial": "tails", "opening": "Picture a coin with tails showing.",
     "events": [{"sentence": "Maya flips it.", "flip": true}, ...],
     "question": "So, heads or tails?", "question_first": false}

``initial`` and every ``flip`` are annotated by hand; the states follow from them. Each opening and
event sentence ends with its only ``.`` (a chunk of a Thinking States model ends at a period), and
the question has none. `free_examples` turns the lines into `Example` s (direct format, completion
the final face) whose event spans label any tokenizer's tokens.

>>> exs = free_examples()
>>> len(exs) >= 100 and all(ex.text[ex.events[-1].span[0]:ex.events[-1].span[1]].endswith(".") for ex in exs)
True
"""

from __future__ import annotations

import json
import os

from .base import Event, Example
from .coinflip import STATES

KEYS = {"id", "initial", "opening", "events", "question", "question_first"}


def free_path() -> str:
    """The shipped free-wording stories."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "coinflip_free.jsonl")


def _check_sentence(text, where: str) -> None:
    if not isinstance(text, str) or not text.endswith(".") or text.count(".") != 1:
        raise ValueError(f"{where}: {text!r} must be one sentence ending with its only '.' (a chunk ends at each "
                         "period): rewrite it without abbreviations, decimals or ellipses")


def story_example(rec: dict, where: str = "story") -> Example:
    """One hand-written story as an `Example` (its question after or before the story, as written)."""
    if set(rec) != KEYS:
        raise ValueError(f"{where}: keys {sorted(rec)} must be exactly {sorted(KEYS)}")
    if rec["initial"] not in STATES:
        raise ValueError(f"{where}: initial {rec['initial']!r} must be one of {STATES}")
    _check_sentence(rec["opening"], f"{where} opening")
    if not 1 <= len(rec["events"]) <= 64:
        raise ValueError(f"{where}: {len(rec['events'])} events; a story has 1 to 64")
    q = rec["question"]
    if "." in q or "?" not in q:
        raise ValueError(f"{where}: question {q!r} must be a question ('?') with no '.'")
    state = initial = STATES.index(rec["initial"])
    text, events = rec["opening"], []
    for j, ev in enumerate(rec["events"]):
        _check_sentence(ev.get("sentence"), f"{where} event {j}")
        if not isinstance(ev.get("flip"), bool):
            raise ValueError(f"{where} event {j}: flip {ev.get('flip')!r} must be true or false")
        start = len(text) + 1
        text += " " + ev["sentence"]
        state ^= int(ev["flip"])
        events.append(Event((start, len(text)), "flip" if ev["flip"] else "stay", state))
    shift = len(q) + 1 if rec["question_first"] else 0
    prompt = f"{q} {text}" if rec["question_first"] else f"{text} {q}"
    events = [Event((a + shift, b + shift), k, s) for (a, b), k, s in ((e.span, e.kind, e.state_after) for e in events)]
    end = len(prompt) + 1 + len(STATES[state])
    return Example("coinflip", "natural", "direct", prompt, f" {STATES[state]}", STATES, initial, tuple(events),
                   (end - len(STATES[state]), end), {"id": rec["id"], "question": q,
                                                     "question_first": rec["question_first"], "split": "free"})


def free_examples(path: str | None = None) -> list[Example]:
    """Every story of ``path`` (default: the shipped set) as an `Example`; a bad line is named."""
    path = path or free_path()
    out, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{i}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where} is not JSON ({e.msg}): fix the line") from None
            ex = story_example(rec, where)
            if rec["id"] in seen:
                raise ValueError(f"{where}: id {rec['id']!r} appears twice: give each story its own id")
            seen.add(rec["id"])
            out.append(ex)
    return out
