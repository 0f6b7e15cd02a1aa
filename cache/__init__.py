"""Inspectable, layer-wise KV cache implementing the transformers ``Cache`` protocol.

Example::

    >>> import torch
    >>> from beliefscope.cache import KVCache, Provenance
    >>> from beliefscope.cache.testing import tiny_gpt2
    >>> bridge = tiny_gpt2()
    >>> cache = KVCache.for_model(bridge)
    >>> _ = bridge(torch.tensor([[1, 2, 3]]), past_key_values=cache, return_type="logits_and_cache")
    >>> with cache.fork() as branch, branch.tagging(Provenance.DRAFT):
    ...     _ = bridge(torch.tensor([[4]]), past_key_values=branch, return_type="logits")
    >>> cache.seq_len
    3
"""

from .config import CacheConfig
from .kv import KVCache
from .layer import KVLayer
from .provenance import CacheEvent, Provenance, RejectedSpan
from .snapshot import CacheDiff, RowDiff, Snapshot

__all__ = [
           "CacheConfig",
           "CacheDiff",
           "CacheEvent",
           "KVCache",
           "KVLayer",
           "Provenance",
           "RejectedSpan",
           "RowDiff",
           "Snapshot",
]
