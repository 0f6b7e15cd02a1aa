"""Drafters: cheap paths that propose tokens for the target to verify.

One small interface (``decoding.drafter.Drafter``: ``start`` / ``propose`` / ``propose_tree`` /
``sync``) and five implementations, each in one module with its chain and its tree proposal:

- ``ModelDrafter``: a separate draft model sharing the tokenizer (its own KVCache);
- ``EarlyExitDrafter``: the target's first k layers + final norm + unembedding (LayerSkip style),
  writing into the *target's* cache for those layers, so it needs no cache or prefill of its own;
- ``LowPrecisionDrafter``: the target itself in bfloat16 (LLM-42's fast path)
  (these three: ``decoding.model_drafters``);
- ``NGramDrafter``: prompt lookup, no model (``decoding.ngram``);
- ``StoreDrafter``: n-gram tables of the target's past outputs (``decoding.datastore``).

``make_drafter`` builds one from its command-line spelling.

>>> d = NGramDrafter(n=2)
>>> d.propose(torch.tensor([5, 6, 7, 8, 5, 6]), 3, SpecConfig())[0].tolist()
[7, 8, 5]
"""

from __future__ import annotations

import torch  # noqa: F401 (the examples use it)

from ..models.load import load_model, resolve_store
from .config import SpecConfig  # noqa: F401 (the examples use it)
from .datastore import NGramStore, StoreDrafter
from .drafter import Drafter
from .model_drafters import (
    EarlyExitDrafter,
    LowPrecisionDrafter,
    ModelDrafter,
    first_layers,
)
from .ngram import NGramDrafter

__all__ = ["Drafter", "EarlyExitDrafter", "LowPrecisionDrafter", "ModelDrafter", "NGramDrafter", "StoreDrafter",
           "first_layers", "make_drafter"]


def make_drafter(spec: str, target, load=None) -> Drafter | None:
    """Parse ``none``, ``draft:PATH``, ``early-exit:K``, ``ngram:N``, ``store:PATH`` or ``bf16`` into a drafter.

    >>> make_drafter("ngram:3", None).name
    'ngram:3'
    """
    kind, _, arg = spec.partition(":")
    if kind == "none":
        return None
    if kind == "ngram":
        return NGramDrafter(int(arg or 3))
    if kind == "bf16":
        return LowPrecisionDrafter(target)
    if kind == "store":

        return StoreDrafter(NGramStore.load(resolve_store(arg)), name=spec)
    if kind in ("early-exit", "early_exit"):
        if not arg.lstrip("-").isdigit():
            raise ValueError(f"--drafter {spec!r}: give the exit layer, e.g. early-exit:2")
        return EarlyExitDrafter(target, int(arg))
    if kind == "draft":
        if load is None:
            load = load_model
        return ModelDrafter(load(arg or "draft")[0])
    raise ValueError(f"unknown drafter {spec!r}: use none, draft:PATH, early-exit:K, ngram:N, store:PATH or bf16")
