"""Variables: bind and update a few variables with constants and copies, then ask for one.

A toy program reads ``a = 3 . b = a . a = 5 . c = b . c ?``: each statement is one event. The
state is the value of every variable (``_`` while a variable is unassigned); the answer is the
queried variable's value. Copies make the task more than a lookup of the last constant: the value
of ``c = b`` is whatever ``b`` held at that statement.
"""

from __future__ import annotations

import random

from .base import Event, Example, parse_events_range

VARIABLES = ("a", "b", "c")  # variable names, in the order the full state lists them
VALUES = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9")  # the constants a program assigns
UNSET = "_"  # the value word of a variable that has not been assigned yet
STATE_NAMES = (UNSET, *VALUES)  # class names of a variable's value (index 0: unassigned)


def toy_vocabulary() -> list[str]:
    """Every word the toy variables grammar can produce (also the words a thought uses)."""
    return [*VARIABLES, "=", *STATE_NAMES, ".", "?", ":", "Think", ";"]


class Variables:
    """Generator of labelled variable-binding programs (toy grammar)."""

    name = "variables"
    state_names = STATE_NAMES
    train_events = (1, 10)  # event counts of the training stories
    bands = ("1-10", "10-25", "25-50", "50-100")  # event-count bands a model card is evaluated on
    thought_words = len(VARIABLES)  # a thought lists every variable's value, in VARIABLES order

    def __init__(self, rendering: str = "toy", fmt: str = "direct", split: str = "train", p_copy: float = 0.5):
        if rendering != "toy":
            raise ValueError(f"rendering {rendering!r} is not available for variables: use 'toy'")
        if fmt not in ("direct", "cot"):
            raise ValueError(f"fmt {fmt!r} is unknown: use 'direct' or 'cot'")
        if split not in ("train", "heldout", "all"):
            raise ValueError(f"split {split!r} is unknown: use 'train', 'heldout' or 'all'")
        if not 0 <= p_copy <= 1:
            raise ValueError(f"p_copy={p_copy} is not a probability: use a value in [0, 1]")
        self.rendering, self.fmt, self.split, self.p_copy = rendering, fmt, split, p_copy

    def example(self, seed: int, n_events: int) -> Example:
        """One program of ``n_events`` statements, drawn deterministically from ``seed``."""
        if n_events < 1:
            raise ValueError(f"n_events={n_events}: a program needs at least one statement")
        rng = random.Random(f"variables/{self.split}/{seed}/{n_events}")
        values = dict.fromkeys(VARIABLES, UNSET)
        statements = []
        for _ in range(n_events):
            target = rng.choice(VARIABLES)
            sources = [v for v in VARIABLES if values[v] != UNSET and v != target]
            if sources and rng.random() < self.p_copy:
                src = rng.choice(sources)
                statements.append((target, src, "copy"))
                values[target] = values[src]
            else:
                value = rng.choice(VALUES)
                statements.append((target, value, "set"))
                values[target] = value
        query = rng.choice([v for v in VARIABLES if values[v] != UNSET])
        return render(statements, query, self.fmt, {"seed": seed})

    def examples(self, n: int, seed: int, events=(1, 10)) -> list[Example]:
        """``n`` programs with statement counts drawn uniformly from the inclusive range ``events``."""
        lo, hi = parse_events_range(events)
        rng = random.Random(f"variables-counts/{seed}")
        return [self.example(seed * 1_000_003 + i, rng.randint(lo, hi)) for i in range(n)]


