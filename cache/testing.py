"""A tiny cache for tests and doctests, with no model (tiny models: ``beliefscope.models.testing``)."""

from __future__ import annotations

import torch

from .config import CacheConfig
from .kv import KVCache


def tiny_cache(batch: int = 1, capacity: int = 16):
    """An empty cache shaped for a 2-layer model with 2 KV heads of size 8 (no model needed).

    Example::

        >>> tiny_cache().seq_len
        0
    """
    return KVCache(CacheConfig(n_layers=2, kv_heads=2, d_head=8, batch=batch, capacity=capacity,
                               dtype=torch.float32, device=torch.get_default_device()))
