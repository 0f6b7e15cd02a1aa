"""Parse a prompt written by a user back into a labelled `Example`.

Analyses take free text (``--prompt "A coin is heads . Alice flips . State ?"``); the labeller
needs the events and their spans. Anything that does not parse fails with a message that shows
where parsing stopped and what was expected.

>>> ex = parse_prompt("A coin is heads . Alice flips . Bob stays . State ?")
>>> ex.states_after_events, ex.answer
(['tails', 'tails'], 'tails')
>>> parse_prompt("A coin's state is tails. Alice flips the coin. What's the state? A:").answer
'heads'
"""

from __future__ import annotations

import re

from .base import Event, Example
from .coinflip import NATURAL_FLIPS, NATURAL_INTROS, NATURAL_QUESTIONS, NATURAL_STAYS, STATES
from .cups import CUPS
from .variables import parse_program

_NAME = r"(?P<name>[A-Z][a-z]+)"


def _template_regex(template: str) -> str:
    out = re.escape(template)
    out = out.replace(re.escape("{s}"), r"(?P<s>heads|tails)").replace(re.escape("{n}"), _NAME)
    return out


def _fail(text: str, pos: int, expected: str) -> ValueError:
    return ValueError(
        f"cannot parse the prompt at character {pos}: expected {expected}, found {text[pos:pos + 30]!r}. "
        "Write it like the task's examples, e.g. 'A coin is heads . Alice flips . Bob stays . State ?' "
        "or \"A coin's state is heads. Alice flips the coin. What's the state? A:\""
    )


def parse_prompt(text: str, task: str = "coinflip") -> Example:
    """Recover events, spans and states from a coin-flip (or toy cups) prompt."""
    if task == "cups":
        return _parse_toy_cups(text)
    if task == "variables":
        return parse_program(text)
    if task != "coinflip":
        raise ValueError(f"no prompt parser for task {task!r}; use 'coinflip', 'cups' or 'variables'")
    if text.startswith("A coin is "):
        return _parse_toy_coin(text)
    return _parse_natural_coin(text)


def _parse_toy_coin(text: str) -> Example:
    m = re.match(r"A coin is (heads|tails) \.", text)
    if not m:
        raise _fail(text, 0, "'A coin is heads .' or 'A coin is tails .'")
    initial = STATES.index(m.group(1))
    state, pos, events = initial, m.end(), []
    while em := re.match(r" ([A-Z][a-z]+) (flips|stays) \.", text[pos:]):
        kind = "flip" if em.group(2) == "flips" else "stay"
        state ^= int(kind == "flip")
        events.append(Event((pos + 1, pos + em.end()), kind, state))
        pos += em.end()
    rest = text[pos:]
    if rest not in ("", " State ?", " Think :"):
        raise _fail(text, pos, "another event such as ' Bob flips .' or the question ' State ?'")
    if not events:
        raise _fail(text, pos, "at least one event such as ' Alice flips .'")
    fmt = "cot" if rest == " Think :" else "direct"
    prompt = text if rest else text + " State ?"
    end = len(prompt) + 1 + len(STATES[state])
    return Example("coinflip", "toy", fmt, prompt, " " + STATES[state], STATES, initial, tuple(events),
                   (end - len(STATES[state]), end), {"parsed": True})


def _parse_natural_coin(text: str) -> Example:
    intro = None
    for t in NATURAL_INTROS:
        m = re.match(_template_regex(t), text)
        if m:
            intro = m
            break
    if intro is None:
        raise _fail(text, 0, "an opening such as \"A coin's state is heads.\"")
    initial = STATES.index(intro.group("s"))
    state, pos, events = initial, intro.end(), []
    alts = [(t, "flip") for t in NATURAL_FLIPS] + [(t, "stay") for t in NATURAL_STAYS]
    while True:
        for t, kind in alts:
            m = re.match(" " + _template_regex(t), text[pos:])
            if m:
                state ^= int(kind == "flip")
                events.append(Event((pos + 1, pos + m.end()), kind, state))
                pos += m.end()
                break
        else:
            break
    rest = text[pos:].strip()
    if rest and rest not in NATURAL_QUESTIONS:
        raise _fail(text, pos, "an event sentence such as ' Bob flips the coin.' or the question "
                    "\" What's the state? A:\"")
    if not events:
        raise _fail(text, pos, "at least one event sentence such as ' Alice flips the coin.'")
    prompt = text if rest else text + " " + NATURAL_QUESTIONS[0]
    end = len(prompt) + 1 + len(STATES[state])
    return Example("coinflip", "natural", "direct", prompt, " " + STATES[state], STATES, initial, tuple(events),
                   (end - len(STATES[state]), end), {"parsed": True})


def _check_swap(text: str, pos: int) -> None:
    """A swap of a cup that does not exist is named rather than reported as text that does not parse."""
    m = re.match(r" ([A-Z][a-z]+) swaps (\S+) (\S+) \.", text[pos:])
    if not m:
        return
    for g in (2, 3):
        if m.group(g) not in CUPS:
            raise ValueError(f"cup {m.group(g)!r} (character {pos + m.start(g)}) does not exist: the cups are "
                             f"{', '.join(CUPS)}")


def _parse_toy_cups(text: str) -> Example:
    m = re.match(r"A ball is under (left|middle|right) \.", text)
    if not m:
        raise _fail(text, 0, "'A ball is under left .'")
    initial = ball = CUPS.index(m.group(1))
    pos, events, moves = m.end(), [], []
    while True:
        sm = re.match(r" ([A-Z][a-z]+) swaps (left|middle|right) (left|middle|right) \.", text[pos:])
        tm = re.match(r" ([A-Z][a-z]+) stays \.", text[pos:])
        if sm:
            a, b = CUPS.index(sm.group(2)), CUPS.index(sm.group(3))
            if a == b:
                raise ValueError(f"'{sm.group(0).strip()}' swaps the {CUPS[a]} cup with itself: "
                                 "name two different cups")
            ball = b if ball == a else a if ball == b else ball
            events.append(Event((pos + 1, pos + sm.end()), "swap", ball))
            moves.append((a, b))
            pos += sm.end()
        elif tm:
            events.append(Event((pos + 1, pos + tm.end()), "stay", ball))
            moves.append(None)
            pos += tm.end()
        else:
            _check_swap(text, pos)
            break
    rest = text[pos:]
    if rest not in ("", " Where ?") or not events:
        raise _fail(text, pos, "an event such as ' Bob swaps left right .' or the question ' Where ?'")
    prompt = text if rest else text + " Where ?"
    end = len(prompt) + 1 + len(CUPS[ball])
    return Example("cups", "toy", "direct", prompt, " " + CUPS[ball], CUPS, initial, tuple(events),
                   (end - len(CUPS[ball]), end), {"parsed": True, "moves": moves})
