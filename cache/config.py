"""Configuration of a :class:`cache.KVCache`."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CacheConfig:
    """Shape, storage and bookkeeping options of a :class:`cache.KVCache`.

    Example::

        >>> from beliefscope.cache import CacheConfig, KVCache
        >>> cfg = CacheConfig(n_layers=2, kv_heads=2, d_head=8, batch=1, capacity=16)
        >>> KVCache(cfg).seq_len
        0
    """

    # Number of attention layers of the model; update() with layer_idx >= n_layers raises.
    n_layers: int
    # Number of key/value heads (num_key_value_heads for GQA models); None = taken from the first update.
    kv_heads: int | None = None
    # Size of one head's key/value vector; None = taken from the first update.
    d_head: int | None = None
    # Number of rows (sequences) in the batch; None = taken from the first update.
    batch: int | None = None
    # Initial number of positions preallocated per row (buffers grow geometrically beyond it).
    capacity: int = 256
    # Growth factor of the buffers when full (new_capacity = max(needed, capacity * growth)).
    growth: float = 2.0
    # Expected dtype of keys/values; None = taken from the first update. A mismatch raises.
    dtype: torch.dtype | None = None
    # Expected device of keys/values; None = taken from the first update. A mismatch raises.
    device: torch.device | str | None = None
    # Per layer, the device its keys/values live on (a model split over devices: each layer's buffers sit
    # where the layer computes); None = every layer on `device`.
    layer_devices: tuple | None = None
    # Copy rolled-back entries (keys, values, provenance) into `cache.rejected` before moving the pointer.
    keep_rejected: bool = False
    # Raise if a forward needs a mask (ragged rows / holes) but the caller did not ask for one
    # via cache.attention_mask(n) / cache.forward_kwargs(n). False = trust the caller.
    strict_masks: bool = True
    # Human-readable model name, shown in error messages and summary().
    model_name: str = "?"
    # Per layer: the model's sliding window (a query sees keys fewer than `w` logical positions
    # back), or None for full attention; None = every layer full. The cache keeps every position
    # (it is an inspection cache); masks hide what a window excludes.
    windows: tuple | None = None
