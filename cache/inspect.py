"""Read-side of KVCache: per-layer K/V, provenance, snapshots/diffs, overwrite and write hooks."""

from __future__ import annotations

import contextlib
from collections import Counter

import torch

from .provenance import CacheEvent, Provenance, RejectedSpan
from .snapshot import CacheDiff, RowDiff, Snapshot, tick


class _HookHandle:
    def __init__(self, hooks: list, fn):
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


class InspectMixin:
    """Inspection and patching methods of :class:`cache.KVCache` (mixed in; not used alone).

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

    # ------------------------------------------------------------------ provenance
    def provenance_of(self, row: int = 0) -> torch.Tensor:
        """Provenance codes ``[length]`` (int8, compare with :class:`Provenance`) of ``row``.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> tiny_cache().provenance_of(0).shape
            torch.Size([0])
        """
        if self.storage is None:
            return torch.zeros(0, dtype=torch.int8)
        return self.storage.prov[row, self._phys(row)]

    @property
    def provenance(self):
        """Row 0's provenance ``[length]`` for batch 1; a list of them for a batch."""
        rows = [self.provenance_of(r) for r in range(max(1, len(self.layout.lengths)))]
        return rows[0] if len(rows) == 1 else rows

    def mark(self, start: int, end: int, prov: Provenance, row: int | None = None) -> None:
        """Relabel logical positions ``[start, end)`` with ``prov`` (e.g. DRAFT -> VERIFIED).

        Example::

            >>> from beliefscope.cache import Provenance
            >>> from beliefscope.cache.testing import tiny_cache
            >>> tiny_cache().mark(0, 0, Provenance.VERIFIED)
        """
        for r in range(len(self.layout.lengths)) if row is None else [row]:
            if not 0 <= start <= end <= self.layout.lengths[r]:
                raise ValueError(f"mark({start}, {end}) for row {r}: "
                                 f"need 0 <= start <= end <= {self.layout.lengths[r]}.")
            if end > start:
                self.storage.prov[r, self._phys(r, range(start, end))] = int(Provenance(prov))

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> Snapshot:
        """Record lengths and the write clock: O(batch), no tensors.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> tiny_cache().snapshot().lengths
            (0,)
        """
        return Snapshot(cache_id=self.id, lengths=tuple(self.lengths), clock=tick(), step=self._step)

    def diff(self, snap: Snapshot) -> CacheDiff:
        """Positions added, removed or overwritten (incl. rolled back and rewritten) since ``snap``.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> c = tiny_cache()
            >>> c.diff(c.snapshot()).changed
            False
        """
        rows = []
        for r, old in enumerate(snap.lengths):
            new = self.lengths[r]
            common = min(old, new)
            over: tuple[int, ...] = ()
            if common and self.storage is not None:
                stamps = self.storage.stamp[r, self._phys(r, range(common))]
                over = tuple((stamps > snap.clock).nonzero().flatten().tolist())
            rows.append(RowDiff(row=r, added=range(old, max(old, new)), removed=range(new, max(new, old)),
                                overwritten=over))
        return CacheDiff(tuple(rows))

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
            self.storage.stamp[r, idx] = tick()
            if provenance is not None:
                self.storage.prov[r, idx] = int(Provenance(provenance))
            pos = torch.as_tensor(positions).reshape(-1)
            self.events.append(CacheEvent("overwrite", r, int(pos.min()), int(pos.max()) + 1, self._step))

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

    def _copy_span(self, row: int, start: int, end: int) -> RejectedSpan:
        idx = self._phys(row, range(start, end))
        st = self.storage
        return RejectedSpan(
            row=row, start=start, end=end, step=self._step, provenance=st.prov[row, idx].clone(),
            # keys and values: per layer [kv_heads, n, d_head], each on its layer's device
            keys=[st.k[l][row].index_select(1, idx.to(st.k[l].device)) for l in range(self.config.n_layers)],
            values=[st.v[l][row].index_select(1, idx.to(st.v[l].device)) for l in range(self.config.n_layers)],
        )

    # ------------------------------------------------------------------ summary
    def summary(self, last_events: int = 8) -> str:
        """A readable table of rows, provenance counts, memory and the latest events (never printed).

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> "row" in tiny_cache().summary()
            True
        """
        c = self.config
        lines = [f"KVCache #{self.id} model={c.model_name} layers={c.n_layers} kv_heads={c.kv_heads} "
                 f"d_head={c.d_head} capacity={self.capacity} physical_end={self.layout.end} "
                 f"nbytes={self.nbytes:,} forks_sharing={0 if self.storage is None else len(self.storage.holders) - 1}",
                 f"{'row':>4} {'length':>7} {'segments':>9} " + " ".join(f"{p.name:>9}" for p in Provenance)]
        for r in range(len(self.layout.lengths)):
            counts = Counter(self.provenance_of(r).tolist())
            rej = sum(s.end - s.start for s in self.rejected if s.row == r)
            # live positions by provenance; REJECTED counts the rolled-back entries kept in `rejected`
            cells = [rej if p == Provenance.REJECTED else counts.get(int(p), 0) for p in Provenance]
            lines.append(f"{r:>4} {self.layout.lengths[r]:>7} {len(self.layout.segments[r]):>9} "
                         + " ".join(f"{x:>9}" for x in cells))
        lines.append(f"events: {len(self.events)} total" + (", latest:" if self.events else ""))
        for e in self.events[-last_events:]:
            lines.append(f"  step {e.step:>4}  {e.kind:<9} row {e.row}  [{e.start}, {e.end})")
        return "\n".join(lines)
