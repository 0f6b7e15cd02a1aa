"""State-tracking prompt families with a label for every token.

>>> task = get_task("coinflip", rendering="toy")
>>> len(task.examples(3, seed=0, events="1-4"))
3
"""

from __future__ import annotations

import difflib

from . import coinflip, cups, variables
from .base import Event, Example, TokenLabels, label_offsets, parse_events_range
from .coinflip import CoinFlip
from .cups import Cups
from .records import DataConfig, example_path, load_data
from .variables import Variables

TASKS = {"coinflip": CoinFlip, "cups": Cups, "variables": Variables}


def get_task(name: str, **kwargs):
    """Build a task family by name (``coinflip``, ``cups`` or ``variables``)."""
    if name not in TASKS:
        close = difflib.get_close_matches(name, TASKS, n=2)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"task {name!r} does not exist; choose one of {sorted(TASKS)}.{hint}")
    return TASKS[name](**kwargs)


def toy_vocabulary() -> list[str]:
    """The union of every toy grammar's words, in a fixed order (shared toy tokenizer)."""

    words: list[str] = []  # new grammars append their words, so the ids of earlier words never move
    for w in coinflip.toy_vocabulary() + cups.toy_vocabulary() + variables.toy_vocabulary():
        if w not in words:
            words.append(w)
    return words


__all__ = [
    "CoinFlip",
    "Cups",
    "DataConfig",
    "Event",
    "Example",
    "TASKS",
    "TokenLabels",
    "Variables",
    "example_path",
    "get_task",
    "label_offsets",
    "load_data",
    "parse_events_range",
    "toy_vocabulary",
]
