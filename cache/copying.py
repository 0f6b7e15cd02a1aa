"""Copies of a :class:`cache.KVCache`: ``copy.deepcopy`` and pickling give an independent cache.

A deep copy owns its buffers, lengths, layers and recorder (provenance, events, rejected spans). Only the
filled part is copied: every row is left-aligned into a buffer as long as the longest row (holes
and other forks' slots are not copied), so the copy of a cache that had holes is compacted, with a
``relocate`` event per row, exactly as :meth:`KVCache.compact` would leave it. Write hooks are
shared by reference (functions are not copied). ``copy.copy`` is refused: a shallow copy would
share buffers without the fork bookkeeping; use ``cache.fork()`` for a zero-copy branch.
Pickling stores the same compacted state (write hooks must then be picklable).
"""

from __future__ import annotations

import copy

from .layout import Layout
from .provenance import CacheEvent


def compacted_storage(cache, capacity: int):
    """A new storage holding ``cache``'s live entries, each row left-aligned (O(filled length) copy)."""
    old, lens = cache.storage, cache.layout.lengths
    new = cache._new_storage(max(1, capacity))
    if cache.layout.is_clean:  # every row is slots [0, n): one slice copy per layer
        n = max(lens, default=0)
        for src, dst in ((old.k, new.k), (old.v, new.v)):
            for layer in range(cache.config.n_layers):
                dst[layer][:, :, :n].copy_(src[layer][:, :, :n])
        new.prov[:, :n], new.stamp[:, :n] = old.prov[:, :n], old.stamp[:, :n]
        return new
    for r, n in enumerate(lens):
        if not n:
            continue
        idx = cache.layout.slots(r)  # [n] physical slots of the row's logical positions
        new.prov[r, :n], new.stamp[r, :n] = old.prov[r, idx], old.stamp[r, idx]
        for layer in range(cache.config.n_layers):
            dev_idx = idx.to(old.k[layer].device)
            new.k[layer][r, :, :n] = old.k[layer][r, :, dev_idx]
            new.v[layer][r, :, :n] = old.v[layer][r, :, dev_idx]
    return new


class CopyMixin:
    """``__deepcopy__``, ``__copy__`` and pickling of :class:`cache.KVCache` (mixed in).

    Example::

        >>> import copy, torch
        >>> from beliefscope.cache.testing import tiny_cache
        >>> c = tiny_cache()
        >>> for layer in range(2):
        ...     _ = c.update(torch.ones(1, 2, 4, 8), torch.ones(1, 2, 4, 8), layer)
        >>> d = copy.deepcopy(c)
        >>> d.crop(-1); c.lengths, d.lengths, d.layers[0].get_seq_length()
        ([4], [3], 3)
    """

    def __getstate__(self) -> dict:
        lens = list(self.layout.lengths)
        clean = self.layout.is_clean
        cap = self.config.capacity if self._slotted else max(lens, default=0)  # a slot cache keeps its capacity
        st = None if self.storage is None else compacted_storage(self, cap)
        rec = self.recorder
        if rec is not None:  # the copy's own recorder: its event list (plus the compaction's moves) and tags
            rec = copy.copy(rec)
            rec.events, rec._tags, rec.owner_tags = list(rec.events), list(rec._tags), dict(rec.owner_tags)
            if st is not None and not clean:
                rec.events += [CacheEvent("relocate", r, 0, n, self._step) for r, n in enumerate(lens) if n]
        return {"config": self.config, "storage": st, "lens": lens, "step": self._step, "closed": self._closed,
                "recorder": rec, "hooks": list(self._hooks)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["config"], _storage=state["storage"])
        lens = state["lens"]
        if self._slotted:
            self.layout.rollback(lens)
        else:
            self.layout = Layout.left_aligned(lens)
        self._step, self._closed = state["step"], state["closed"]
        self.recorder = None if state["recorder"] is None else state["recorder"].bind(self)
        self._hooks = state["hooks"]

    def __deepcopy__(self, memo):
        state = self.__getstate__()
        if state["recorder"] is not None:
            state["recorder"].rejected = copy.deepcopy(state["recorder"].rejected, memo)
        state["config"] = copy.copy(state["config"])
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(state)
        return new

    def __copy__(self):
        raise TypeError("copy.copy(KVCache) is refused: a shallow copy would share buffers without the fork "
                        "bookkeeping. Use cache.fork() for a zero-copy branch or copy.deepcopy(cache) for an "
                        "independent cache.")
