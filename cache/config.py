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

    n_layers: int  # number of attention layers of the model; update() with layer_idx >= n_layers raises
    kv_heads: int | None = None  # key/value heads (num_key_value_heads for GQA models); None: from the first update
    d_head: int | None = None  # size of one head's key/value vector; None: from the first update
    batch: int | None = None  # rows (sequences) in the batch; None: from the first update
    capacity: int = 256  # positions preallocated per row (buffers grow geometrically beyond it)
    growth: float = 2.0  # growth factor of the buffers when full (new capacity = max(needed, capacity * growth))
    dtype: torch.dtype | None = None  # expected dtype of keys/values; None: from the first update (a mismatch raises)
    device: torch.device | str | None = None  # expected device of keys/values; None: from the first update (a
    #   mismatch raises)
    layer_devices: tuple | None = None  # per layer, the device its keys/values live on (a model split over
    #   devices: each layer's buffers sit where the layer computes); None: every layer on `device`
    record: bool = True  # attach a Recorder (cache.recorder): provenance per position, the event log, snapshots;
    #   False: keep none of it (no bookkeeping per forward beyond the layout)
    keep_rejected: bool = False  # copy rolled-back entries (keys, values, provenance) into `cache.recorder.rejected`
    #   before moving the pointer
    strict_masks: bool = True  # raise if a forward needs a mask (ragged rows, holes) but the caller did not ask
    #   for one via cache.attention_mask(n) / cache.forward_kwargs(n); False: trust the caller
    model_name: str = "?"  # human-readable model name, shown in error messages and summary()
    slots: bool = False  # a slot layout (cache.slots): `batch` fixed rows of `capacity` positions, allocated at
    #   once and never grown; each forward runs over the rows its forward_kwargs(n, rows=..., span=...) plan names,
    #   each row written at its own length (the deterministic scheduler's fixed-shape verifies). Needs every shape
    #   field; forks are refused
    windows: tuple | None = None  # per layer: the model's sliding window (a query sees keys fewer than `w`
    #   logical positions back), or None for full attention; None: every layer full. The cache keeps every
    #   position (it is an inspection cache); masks hide what a window excludes
