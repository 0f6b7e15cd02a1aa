"""How a person asks for the coin's final face: question wordings, before or after the story,
with or without an ``A:`` cue, and the story inside a chat model's template.

The natural coin-flip task asks one of two fixed questions ending in ``A:`` unless its
``questions`` setting is ``"varied"``; then each story draws a question form from the train or
held-out half of `QUESTION_FORMS` (as for the templates and names), puts it after the story or
before it, and ends the prompt with ``A:`` or not. `in_chat` wraps any example's prompt as a user
turn of a tokenizer's chat template (SmolLM2-Instruct's ChatML), shifting its event spans.

>>> import random
>>> p, shift = ask("Ann flips it.", random.Random(0), "train")
>>> p.startswith("Ann flips it.") == (shift == 0)
True
"""

from __future__ import annotations

import dataclasses
import random

# Question forms: the first half is for training, the second is held out (`_half` in tasks.coinflip).
QUESTION_FORMS = (
    "Which side is up now?",
    "Heads or tails?",
    "What does the coin show?",
    "Which face is showing at the end?",
    "So which way up is the coin?",
    "What side of the coin faces up now?",
    "Tell me, heads or tails?",
    "Which face of the coin is on top?",
    "After all that, what is the coin showing?",
    "Is the coin on heads or on tails?",
    "Which side does the coin end on?",
    "What face is the coin left on?",
    "Which side was up at the end?",
    "So what did the coin show in the end?",
    # held out
    "What is the coin's face now?",
    "Which side landed up in the end?",
    "Now, heads or tails?",
    "What's showing on the coin?",
    "Which face ends up on top?",
    "Is it heads or tails at the end?",
    "What side is facing up?",
    "Where does the coin end up, heads or tails?",
    "What would I see if I looked at the coin now?",
    "Which way up is the coin finally?",
    "Does the coin show heads or tails?",
    "What's the coin showing now?",
    "What was the coin showing by then?",
    "Heads or tails, in the end?",
)
QUESTION_AFTER = 0.7  # share of varied prompts that ask after the story (the rest ask before it)
ANSWER_CUE = " A:"  # the answer cue of the fixed questions; varied prompts end with it half the time
CUE_SHARE = 0.5


def ask(story: str, rng: random.Random, split: str) -> tuple[str, int]:
    """A varied-question prompt for ``story`` and the offset of the story inside it."""
    mid = len(QUESTION_FORMS) // 2
    pool = {"train": QUESTION_FORMS[:mid], "heldout": QUESTION_FORMS[mid:], "all": QUESTION_FORMS}[split]
    question = rng.choice(pool)
    cue = ANSWER_CUE if rng.random() < CUE_SHARE else ""
    if rng.random() < QUESTION_AFTER:
        return f"{story} {question}{cue}", 0
    return f"{question} {story}{cue}", len(question) + 1


def shift_example(ex, prompt: str, shift: int):
    """``ex`` with ``prompt`` as its prompt, the story now starting at character ``shift``: every
    event span and the answer span move with it."""
    events = tuple(dataclasses.replace(e, span=(e.span[0] + shift, e.span[1] + shift)) for e in ex.events)
    end = len(prompt) + len(ex.completion)
    width = ex.answer_span[1] - ex.answer_span[0]
    return dataclasses.replace(ex, prompt=prompt, events=events, answer_span=(end - width, end))


def chat_text(tok, user: str) -> str:
    """``user`` as the one user turn of ``tok``'s chat template, ready for the assistant's reply."""
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"tokenizer {getattr(tok, 'name_or_path', '?')!r} has no chat template: ask without "
                         "--chat (plain text)")
    return tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)


def in_chat(ex, tok):
    """``ex`` with its prompt as a user turn of ``tok``'s chat template (the reply is the completion)."""
    text = chat_text(tok, ex.prompt)
    shift = text.index(ex.prompt)
    return shift_example(ex, text, shift)
