"""What keeps a score on a researcher's own records honest, checked before any model runs.

- `join_same_texts`: records that share a text (up to whitespace) or a declared group form one
  cross-validation group, and the same text in a training and a held-out record is refused. Otherwise a
  probe scored on a text it was fitted on reads a story it has seen, and its accuracy is silently too high.
- `require_two_classes`: a label whose records hold one class is refused where it would be scored. Every
  probe, forced answer and verdict would read 100% with nothing to tell apart.
- `look_alike_classes`: class names that differ only in case or spacing ("Hall", "hall "), most often one
  class written two ways, which a probe would have to tell apart; `harvest` names them.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace


def text_key(text: str) -> str:
    """A short key of a text up to whitespace: records (and stories) with one key are one text, wherever
    they come from; probes remember the keys they were fitted on.

    >>> text_key("a  b  ") == text_key("a b")
    True
    """
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:16]


def example_key(ex) -> str:
    """The `text_key` a probe remembers an example by: a record's whole text, or a task story up to the end of its
    last event (so a story harvested with one question format and read with another is one story).

    >>> from beliefscope.tasks.base import Event, Example
    >>> ex = Example(task="t", rendering="toy", fmt="direct", prompt="a b . c ? A:", completion="", state_names=("x",),
    ...              initial=0, events=(Event(span=(0, 5), kind="e", state_after=0),), answer_span=(12, 12), meta={})
    >>> example_key(ex) == text_key("a b .")
    True
    """
    if "text" in ex.meta:
        return text_key(ex.meta["text"])
    return text_key(ex.prompt[: ex.events[-1].span[1]] if ex.events else ex.prompt)


def join_same_texts(records: list, where: str) -> tuple[list, int]:
    """Records that share a text (up to whitespace) or a group end up in one group, the first such record's:
    a fold that held one of them out and trained on another would score a text it had seen. The same text in
    a training and a held-out record is refused for the same reason. Returns the records and how many had a
    text an earlier record already had.

    >>> from beliefscope.tasks.records import Record
    >>> rs, n = join_same_texts([Record("a", "x  y", {}, group="a"), Record("b", "z", {}, group="b"),
    ...                           Record("c", "x y", {}, group="c")], "data")
    >>> [r.group for r in rs], n
    (['a', 'b', 'a'], 1)
    """
    parent = list(range(len(records)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict = {}  # ("text", words) or ("group", name) -> index of the first record with it
    shared = 0
    for i, r in enumerate(records):
        for key in (("text", " ".join(r.text.split())), ("group", r.group)):
            j = first.setdefault(key, i)
            if j == i:
                continue
            if key[0] == "text":
                shared += 1
                if records[j].heldout != r.heldout:
                    train, held = (j, i) if r.heldout else (i, j)
                    raise ValueError(f"{where}: record {train} (id {records[train].id}, training) and record {held} "
                                     f"(id {records[held].id}, held out) have the same text: a held-out score would "
                                     "read a training story; drop one of them or give both the same split")
            a, b = root(i), root(j)
            parent[max(a, b)] = min(a, b)  # the earlier record's group names the joined one
    return [replace(r, group=records[root(i)].group) for i, r in enumerate(records)], shared


def require_two_classes(counts: dict, label: str, where: str) -> None:
    """Refuse ``label`` when ``counts`` (class -> records or events carrying it) holds fewer than two classes.

    >>> require_two_classes({"box": 5, "bag": 0}, "place", "data.jsonl")
    Traceback (most recent call last):
    ...
    ValueError: data.jsonl: every record of label 'place' holds class 'box': ...
    """
    present = [name for name, n in counts.items() if n]
    if len(present) < 2:
        raise ValueError(f"{where}: every record of label {label!r} holds class {(present or ['none'])[0]!r}: a probe "
                         "or a forced answer would score 100% with nothing to tell apart; pass a label whose records "
                         "hold two or more classes (--label, --events-field or --label-field)")


def look_alike_classes(classes: dict) -> list[tuple[str, list[str]]]:
    """``[(label, [names])]``: for each label (``classes``: label -> class names), the class names that are one
    name up to case and spacing.

    >>> look_alike_classes({"room": ["Hall", "den", "hall", "hall "], "negated": ["no", "yes"]})
    [('room', ['Hall', 'hall', 'hall '])]
    """
    found = []
    for label, names in classes.items():
        by_key: dict = {}
        for name in names:
            by_key.setdefault(" ".join(str(name).lower().split()), []).append(name)
        found += [(label, same) for same in by_key.values() if len(same) > 1]
    return found
