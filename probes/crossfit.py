"""Read each text with a probe that was not fitted on it.

`beliefscope probe --out DIR` on a store of records saves, beside the final probe (fitted on every training
record), the probe of each cross-validation fold and which fold held each text out (``crossfit.json``, texts
keyed by `tasks.score_checks.text_key`). `forced` then reads a record the probe was trained on with the fold
probe that did not see it (out-of-fold), and any other text with the final probe (held out). Reading the
training records with the final probe is what made an in-sample 0.74 look like a finding where the same probe
read 0.39 out-of-fold.

Usage (not run as a doctest: it needs a probe folder)::

    cf = CrossFitted.load("probes/")
    probe, scored_on = cf.for_text("The key is in the den.")
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from beliefscope.base.files import atomic_write_json

from ..tasks.score_checks import example_key, text_key
from .linear import LinearProbe

FILE = "crossfit.json"  # in a probe folder: {"folds": k, "text_fold": {text key: fold that held it out}}


@dataclass
class CrossFitted:
    """A final probe, its fold probes, and which fold held out each training text."""

    final: LinearProbe  # fitted on every training record: reads texts it never saw
    folds: list  # [LinearProbe] fold k's probe, fitted without the texts of fold k
    text_fold: dict  # text key -> index of the fold that held that text out

    def for_text(self, text: str) -> tuple[LinearProbe, str]:
        """(the probe to read `text` with, "out-of-fold" or "held-out")."""
        return self.for_key(text_key(text))

    def for_example(self, ex) -> tuple[LinearProbe, str]:
        """(the probe to read an `Example` with: a record by its text, a task story by its events)."""
        return self.for_key(example_key(ex))

    def for_key(self, key: str) -> tuple[LinearProbe, str]:
        k = self.text_fold.get(key)
        return (self.final, "held-out") if k is None else (self.folds[k], "out-of-fold")

    @classmethod
    def load(cls, folder: str, final: LinearProbe | None = None) -> CrossFitted | None:
        """The folder's cross-fitted probes, or None where `probe --out` saved none (a store of a built-in task)."""
        path = os.path.join(folder, FILE)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            meta = json.load(f)
        folds = [LinearProbe.load(os.path.join(folder, f"fold{k}")) for k in range(meta["folds"])]
        return cls(final=final or LinearProbe.load(folder), folds=folds, text_fold=meta["text_fold"])


def save_folds(folder: str, fold_probes: list, text_fold: dict) -> None:
    """Write fold k's probe to ``folder/fold{k}`` and the text -> fold map (atomically, the map last)."""
    for k, p in enumerate(fold_probes):
        p.save(os.path.join(folder, f"fold{k}"))
    atomic_write_json(os.path.join(folder, FILE), {"folds": len(fold_probes), "text_fold": text_fold})
