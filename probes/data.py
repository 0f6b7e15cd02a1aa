"""Rows of an activation store selected for probing, in (prompt, position) order.

Usage (not run as a doctest: it needs stored activations, probes or a model)::

    data = load_probe_data(ActivationStore.open("acts/target"), "after_first_event", ["hook_embed"])
    data.X.shape
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .controls import position_mask
from .store import ActivationStore


@dataclass
class ProbeData:
    """Selected rows of a store, sorted by (prompt id, position)."""

    hooks: list[str]  # hook names, one per X layer
    X: torch.Tensor  # [L, n, d] float32 activations
    labels: dict  # label name -> [n] int64


def _row_selection(store: ActivationStore, positions: str, label: str = "state"):
    labels = store.load_labels()
    mask = position_mask(labels, positions, label)
    idx = np.nonzero(mask)[0]
    key = labels["prompt_id"][idx] * 1_000_000 + labels["position"][idx]
    perm = np.argsort(key, kind="stable")
    return mask, perm, {k: v[idx][perm] for k, v in labels.items()}


def load_probe_data(store: ActivationStore, positions: str, hooks: list[str], selection=None) -> ProbeData:
    """Activations of `hooks` at the selected positions, shard by shard, in (prompt, position) order."""
    mask, perm, labels = selection or _row_selection(store, positions)
    X = torch.stack([store.load_hook(h, rows=mask)[torch.as_tensor(perm)] for h in hooks])  # [L, n, d]
    return ProbeData(hooks=list(hooks), X=X, labels=labels)
