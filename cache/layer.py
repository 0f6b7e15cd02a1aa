"""KVLayer: one layer's view of a :class:`cache.KVCache`, the ``CacheLayerMixin`` HF attention talks to."""

from __future__ import annotations

import weakref
from typing import Protocol

from transformers.cache_utils import CacheLayerMixin


class LayerOwner(Protocol):
    """What a layer reads from the cache that owns it (``cache.KVCache``, which imports this module)."""

    storage: object  # .k[layer] / .v[layer]: [batch, kv_heads, capacity, d_head] buffers; None before the first write
    layout: object  # .end: physical positions in use

    def _update(self, key_states, value_states, layer: int): ...

    def get_seq_length(self) -> int: ...


class KVLayer(CacheLayerMixin):
    """One layer's view of a :class:`KVCache` (the ``CacheLayerMixin`` HF attention talks to).

    Example::

        >>> from beliefscope.cache.testing import tiny_cache
        >>> c = tiny_cache()   # layers hold a weak reference: keep the cache alive
        >>> c.layers[0].get_seq_length()
        0
    """

    is_compileable = False
    is_croppable = True  # the cache crops (every layer at once); a crop of one layer alone is refused
    is_sliding = False

    def __init__(self, owner: LayerOwner, idx: int):
        self._owner = weakref.ref(owner)
        self.idx = idx

    @property
    def keys(self):  # [batch, kv_heads, physical_len, d_head] view, or None before the first write
        o = self._owner()
        return None if o.storage is None else o.storage.k[self.idx][:, :, : o.layout.end]

    @keys.setter
    def keys(self, value) -> None:
        self._refuse("assigning layer.keys", "cache.update(...) or cache.overwrite(layer, positions, k, v)")

    @property
    def values(self):  # [batch, kv_heads, physical_len, d_head] view, or None before the first write
        o = self._owner()
        return None if o.storage is None else o.storage.v[self.idx][:, :, : o.layout.end]

    @values.setter
    def values(self, value) -> None:
        self._refuse("assigning layer.values", "cache.update(...) or cache.overwrite(layer, positions, k, v)")

    @property
    def is_initialized(self) -> bool:
        return self._owner().storage is not None

    def lazy_initialization(self, key_states, value_states) -> None:  # buffers are made by the owner
        return None

    def update(self, key_states, value_states, *args, **kwargs):
        return self._owner()._update(key_states, value_states, self.idx)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._owner().get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self._owner().get_seq_length()

    def get_max_length(self) -> int:
        return -1

    # Every layer of a KVCache shares one length per row, one row order and one storage, so an
    # operation on one layer alone cannot hold: it is refused, naming the cache-level call that
    # does what transformers' base `Cache` does when it applies the same operation to every layer.
    def _refuse(self, what: str, instead: str):
        raise ValueError(f"{what} on KVCache layer {self.idx} alone is refused: the layers of a KVCache share one "
                         f"length per row and one row order; use {instead}, which acts on every layer.")

    def crop(self, tokens_to_remove: int) -> None:
        self._refuse(f"layer.crop({tokens_to_remove})", f"cache.crop({tokens_to_remove})")

    def reset(self) -> None:
        self._refuse("layer.reset()", "cache.reset()")

    def reorder_cache(self, beam_idx) -> None:
        self._refuse("layer.reorder_cache(...)", "cache.reorder_cache(beam_idx)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse("layer.batch_repeat_interleave(...)", f"cache.batch_repeat_interleave({repeats})")

    def batch_select_indices(self, indices) -> None:
        self._refuse("layer.batch_select_indices(...)", "cache.batch_select_indices(indices)")

    def offload(self) -> None:
        self._refuse("layer.offload()", "a cache built on the device you want (KVCache.for_model(model))")

    def prefetch(self) -> None:
        self._refuse("layer.prefetch()", "a cache built on the device you want (KVCache.for_model(model))")
