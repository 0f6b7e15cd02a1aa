"""Shipped text for fitting lenses when the user brings none: the toy stories, the shipped record sets and
general English prose found offline.

No general-text corpus installs offline from PyPI here (the candidates fetch their text from the web at
run time), so the general English is the prose of the Python standard library's own documentation strings
(paragraphs of at least 20 words, code examples left out): technical English, written by people, on this
machine already. A natural-English model gets it mixed with the shipped records (entity tracking, object
locations, city facts, free-form coin stories) and natural coin-flip stories; a toy-grammar model gets toy
coin-flip stories (its word-level tokenizer reads nothing else).

>>> texts = shipped_texts("natural", 12, seed=0)
>>> len(texts), all(isinstance(t, str) and t for t in texts)
(12, True)
>>> shipped_texts("toy", 2, seed=0)[0].startswith("A coin is")
True
"""

from __future__ import annotations

import importlib
import json
import os
import random
import re

from . import get_task

DATA = os.path.join(os.path.dirname(__file__), "data")
RECORD_FILES = ("tracking.jsonl", "locations.jsonl", "cities.jsonl")  # shipped records: their "text" field
PROSE_MODULES = ("argparse", "logging", "unittest", "collections", "decimal", "difflib", "email.message", "textwrap",
                 "statistics", "fractions", "json", "csv", "pathlib", "subprocess", "threading", "asyncio.tasks",
                 "functools", "itertools", "http.cookiejar", "zipfile", "tarfile", "shutil", "sqlite3", "random")


def prose_paragraphs(min_words: int = 20) -> list[str]:
    """English paragraphs from the standard library's docstrings (`PROSE_MODULES`), code examples left out."""
    out, seen = [], set()
    for name in PROSE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a build without it (sqlite3)
            continue
        docs = [module.__doc__ or ""] + [getattr(v, "__doc__", "") or "" for k, v in sorted(vars(module).items())
                                         if not k.startswith("_") and callable(v)]
        for doc in docs:
            for para in re.split(r"\n\s*\n", doc):
                text = " ".join(para.split())
                letters = sum(c.isalpha() or c.isspace() for c in text)
                if (len(text.split()) >= min_words and ">>>" not in text and letters > 0.9 * len(text)
                        and text not in seen):
                    seen.add(text)
                    out.append(text)
    return out


def record_texts() -> list[str]:
    """The "text" of every shipped record (entity tracking, locations, cities)."""
    out = []
    for f in RECORD_FILES:
        with open(os.path.join(DATA, f)) as fh:
            out += [json.loads(line)["text"] for line in fh if line.strip()]
    return out


def shipped_texts(rendering: str, n: int, seed: int = 0) -> list[str]:
    """`n` texts for a model of `rendering` ("toy" or "natural"): see the module doc for what they are. Natural
    texts are half prose, half stories and records, shuffled with `seed`."""

    if rendering not in ("toy", "natural"):
        raise ValueError(f"rendering {rendering!r} is unknown: use 'toy' or 'natural'")
    if n < 1:
        raise ValueError(f"n must be at least 1 text, got {n}")
    stories = get_task("coinflip", rendering=rendering, fmt="direct", split="all").examples(n, seed, (1, 8))
    if rendering == "toy":
        return [ex.prompt for ex in stories]
    rng = random.Random(seed)
    prose, records = prose_paragraphs(), record_texts() + [ex.prompt for ex in stories]
    rng.shuffle(prose)
    rng.shuffle(records)
    half = min(len(prose), n // 2)
    texts = prose[:half] + records[: n - half]
    rng.shuffle(texts)
    return texts
