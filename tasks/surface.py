"""Surface readings of a text: what a reader gets from the words alone, with no model.

A probe that reads a state is only interesting beyond what the text gives away. For a state named by its
class ("the key is in the den"), the strongest such reading is usually "the class named last so far":
in entity-tracking stories it is right far more often than chance, and a probe for it reads 100% from the
first block. `harvest --data` stores it beside every label as ``<label>_last_named`` (-1 before any class
is named), and `probe` scores it as a baseline (cross-fitted: each named class maps to the label's most
common class on the training folds, so it is a baseline even where names and labels differ).

>>> last_named("The key is in the den. Tom moves it to the hall.", ["den", "hall"], np.array([5, 22, 40, 48]))
array([-1,  0,  0,  1])
"""

from __future__ import annotations

import re

import numpy as np

SUFFIX = "_last_named"  # store column of a label's surface baseline: f"{label}{SUFFIX}"


def surface_column(label: str) -> str:
    """The store column holding `label`'s last-named class."""
    return f"{label}{SUFFIX}"


def last_named(text: str, class_names, token_ends: np.ndarray) -> np.ndarray:
    """``[T]``: for each token (by its end character offset), the index of the class whose name occurs last
    in the text up to that token (whole words, any case, except a one-letter name, matched as written so that
    box "A" is not the article "a"; where two names end at one place, the longer); -1 where none has occurred.

    >>> last_named("Ann put a key in Box B, then in Box A.", ["A", "B"], np.array([9, 23, 38])).tolist()
    [-1, 1, 0]
    """
    hits = []  # (end, length, class)
    for k, name in enumerate(class_names):
        name = str(name).strip()
        if not name:
            continue
        flags = 0 if len(name) == 1 else re.IGNORECASE
        for m in re.finditer(r"(?<!\w)" + re.escape(name) + r"(?!\w)", text, flags=flags):
            hits.append((m.end(), m.end() - m.start(), k))
    if not hits:
        return np.full(len(token_ends), -1, dtype=np.int64)
    hits.sort()
    ends = np.asarray([h[0] for h in hits])  # [H], ascending; for one end, the longest name last
    cls = np.asarray([h[2] for h in hits])
    idx = np.searchsorted(ends, np.asarray(token_ends), side="right") - 1  # [T] last hit ending by each token
    return np.where(idx >= 0, cls[np.maximum(idx, 0)], -1).astype(np.int64)
