"""Cups: a ball under one of three cups, with swaps of two cups (S3 permutation tracking).

Three-way labels show that nothing in the toolkit is coin-specific. ``parity`` is the parity of
the permutation applied so far (each swap flips it).

>>> ex = Cups(rendering="toy").example(seed=1, n_events=3)
>>> ex.prompt.endswith("Where ?") and ex.answer in CUPS
True
"""

from __future__ import annotations

import random

from .base import Event, Example, parse_events_range

CUPS = ("left", "middle", "right")
TOY_NAMES = ("Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy")
NATURAL_NAMES = ("Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry")


class Cups:
    """Generator of labelled three-cup examples (toy grammar or natural English)."""

    name = "cups"
    state_names = CUPS
    train_events = (1, 8)  # event counts of the training stories
    bands = ("1-8", "9-16", "17-32", "33-64")  # event-count bands a model card is evaluated on

    def __init__(self, rendering: str = "toy", fmt: str = "direct", split: str = "train", p_swap=0.75):
        if rendering not in ("toy", "natural"):
            raise ValueError(f"rendering {rendering!r} is unknown: use 'toy' or 'natural'")
        if fmt not in ("direct", "cot") or (fmt == "cot" and rendering == "natural"):
            raise ValueError(f"fmt {fmt!r} is not available for rendering {rendering!r}: use 'direct'")
        if split not in ("train", "heldout", "all"):
            raise ValueError(f"split {split!r} is unknown: use 'train', 'heldout' or 'all'")
        self.rendering, self.fmt, self.split, self.p_swap = rendering, fmt, split, p_swap

    def example(self, seed: int, n_events: int) -> Example:
        rng = random.Random(f"cups/{self.rendering}/{self.split}/{seed}/{n_events}")
        ball = initial = rng.randrange(3)
        natural = self.rendering == "natural"
        pool = TOY_NAMES if not natural else {
            "train": NATURAL_NAMES[:4], "heldout": NATURAL_NAMES[4:], "all": NATURAL_NAMES}[self.split]
        text = (f"A ball is under the {CUPS[ball]} cup." if natural else f"A ball is under {CUPS[ball]} .")
        events, names, moves = [], [], []
        for _ in range(n_events):
            name = rng.choice(pool)
            names.append(name)
            start = len(text) + 1
            if rng.random() < self.p_swap:
                a, b = sorted(rng.sample(range(3), 2))
                text += (f" {name} swaps the {CUPS[a]} and {CUPS[b]} cups." if natural
                         else f" {name} swaps {CUPS[a]} {CUPS[b]} .")
                ball = b if ball == a else a if ball == b else ball
                events.append(Event((start, len(text)), "swap", ball))
                moves.append((a, b))
            else:
                text += f" {name} does not touch the cups." if natural else f" {name} stays ."
                events.append(Event((start, len(text)), "stay", ball))
                moves.append(None)
        if natural:
            prompt, completion = text + " Where is the ball? A:", f" {CUPS[ball]}"
        elif self.fmt == "direct":
            prompt, completion = text + " Where ?", f" {CUPS[ball]}"
        else:
            prompt = text + " Think :"
            completion = " " + " ".join(CUPS[e.state_after] for e in events) + f" . Where ? {CUPS[ball]}"
        end = len(prompt) + len(completion)
        return Example("cups", self.rendering, self.fmt, prompt, completion, CUPS, initial, tuple(events),
                       (end - len(CUPS[ball]), end), {"seed": seed, "names": names, "moves": moves})

    def examples(self, n: int, seed: int, events=(1, 8)) -> list[Example]:
        lo, hi = parse_events_range(events)
        rng = random.Random(f"cups-counts/{seed}")
        return [self.example(seed * 1_000_003 + i, rng.randint(lo, hi)) for i in range(n)]


def replay(ex: Example, done: int, start: int) -> list[int]:
    """The ball's cup after each event from ``done`` on, had it been under cup ``start`` after the
    first ``done`` events (the swaps, ``ex.meta["moves"]``, stay as they were).

    >>> ex = Cups().example(seed=0, n_events=4)
    >>> replay(ex, 0, ex.initial) == [e.state_after for e in ex.events]
    True
    """
    ball, out = start, []
    for move in ex.meta["moves"][done:]:
        if move is not None:
            a, b = move
            ball = b if ball == a else a if ball == b else ball
        out.append(ball)
    return out


def toy_vocabulary() -> list[str]:
    """Every word the toy cups grammar can produce."""
    return ["A", "ball", "is", "under", *CUPS, ".", "?", ":", "Where", "Think", "swaps", "stays", *TOY_NAMES]


def sample_prompts(n: int, seed: int, events=(1, 8), rendering: str = "toy", fmt: str = "direct",
                   split: str = "train") -> list[str]:
    """Prompt strings that end where the model should start answering."""
    return [ex.prompt for ex in Cups(rendering, fmt, split).examples(n, seed, events)]
