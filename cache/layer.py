"""KVLayer: one layer's view of a :class:`cache.KVCache`, the ``CacheLayerMixin`` HF attention talks to."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from transformers.cache_utils import CacheLayerMixin

if TYPE_CHECKING:
    from .kv import KVCache


class KVLayer(CacheLayerMixin):
    """One layer's view of a :class:`KVCache` (the ``CacheLayerMixin`` HF attention talks to).

    Example::

        >>> from beliefscope.cache.testing import tiny_cache
        >>> c = tiny_cache()   # layers hold a weak reference: keep the cache alive
        >>> c.layers[0].get_seq_length()
        0
    """

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, owner: KVCache, idx: int):
        self._owner = weakref.ref(owner)
        self.idx = idx

    @property
    def keys(self):  # [batch, kv_heads, physical_len, d_head] view, or None before the first write
        o = self._owner()
        return None if o._st is None else o._st.k[self.idx][:, :, : o._pend]

    @property
    def values(self):  # [batch, kv_heads, physical_len, d_head] view, or None before the first write
        o = self._owner()
        return None if o._st is None else o._st.v[self.idx][:, :, : o._pend]

    @property
    def is_initialized(self) -> bool:
        return self._owner()._st is not None

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

    def reset(self) -> None:
        self._owner().reset()

    def crop(self, tokens_to_remove: int) -> None:
        self._owner().crop(tokens_to_remove)
