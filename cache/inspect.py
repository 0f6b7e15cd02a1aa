"""Read and patch side of the KVCache core: per-layer K/V, lengths, ``overwrite`` and write hooks.

Provenance, events and snapshots are the recorder's (recorder.py)."""

from __future__ import annotations

import contextlib

import torch

from .provenance import Provenance, label


class _HookHandle:
    def __init__(self, hooks: list, fn):
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


class InspectMixin:
    """Reading and patching methods of :class:`cache.KVCache` (mixed in; not used alone).

    Example::

        >>> from beliefscope.cache.testing import tiny_cache
        >>> tiny_cache().lengths
        [0]
    """

    # ------------------------------------------------------------------ positions
    def _phys(self, row: int, positions=None) -> torch.Tensor:
        """Physical slots (LongTensor) of logical ``positions`` (default: all) of ``row``."""
        return self.layout.slots(row, positions)

    def _read(self, bufs, layer: int, positions, row):
        if not 0 <= layer < self.config.n_layers:
            raise IndexError(f"layer {layer} out of range: valid layers are 0..{self.config.n_layers - 1}.")
        if self.storage is None:
            raise RuntimeError("the cache is empty: run a forward with past_key_values=cache first.")
        rows = range(len(self.layout.lengths)) if row is None else [row]
        out = []
        for r in rows:
            segs = self.layout.segments[r]
            if positions is None and len(segs) == 1:  # contiguous: a view, no copy
                out.append(bufs[layer][r, :, segs[0][0] : segs[0][1]])
            elif positions is None and not segs:
                out.append(bufs[layer][r, :, :0])
            else:
                out.append(bufs[layer][r].index_select(1, self._phys(r, positions).to(bufs[layer].device)))
        return out[0] if row is not None else torch.stack(out)

    def keys(self, layer: int, positions=None, row: int | None = 0) -> torch.Tensor:
        """Keys ``[kv_heads, n, d_head]`` of ``row`` (``row=None``: ``[batch, kv_heads, n, d_head]``).

        A view when ``positions`` is None and the row is contiguous, else a copy.

        Example::

            >>> import torch
            >>> from beliefscope.cache.testing import tiny_cache
            >>> c = tiny_cache()  # 2 layers, 2 kv heads, d_head 8
            >>> for layer in range(2):
            ...     _ = c.update(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3, 8), layer)
            >>> c.keys(0).shape, c.keys(0, positions=[2]).shape
            (torch.Size([2, 3, 8]), torch.Size([2, 1, 8]))
        """
        return self._read(self.storage.k if self.storage else None, layer, positions, row)

    def values(self, layer: int, positions=None, row: int | None = 0) -> torch.Tensor:
        """Values, same shapes and rules as :meth:`keys`.

        Example::

            >>> import torch
            >>> from beliefscope.cache.testing import tiny_cache
            >>> c = tiny_cache()
            >>> for layer in range(2):
            ...     _ = c.update(torch.ones(1, 2, 2, 8), 2 * torch.ones(1, 2, 2, 8), layer)
            >>> c.values(1)[0, :, 0].tolist()
            [2.0, 2.0]
        """
        return self._read(self.storage.v if self.storage else None, layer, positions, row)

    @property
    def lengths(self) -> list[int]:
        """Per-row logical lengths."""
        return list(self.layout.lengths) or [0]

    @property
    def seq_len(self) -> int:
        """Logical length (the longest row for a ragged batch)."""
        return max(self.layout.lengths, default=0)

    @property
    def capacity(self) -> int:
        """Preallocated positions per row in the (possibly shared) buffers."""
        return 0 if self.storage is None else self.storage.capacity

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers this cache holds (shared with its forks, counted once here)."""
        return 0 if self.storage is None else self.storage.nbytes

    # ------------------------------------------------------------------ overwrite and write hooks
    def overwrite(self, layer: int, positions, k: torch.Tensor, v: torch.Tensor, row: int | None = None,
                  provenance: Provenance | None = None) -> None:
        """Replace committed entries at logical ``positions``; ``k``/``v`` are ``[kv_heads, n, d_head]``
        (one row) or ``[batch, kv_heads, n, d_head]``. Forks sharing those slots keep the old ones.

        Example::

            >>> import torch
            >>> from beliefscope.cache.testing import tiny_cache
            >>> c = tiny_cache()
            >>> for layer in range(2):
            ...     _ = c.update(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3, 8), layer)
            >>> c.overwrite(0, [1], torch.zeros(2, 1, 8), torch.zeros(2, 1, 8))
            >>> c.keys(0)[0, :, 0].tolist()  # head 0, first feature, positions 0..2
            [1.0, 0.0, 1.0]
        """
        rows = list(range(len(self.layout.lengths))) if row is None else [row]
        if provenance is not None and self.recorder is None:
            raise ValueError(f"overwrite(provenance={label(provenance).name}) on a cache built with record=False "
                             "keeps no provenance; build it with record=True or leave provenance out.")
        if k.dim() == 3:
            k, v = k.unsqueeze(0), v.unsqueeze(0)
        self._check(k.expand(self.config.batch, *k.shape[1:]), v.expand(self.config.batch, *v.shape[1:]), layer)
        for i, r in enumerate(rows):
            idx = self._phys(r, positions)
            if self.storage.shared(self, r, idx):
                self._relocate()  # copy-on-write: forks keep the old entries
                idx = self._phys(r, positions)
            dev = self.storage.k[layer].device
            self.storage.k[layer][r, :, idx.to(dev)] = k[min(i, k.shape[0] - 1)]
            self.storage.v[layer][r, :, idx.to(dev)] = v[min(i, v.shape[0] - 1)]
            if self.recorder is not None:
                self.recorder.overwrote(r, idx, positions, provenance)

    def add_write_hook(self, fn) -> _HookHandle:
        """Call ``fn(k, v, *, layer, positions) -> (k, v) | None`` on every write before storing it.

        ``positions`` is ``[batch, n_new]`` (logical). Returns a handle with ``.remove()``.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> h = tiny_cache().add_write_hook(lambda k, v, *, layer, positions: None)
            >>> h.remove()
        """
        self._hooks.append(fn)
        return _HookHandle(self._hooks, fn)

    @contextlib.contextmanager
    def write_hook(self, fn):
        """Scope :meth:`add_write_hook` to a ``with`` block.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> with tiny_cache().write_hook(lambda k, v, *, layer, positions: None):
            ...     pass
        """
        handle = self.add_write_hook(fn)
        try:
            yield self
        finally:
            handle.remove()
