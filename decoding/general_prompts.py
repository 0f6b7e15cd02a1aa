"""A workload no one here tuned for: requests about passages of the Python standard library's own
module docstrings (text that installs with Python, written by its authors, not by us).

Passages are the prose paragraphs (150-700 characters) of the docstrings of the modules and of
their top-level classes and functions in ``Lib/*.py``, read with ``ast`` (no module is imported). Modules
are split by a hash of their name into ``store`` (the n-gram store is built from these) and ``bench``
(the benchmark's prompts): the two halves share
no passage and no module. Each prompt asks SmolLM2 to rewrite, explain or continue a passage
(the instruction rotates), in its chat template.

Build the store of this workload (resumable; about 8 minutes on 2 cores)::

    beliefscope datastore --model smollm2 --workload stdlib --n 192 --out checkpoints/smollm2-stdlib-store.json

>>> ps = stdlib_passages("bench")
>>> len(ps) > 100 and all(150 <= len(p.text) <= 700 for p in ps)
True
>>> {p.module for p in ps} & {p.module for p in stdlib_passages("store")}
set()
"""

from __future__ import annotations

import ast
import hashlib
import os
import random
import re
import sysconfig
from dataclasses import dataclass

INSTRUCTIONS = (
    "Rewrite this passage from the Python documentation in plain words, keeping every detail:\n\n",
    "Explain what this passage from the Python documentation says, point by point:\n\n",
    "Continue this passage from the Python documentation with one more paragraph in the same style:\n\n",
)


@dataclass(frozen=True)
class Passage:
    """One paragraph of a standard-library module docstring."""

    module: str  # file name under Lib/, e.g. "textwrap.py"
    index: int  # paragraph number among the module's docstrings (module first, then top-level defs)
    text: str  # the paragraph, whitespace collapsed


def _split_of(module: str) -> str:
    h = hashlib.blake2b(module.encode(), digest_size=2).digest()
    return "store" if h[0] % 2 == 0 else "bench"


def stdlib_passages(split: str, min_chars: int = 150, max_chars: int = 700) -> list[Passage]:
    """Paragraphs of the module docstrings of this Python's ``Lib/*.py`` in ``split`` ("store", "bench" or "all")."""
    if split not in ("store", "bench", "all"):
        raise ValueError(f"split={split!r}: use 'store' (build the n-gram store), 'bench' (the benchmark) or 'all'")
    lib = sysconfig.get_paths()["stdlib"]
    out = []
    for name in sorted(os.listdir(lib)):
        if not name.endswith(".py") or (split != "all" and _split_of(name) != split):
            continue
        try:
            with open(os.path.join(lib, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        nodes = [tree] + [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        paras = [para for n in nodes for para in re.split(r"\n\s*\n", ast.get_docstring(n) or "")]
        for i, para in enumerate(paras):
            text = " ".join(para.split())
            if min_chars <= len(text) <= max_chars and sum(c.isalpha() or c == " " for c in text) >= 0.85 * len(text):
                out.append(Passage(name, i, text))
    return out


def general_chat_prompts(tok, n: int, seed: int = 0, split: str = "bench") -> list[str]:
    """``n`` requests over passages of ``split`` (sampled with ``seed``), in ``tok``'s chat template."""
    passages = stdlib_passages(split)
    if n > len(passages):
        raise ValueError(f"asked for {n} prompts but split {split!r} has {len(passages)} passages on this Python")
    picks = random.Random(seed).sample(passages, n)
    out = []
    for i, p in enumerate(picks):
        text = INSTRUCTIONS[i % len(INSTRUCTIONS)] + p.text
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
        out.append(text)
    return out
