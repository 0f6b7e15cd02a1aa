"""Inspectable, layer-wise KV cache implementing the transformers ``Cache`` protocol.

A tour, in the order a forward meets the pieces. ``KVCache`` (kv.py) is what a model is handed as
``past_key_values``; ``for_model`` sizes it from a ``CacheConfig`` (config.py) and refuses unknown overrides.
Its K/V tensors live in a ``Storage`` (storage.py): preallocated buffers that a cache and its forks share,
each holder owning its own physical slots. Which slots hold which logical positions of each row is the
``Layout`` (layout.py), a plain object of segments, lengths, the physical end and the write plan, with
``append``, ``rollback``, ``positions`` and ``live_mask``; everything else asks it rather than reading private
fields. A ``SlotLayout`` (slot_layout.py) is the other layout a cache can have (``CacheConfig(slots=True)``):
a fixed grid of rows by capacity, one length per row, each row written at its own length by forwards over some
of the rows, the layout of the deterministic scheduler's fixed-shape caches; slots.py holds those forwards and
the replay mode a recorded forward (a CUDA graph) writes through. HF attention talks to one ``KVLayer`` per
layer (layer.py), which writes through the layout's plan after ``validate.py`` checks shape, dtype and device.
masks.py turns the layout into attention masks and position ids for ragged rows and holes; hf.py is the HF
``Cache`` protocol (``crop``, ``get_seq_length``, beam search's row gathers, and the ``generate`` wrapper that
refuses a decoding mode not tested against HF's cache). inspect.py reads per-layer K/V and patches it
(``overwrite``, write hooks); copying.py makes ``deepcopy`` and pickle give a compacted, independent cache.
That is the core. What happened is the ``Recorder``'s (recorder.py), attached unless
``CacheConfig(record=False)``: ``provenance.py`` labels per position (the cache's own ``Provenance``, and
``Tag``s its owners define), the event log, rejected spans, and snapshot.py's snapshots and diffs. The core
tells it once per forward, rollback, fork or move; it is read as ``cache.recorder``. guard.py reads a model's
shapes through the guard its loader installed (``for_model`` refuses a model without one). testing.py builds a
tiny cache for tests and doctests.

Example::

    >>> import torch
    >>> from beliefscope.cache import KVCache, Provenance
    >>> from beliefscope.models.testing import tiny_gpt2
    >>> bridge = tiny_gpt2()
    >>> cache = KVCache.for_model(bridge)
    >>> _ = bridge(torch.tensor([[1, 2, 3]]), past_key_values=cache, return_type="logits_and_cache")
    >>> with cache.fork() as branch, branch.recorder.tagging(Provenance.DRAFT):
    ...     _ = bridge(torch.tensor([[4]]), past_key_values=branch, return_type="logits")
    >>> cache.seq_len
    3
"""

from .config import CacheConfig
from .guard import UnguardedModelError
from .kv import KVCache
from .layer import KVLayer
from .provenance import CacheEvent, Provenance, RejectedSpan, Tag
from .recorder import Recorder
from .slot_layout import SlotLayout
from .snapshot import CacheDiff, RowDiff, Snapshot

__all__ = [
           "CacheConfig",
           "CacheDiff",
           "CacheEvent",
           "KVCache",
           "KVLayer",
           "Provenance",
           "Recorder",
           "RejectedSpan",
           "RowDiff",
           "SlotLayout",
           "Snapshot",
           "Tag",
           "UnguardedModelError",
]
