"""Shared, preallocated K/V buffers. Several caches (a parent and its forks) may hold one storage.

Each holder owns a set of physical slots per row (its *segments*). A holder writes only into
slots no other live holder uses; otherwise it moves (``relocate``) or jumps past them. The
storage itself knows nothing about logical positions.
"""

from __future__ import annotations

import weakref

import torch


class Storage:
    """Per-layer K/V buffers ``[batch, kv_heads, capacity, d_head]`` plus per-slot metadata.

    Example::

        >>> import torch
        >>> st = Storage(n_layers=1, batch=1, kv_heads=2, d_head=4, capacity=8,
        ...              dtype=torch.float32, device=torch.device("cpu"))
        >>> st.capacity
        8
    """

    def __init__(self, n_layers, batch, kv_heads, d_head, capacity, dtype, device, growth=2.0, devices=None):
        self.n_layers, self.batch, self.kv_heads, self.d_head = n_layers, batch, kv_heads, d_head
        self.dtype, self.device, self.growth = dtype, device, growth
        self.capacity = max(1, int(capacity))
        shape = (batch, kv_heads, self.capacity, d_head)
        devs = list(devices) if devices else [device] * n_layers  # per layer (a model split over devices)
        self.k = [torch.zeros(shape, dtype=dtype, device=d) for d in devs]  # [B, H, cap, D]
        self.v = [torch.zeros(shape, dtype=dtype, device=d) for d in devs]  # [B, H, cap, D]
        self._prov = torch.zeros((batch, self.capacity), dtype=torch.int8)  # [B, cap] Provenance per slot
        self._stamp = torch.zeros((batch, self.capacity), dtype=torch.int64)  # [B, cap] last write tick
        # Writes whose provenance/stamp are not yet in the tensors: (start, n, tick, code or [code per row]).
        # Recording a tuple per forward instead of two tensor fills keeps decode's hot path short;
        # `prov` / `stamp` apply them before anyone reads.
        self._pending: list[tuple[int, int, int, int | list[int]]] = []
        self.holders: weakref.WeakSet = weakref.WeakSet()

    def __getstate__(self) -> dict:  # pickling: metadata applied, no holders (they re-register on load)
        self._flush()
        return {k: v for k, v in self.__dict__.items() if k != "holders"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.holders = weakref.WeakSet()

    # ------------------------------------------------------------------ per-slot metadata
    def note_write(self, start: int, n: int, stamp: int, code: int | list[int]) -> None:
        """Record that slots ``[start, start + n)`` of every row were written at ``stamp`` with provenance
        ``code`` (one int for all rows, or one per row). Applied lazily, in order."""
        self._pending.append((start, n, stamp, code))
        if len(self._pending) >= 256:  # bound the log for long generations that are never inspected
            self._flush()

    def _flush(self) -> None:
        pend, self._pending = self._pending, []
        prov, stamp = self._prov, self._stamp
        for start, n, t, code in pend:
            stamp[:, start : start + n] = t
            if isinstance(code, int):
                prov[:, start : start + n] = code
            else:
                for r, c in enumerate(code):
                    prov[r, start : start + n] = c

    @property
    def prov(self) -> torch.Tensor:
        """``[batch, capacity]`` int8 provenance code of every slot (up to date)."""
        if self._pending:
            self._flush()
        return self._prov

    @property
    def stamp(self) -> torch.Tensor:
        """``[batch, capacity]`` int64 write tick of every slot (up to date)."""
        if self._pending:
            self._flush()
        return self._stamp

    def ensure(self, needed: int) -> bool:
        """Grow all buffers to hold ``needed`` slots (geometric growth). Returns True if it grew."""
        if needed <= self.capacity:
            return False
        new_cap = max(needed, int(self.capacity * self.growth) + 1)
        used = min(self.capacity, self.max_end())
        for bufs in (self.k, self.v):
            for i, old in enumerate(bufs):
                new = torch.zeros((*old.shape[:2], new_cap, old.shape[3]), dtype=old.dtype, device=old.device)
                new[:, :, :used].copy_(old[:, :, :used])
                bufs[i] = new
        self._flush()
        for name in ("_prov", "_stamp"):
            old = getattr(self, name)
            new = torch.zeros((old.shape[0], new_cap), dtype=old.dtype)
            new[:, :used] = old[:, :used]
            setattr(self, name, new)
        self.capacity = new_cap
        return True

    def gather_rows(self, idx: torch.Tensor) -> Storage:
        """A new storage whose row ``r`` is this storage's row ``idx[r]`` (``idx`` ``[new_batch]``), no holders."""
        new = Storage.__new__(Storage)
        new.n_layers, new.kv_heads, new.d_head = self.n_layers, self.kv_heads, self.d_head
        new.batch, new.dtype, new.device, new.growth = idx.numel(), self.dtype, self.device, self.growth
        new.capacity = self.capacity
        new.k = [t.index_select(0, idx.to(t.device)) for t in self.k]  # [new_batch, H, cap, D]
        new.v = [t.index_select(0, idx.to(t.device)) for t in self.v]  # [new_batch, H, cap, D]
        new._prov = self.prov.index_select(0, idx)  # [new_batch, cap]
        new._stamp = self.stamp.index_select(0, idx)  # [new_batch, cap]
        new._pending = []
        new.holders = weakref.WeakSet()
        return new

    def max_end(self) -> int:
        """One past the highest physical slot any live holder uses."""
        return max((h.layout.end for h in self.holders), default=0)

    def conflicts(self, me, start: int, end: int) -> bool:
        """True if a live holder other than ``me`` uses a slot in ``[start, end)`` of any row."""
        if len(self.holders) <= 1:  # no forks (the common case, checked per forward): only `me` holds it
            return False
        return any(h is not me and h.layout.overlaps(start, end) for h in self.holders)

    def shared(self, me, row: int, slots: torch.Tensor) -> bool:
        """True if another live holder also sees any of ``slots`` (physical indices) of ``row``."""
        if len(self.holders) <= 1:
            return False
        lo, hi = int(slots.min()), int(slots.max()) + 1
        return any(h is not me and h.layout.overlaps(lo, hi, row) for h in self.holders)

    @property
    def nbytes(self) -> int:
        kv = sum(t.numel() * t.element_size() for t in (*self.k, *self.v))
        return kv + self._prov.numel() * 1 + self._stamp.numel() * 8