def render(statements: list[tuple[str, str, str]], query: str, fmt: str = "direct", meta=None) -> Example:
    """The `Example` of a program given as ``(target, source, kind)`` statements (kind "set": source
    is a constant; "copy": source is a variable) and the queried variable. Reading a variable that
    is unassigned at that statement, or a name or value outside the grammar, raises `ValueError`
    naming it."""
    values = dict.fromkeys(VARIABLES, UNSET)
    text, events, full = "", [], []
    for i, (target, source, kind) in enumerate(statements):
        _check_name(target, f"statement {i + 1} assigns")
        if kind == "copy":
            _check_name(source, f"statement {i + 1} reads")
            if values[source] == UNSET:
                raise ValueError(f"statement {i + 1} ('{target} = {source} .') reads {source!r}, which is not "
                                 f"assigned yet: assign it first, e.g. '{source} = 3 .'")
            values[target] = values[source]
        elif kind == "set":
            if source not in VALUES:
                raise ValueError(f"statement {i + 1} assigns the value {source!r}, which is not in the grammar: "
                                 f"use one of {', '.join(VALUES)}")
            values[target] = source
        else:
            raise ValueError(f"statement kind {kind!r} is unknown: use 'set' or 'copy'")
        start = len(text) + (1 if text else 0)
        text += ("" if not text else " ") + f"{target} = {source} ."
        full.append(tuple(STATE_NAMES.index(values[v]) for v in VARIABLES))
        events.append((start, len(text), kind))
    _check_name(query, "the question asks for")
    if values[query] == UNSET:
        raise ValueError(f"the question asks for {query!r}, which the program never assigns: ask for one of "
                         f"{[v for v in VARIABLES if values[v] != UNSET]}")
    q = VARIABLES.index(query)
    evs = tuple(Event((a, b), kind, f[q], f) for (a, b, kind), f in zip(events, full, strict=True))
    answer = values[query]
    if fmt == "direct":
        prompt, completion = f"{text} {query} ?", f" {answer}"
    else:
        prompt = f"{text} {query} ? Think :"
        completion = " " + " ; ".join(" ".join(STATE_NAMES[i] for i in f) for f in full) + f" . {answer}"
    end = len(prompt) + len(completion)
    return Example("variables", "toy", fmt, prompt, completion, STATE_NAMES, 0, evs, (end - len(answer), end),
                   {**(meta or {}), "query": query, "statements": list(statements)},
                   initial_values=(0,) * len(VARIABLES))


def replay(ex: Example, done: int, start: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every variable's value index after each statement from ``done`` on, had the values been
    ``start`` after the first ``done`` statements (the statements stay as they were).

    >>> ex = parse_program("a = 3 . b = a . a = 5 . b ?")
    >>> [[STATE_NAMES[v] for v in row] for row in replay(ex, 1, (STATE_NAMES.index("7"), 0, 0))]
    [['7', '7', '_'], ['5', '7', '_']]
    """
    values, out = list(start), []
    for target, source, kind in ex.meta["statements"][done:]:
        t = VARIABLES.index(target)
        values[t] = values[VARIABLES.index(source)] if kind == "copy" else STATE_NAMES.index(source)
        out.append(tuple(values))
    return out


def _check_name(name: str, what: str) -> None:
    if name not in VARIABLES:
        raise ValueError(f"{what} {name!r}, which is not a variable of the grammar: use one of {', '.join(VARIABLES)}")


def parse_program(text: str) -> Example:
    """Parse a toy program such as ``"a = 3 . b = a . b ?"`` into a labelled `Example`.

    >>> parse_program("a = 3 . b = a . a = 5 . b ?").answer
    '3'
    """
    words = text.split()
    statements, i = [], 0
    while len(words) - i >= 4 and words[i + 1] == "=":
        target, source, dot = words[i], words[i + 2], words[i + 3]
        if dot != ".":
            raise ValueError(f"statement at word {i + 1} ('{' '.join(words[i:i + 4])}') must end with ' .'")
        statements.append((target, source, "set" if source in VALUES else "copy"))
        i += 4
    rest = words[i:]
    fmt = "cot" if rest[2:] == ["Think", ":"] else "direct"
    if not statements or len(rest) not in (2, 4) or rest[1] != "?" or (len(rest) == 4 and fmt != "cot"):
        raise ValueError(f"cannot parse the program at word {i + 1} ({' '.join(rest[:4])!r}): write statements "
                         "'x = 3 .' or 'x = y .', then a question 'x ?', e.g. 'a = 3 . b = a . b ?'")
    return render(statements, rest[0], fmt, {"parsed": True})
