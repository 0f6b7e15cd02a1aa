"""Coin-flip state tracking: "A coin is heads . Alice flips . Bob stays . State ? tails".

Two renderings:
- ``toy``: a word-level grammar for the models trained here. Direct format ends the prompt at
  ``State ?``; chain-of-thought ends it at ``Think :`` and the completion lists the state after
  each event, then ``State ? <answer>``.
- ``natural``: English for pretrained models, with several templates and a pool of names.
  Templates and names are split into a train half and a held-out half. Its chain of thought asks
  the question "step by step" and lists the state after each event, then ``A: <answer>``.

>>> task = CoinFlip(rendering="toy", fmt="direct")
>>> ex = task.example(seed=3, n_events=2)
>>> ex.prompt.endswith("State ?") and ex.completion.strip() in ("heads", "tails")
True
>>> sample_prompts(2, seed=0, events=(1, 3))[0].endswith("State ?")
True
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .base import Event, Example, parse_events_range
from .coinflip_people import PAST_SHARE, event_sentence, opening
from .questions import ask, shift_example

STATES = ("heads", "tails")
WORDINGS = ("basic", "wide", "wider", "widest", "people")  # natural train-split sentence sets (CoinFlipConfig.wordings)
QUESTIONS = ("fixed", "varied")  # how natural prompts ask for the answer (CoinFlipConfig.questions)

TOY_NAMES = ("Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy")

# Natural-language pieces. The first half of each list is for training, the rest is held out.
NATURAL_NAMES = (
    "Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry",
    "Irene", "Jack", "Karen", "Liam", "Maria", "Noah", "Olivia", "Peter",
)
NATURAL_INTROS = (
    "A coin's state is {s}.",
    "A coin starts out {s} up.",
    "There is a coin showing {s}.",
    "A coin lies on the table, {s} up.",
)
NATURAL_FLIPS = (
    "{n} flips the coin.",
    "Then {n} flips it.",
    "{n} turns the coin over.",
    "Next, {n} flips the coin over.",
)
NATURAL_STAYS = (
    "{n} does not flip it.",
    "Then {n} leaves it alone.",
    "{n} looks at the coin but does not flip it.",
    "Next, {n} does not touch the coin.",
)
# Extra training wordings (wordings="wide"): paraphrases in the train split only, sharing no verb
# phrase with the held-out sentences, so that a model which learns what a sentence *does* to the
# coin, rather than which words mark a flip, can be told from one that does not.
NATURAL_INTROS_EXTRA = (
    "At the start, the coin is {s}.",
    "The coin's upper face is {s}.",
    "We begin with the coin on {s}.",
    "Initially the coin reads {s}.",
    "Someone placed the coin {s} side up.",
    "The coin was set down with {s} on top.",
)
NATURAL_FLIPS_EXTRA = (
    "{n} tosses the coin and it lands the other way up.",
    "{n} inverts the coin.",
    "{n} rolls the coin onto its other side.",
    "{n} upends the coin.",
    "The coin is flipped by {n}.",
    "{n} reverses the coin.",
)
NATURAL_STAYS_EXTRA = (
    "{n} keeps the coin as it is.",
    "{n} ignores the coin.",
    "{n} walks past the coin.",
    "{n} leaves the coin where it is.",
    "{n} just watches the coin.",
    "The coin stays as it was while {n} waits.",
)
# Still more training wordings (wordings="wider" = "wide" + these): stays that mention flipping
# or handling the coin and are still no change ("... but ..."), beside flips built the same way, so
# that the words "coin" and "flip" alone do not decide the state. Added after a model trained on
# "wide" misread the held-out "looks at the coin but does not flip it" as a flip in 1 thought of 9;
# they share no verb phrase with the held-out sentences ("looks at", "does not touch", "turns ... over").
NATURAL_FLIPS_MORE = (
    "{n} picks up the coin and puts it back the other way up.",
    "{n} flicks the coin so it lands on its other face.",
    "{n} gives the coin a single flip.",
    "After a pause, {n} flips the coin.",
    "{n} grabs the coin and overturns it.",
    "{n} hesitates, then flips the coin.",
)
NATURAL_STAYS_MORE = (
    "{n} picks up the coin but puts it back the same way up.",
    "{n} thinks about flipping it but decides against it.",
    "{n} glances at the coin without flipping it.",
    "{n} reaches for the coin, then stops.",
    "{n} nods at the coin but never flips it.",
    "Nobody flips the coin while {n} talks.",
)
# The widest training wordings (wordings="widest" = "wider" + these): a model trained on "wider"
# misread the held-out "turns the coin over" as a stay in about 1 use of 10 (and got every other
# held-out sentence right), so these describe a change of face, or none, by its result, with verbs
# that are not in the held-out sentences ("turn", "over", "touch", "looks at"), and pairs that share
# the action and differ only in the outcome ("spins ... opposite side" / "spins ... same side").
NATURAL_FLIPS_MOST = (
    "{n} twists the coin until its other face shows.",
    "{n} spins the coin and it settles on the opposite side.",
    "{n} sets the coin back down upside down.",
    "{n} changes which side of the coin faces up.",
    "{n} knocks the coin and it lands on its other side.",
    "{n} swaps the coin's face.",
)
NATURAL_STAYS_MOST = (
    "{n} spins the coin and it settles on the same side.",
    "{n} knocks the coin but it stays the same way up.",
    "{n} lifts the coin and sets it down unchanged.",
    "{n} counts to ten and lets the coin be.",
    "{n} draws a picture of the coin.",
    "{n} wants to flip the coin but does not.",
)
# The broadest training wordings (wordings="people" = "widest" + these): a model trained on "widest" read
# the opening "<Face> is facing up." as the other face and "<name> skips her turn." as a flip, and
# people write stories with openings that name the face as the subject or the face that is down, and
# turns that are passed. These cover those kinds ({S}: the face capitalised, {o}: the other face),
# without the misread sentences themselves.
NATURAL_INTROS_PEOPLE = (
    "{S} faces up on the coin.",
    "The coin is lying with its {o} side down.",
    "The coin is not on {o}.",
    "You can see {s} on the coin.",
    "{S} is up and {o} is down.",
    "Look, the coin shows {s}.",
)
NATURAL_FLIPS_PEOPLE = (
    "{n} takes a turn and flips it.",
    "It is {n}'s go, and {n} flips it.",
    "{n} flips it once.",
    "{n} plays, and the coin changes sides.",
    "This time {n} does flip the coin.",
    "{n} has a go and turns it to the other face.",
)
NATURAL_STAYS_PEOPLE = (
    "{n} passes on the turn.",
    "{n} sits this round out.",
    "It is {n}'s go, but {n} passes.",
    "{n} misses a go.",
    "{n} takes a turn but leaves the coin as it lies.",
    "{n} does nothing to it.",
)
NATURAL_QUESTIONS = (
    "What's the state? A:",
    "Is the coin heads or tails now? A:",
)


@dataclass(frozen=True)
class CoinFlipConfig:
    """How coin-flip stories are rendered."""

    rendering: str = "toy"  # "toy" word-level grammar or "natural" English
    fmt: str = "direct"  # "direct" answer or "cot" (state after each event, then answer)
    split: str = "train"  # natural only: "train" or "heldout" templates and names ("all" mixes)
    p_flip: float = 0.5  # probability that an event is a flip rather than a stay
    wordings: str = "basic"  # natural train split: "basic" sentences, "wide" (+ NATURAL_*_EXTRA intros and
    #   events), "wider" (+ NATURAL_*_MORE events as well), "widest" (+ NATURAL_*_MOST events too) or "people"
    #   (+ NATURAL_*_PEOPLE intros and events)
    questions: str = "fixed"  # natural direct prompts: "fixed" (the story, then one of NATURAL_QUESTIONS, which end
    #   in "A:") or "varied" (a form from tasks.questions.QUESTION_FORMS, after or before the story, cue or none)


class CoinFlip:
    """Generator of labelled coin-flip examples."""

    name = "coinflip"
    state_names = STATES
    train_events = (1, 8)  # event counts of the training stories
    bands = ("1-8", "9-16", "17-32", "33-64")  # event-count bands a model card is evaluated on

    def __init__(self, rendering: str = "toy", fmt: str = "direct", split: str = "train", p_flip=0.5,
                 wordings: str = "basic", questions: str = "fixed"):
        if rendering not in ("toy", "natural"):
            raise ValueError(f"rendering {rendering!r} is unknown: use 'toy' or 'natural'")
        if fmt not in ("direct", "cot"):
            raise ValueError(f"fmt {fmt!r} is unknown: use 'direct' or 'cot'")
        if split not in ("train", "heldout", "all"):
            raise ValueError(f"split {split!r} is unknown: use 'train', 'heldout' or 'all'")
        if wordings not in WORDINGS:
            raise ValueError(f"wordings {wordings!r} is unknown: use one of {WORDINGS} (extra train-split "
                             "paraphrases)")
        if questions not in QUESTIONS:
            raise ValueError(f"questions {questions!r} is unknown: use one of {QUESTIONS}")
        self.cfg = CoinFlipConfig(rendering=rendering, fmt=fmt, split=split, p_flip=p_flip, wordings=wordings,
                                  questions=questions)

    # -- sampling ---------------------------------------------------------------------------
    def example(self, seed: int, n_events: int, toggle: int | None = None) -> Example:
        """One example drawn deterministically from `seed`. ``toggle``: the event (0-based; negative counts
        from the end) whose kind is turned over (a flip becomes a stay and back), the rest of the draw kept:
        the other half of a minimal pair (`analyses.pairs.task_pairs`). In the toy rendering nothing else
        changes; in the natural one, the sentences after it keep their draws but may read differently where
        a flip and a stay pool differ in size."""
        rng = random.Random(f"coinflip/{self.cfg.rendering}/{self.cfg.split}/{seed}/{n_events}")
        initial = rng.randrange(2)
        kinds = ["flip" if rng.random() < self.cfg.p_flip else "stay" for _ in range(n_events)]
        if toggle is not None:
            if not -n_events <= toggle < n_events:
                raise ValueError(f"toggle={toggle} is not an event of a {n_events}-event story: use 0..{n_events - 1} "
                                 "(or -1 for the last)")
            kinds[toggle] = "stay" if kinds[toggle] == "flip" else "flip"
        if self.cfg.rendering == "toy":
            names = [rng.choice(TOY_NAMES) for _ in range(n_events)]
            return self._toy(initial, kinds, names, seed)
        return self._natural(initial, kinds, rng, seed)

    def examples(self, n: int, seed: int, events=(1, 8)) -> list[Example]:
        """`n` examples with event counts drawn uniformly from the inclusive range `events`."""
        lo, hi = parse_events_range(events)
        rng = random.Random(f"coinflip-counts/{seed}")
        return [self.example(seed * 1_000_003 + i, rng.randint(lo, hi)) for i in range(n)]

    # -- renderings -------------------------------------------------------------------------
    def _toy(self, initial: int, kinds: list[str], names: list[str], seed: int) -> Example:
        text = f"A coin is {STATES[initial]} ."
        state, events = initial, []
        for kind, name in zip(kinds, names, strict=True):
            start = len(text) + 1
            text += f" {name} {'flips' if kind == 'flip' else 'stays'} ."
            state ^= int(kind == "flip")
            events.append(Event((start, len(text)), kind, state))
        if self.cfg.fmt == "direct":
            prompt = text + " State ?"
            completion = f" {STATES[state]}"
        else:
            prompt = text + " Think :"
            completion = " " + " ".join(STATES[e.state_after] for e in events) + f" . State ? {STATES[state]}"
        end = len(prompt) + len(completion)
        answer_span = (end - len(STATES[state]), end)
        return Example("coinflip", "toy", self.cfg.fmt, prompt, completion, STATES, initial,
                       tuple(events), answer_span, {"seed": seed, "names": names})

    def _natural(self, initial: int, kinds: list[str], rng: random.Random, seed: int) -> Example:
        names_pool = _half(NATURAL_NAMES, self.cfg.split)
        level = WORDINGS.index(self.cfg.wordings) if self.cfg.split == "train" else 0
        wide, wider, widest, people = level >= 1, level >= 2, level >= 3, level >= 4
        intros = (_half(NATURAL_INTROS, self.cfg.split) + (NATURAL_INTROS_EXTRA if wide else ())
                  + (NATURAL_INTROS_PEOPLE if people else ()))
        intro_i = rng.randrange(len(intros))
        q_i = rng.randrange(len(NATURAL_QUESTIONS))
        s, o = STATES[initial], STATES[1 - initial]
        composed = people and rng.random() < 0.5  # half the "people" stories are composed (tasks.coinflip_people)
        past = composed and rng.random() < PAST_SHARE
        text = opening(rng, s, o, past) if composed else intros[intro_i].format(s=s, S=s.capitalize(), o=o)
        state, events, names = initial, [], []
        for kind in kinds:
            name = rng.choice(names_pool)
            names.append(name)
            if composed:
                start = len(text) + 1
                text += " " + event_sentence(rng, name, kind, past)[0]
                state ^= int(kind == "flip")
                events.append(Event((start, len(text)), kind, state))
                continue
            pool = _half(NATURAL_FLIPS if kind == "flip" else NATURAL_STAYS, self.cfg.split)
            if wide:
                pool = pool + (NATURAL_FLIPS_EXTRA if kind == "flip" else NATURAL_STAYS_EXTRA)
            if wider:
                pool = pool + (NATURAL_FLIPS_MORE if kind == "flip" else NATURAL_STAYS_MORE)
            if widest:
                pool = pool + (NATURAL_FLIPS_MOST if kind == "flip" else NATURAL_STAYS_MOST)
            if people:
                pool = pool + (NATURAL_FLIPS_PEOPLE if kind == "flip" else NATURAL_STAYS_PEOPLE)
            start = len(text) + 1
            text += " " + rng.choice(pool).format(n=name)
            state ^= int(kind == "flip")
            events.append(Event((start, len(text)), kind, state))
        meta = {"seed": seed, "names": names, "intro": intro_i, "question": q_i, "split": self.cfg.split}
        if self.cfg.fmt == "direct" and self.cfg.questions == "varied":  # its own stream: "fixed" stories stay
            qrng = random.Random(f"coinflip-question/{self.cfg.split}/{seed}/{len(kinds)}")
            prompt, shift = ask(text, qrng, self.cfg.split)
            ex = Example("coinflip", "natural", "direct", text, f" {STATES[state]}", STATES, initial, tuple(events),
                         (len(text) + 1, len(text) + 1 + len(STATES[state])),
                         {**meta, "question": prompt.replace(text, "").strip(), "question_first": shift > 0})
            return shift_example(ex, prompt, shift)
        if self.cfg.fmt == "direct":
            prompt = text + " " + NATURAL_QUESTIONS[q_i]
            completion = f" {STATES[state]}"
        else:  # the state after each event in order, then the answer: "... Step by step: tails, heads. A: heads"
            prompt = text + " " + NATURAL_QUESTIONS[q_i].removesuffix(" A:") + " Step by step:"
            completion = " " + ", ".join(STATES[e.state_after] for e in events) + f". A: {STATES[state]}"
        end = len(prompt) + len(completion)
        return Example("coinflip", "natural", self.cfg.fmt, prompt, completion, STATES, initial,
                       tuple(events), (end - len(STATES[state]), end), meta)


def _half(items: tuple, split: str) -> tuple:
    """Train half, held-out half, or everything, of a template or name list."""
    mid = len(items) // 2
    return {"train": items[:mid], "heldout": items[mid:], "all": items}[split]


def replay(ex: Example, done: int, start: int) -> list[int]:
    """The coin's state after each event from ``done`` on, had it been ``start`` after the first
    ``done`` events (the flips and stays stay as they were).

    >>> ex = CoinFlip().example(seed=0, n_events=4)
    >>> replay(ex, 0, ex.initial) == [e.state_after for e in ex.events]
    True
    """
    state, out = start, []
    for e in ex.events[done:]:
        state ^= int(e.kind == "flip")
        out.append(state)
    return out


def toy_vocabulary() -> list[str]:
    """Every word the toy coin-flip grammar can produce (the toy tokenizer's vocabulary)."""
    return ["A", "coin", "is", *STATES, ".", "?", ":", "State", "Think", "flips", "stays", *TOY_NAMES]


def sample_prompts(n: int, seed: int, events=(1, 8), rendering: str = "toy", fmt: str = "direct",
                   split: str = "train") -> list[str]:
    """Prompt strings that end where the model should start answering."""
    return [ex.prompt for ex in CoinFlip(rendering, fmt, split).examples(n, seed, events)]
