"""What happened in a :class:`cache.KVCache`: provenance per position, the event log, rejected spans, snapshots.

The cache core (kv.py) keeps the K/V storage, each row's layout, ``update``, ``rollback`` and
``fork``, and nothing else. A ``Recorder`` is attached to it when the cache is built with
``CacheConfig(record=True)`` (the default). The core tells it what it did, once per forward and once
per rollback, fork, move or overwrite (never once per layer), through six calls: ``wrote``
(``wrote_rows`` for a slot cache), ``rolled_back``, ``forked``, ``moved`` and ``overwrote``. The recorder
turns them into:

- a provenance code per position (:class:`Provenance`: who wrote it), kept per physical slot
  beside the K/V so a fork sees the labels of the prefix it shares;
- ``events``: one :class:`CacheEvent` per row per prefill, decode, verify, rollback, fork and move;
- ``rejected``: copies of rolled-back entries, when the config asks for ``keep_rejected``;
- ``snapshot()`` / ``diff()``: what changed since a moment, from a write clock per slot.

A cache built with ``record=False`` keeps none of this, and a forward does no bookkeeping beyond its
layout: the choice for harvesting or decoding at the bare model's speed.

Example::

    >>> import torch
    >>> from beliefscope.cache import Provenance
    >>> from beliefscope.cache.testing import tiny_cache
    >>> c = tiny_cache()
    >>> with c.recorder.tagging(Provenance.DRAFT):
    ...     for layer in range(2):
    ...         _ = c.update(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3, 8), layer)
    >>> c.rollback(1)
    >>> [(e.kind, e.start, e.end) for e in c.recorder.events]
    [('decode', 0, 3), ('rollback', 1, 3)]
    >>> c.recorder.provenance_of(0).tolist() == [int(Provenance.DRAFT)]
    True
"""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter

import torch

from .provenance import CacheEvent, Provenance, RejectedSpan, Tag, label
from .snapshot import CacheDiff, RowDiff, Snapshot, tick

# The event kind of a forward whose writes carry an explicit provenance (other codes: "verify"; a `Tag`: its own).
KIND_OF = {Provenance.PREFILL: "prefill", Provenance.DRAFT: "decode"}

class Recorder:
    """Provenance, events, rejected spans and snapshots of one cache (see the module docstring)."""

    def __init__(self, cache):
        self._cache = weakref.ref(cache)  # the cache it records (it owns the recorder)
        self.events: list[CacheEvent] = []  # every prefill, decode, verify, rollback, fork, overwrite, move
        self.rejected: list[RejectedSpan] = []  # rolled-back entries, kept while config.keep_rejected
        self.next_provenance: Provenance | Tag | None = None  # one-shot: provenance of the next forward's writes
        self._tags: list[Provenance | Tag] = []  # the `tagging` blocks in force, innermost last
        self.owner_tags: dict[int, Tag] = {}  # code -> the owners' `Tag`s this cache has been given (summary columns)

    def __getstate__(self) -> dict:  # the cache re-binds itself on load (a weak reference does not pickle)
        return {k: v for k, v in self.__dict__.items() if k != "_cache"}

    def bind(self, cache) -> Recorder:
        """Attach to ``cache`` (after a copy or an unpickle); returns self."""
        self._cache = weakref.ref(cache)
        return self

    @property
    def cache(self):
        """The cache recorded (refused, naming the fix, once it has been freed)."""
        cache = self._cache()
        if cache is None:
            raise ReferenceError("the KVCache this recorder records has been freed (the recorder holds it weakly): "
                                 "keep the cache in a variable while you read cache.recorder")
        return cache

    # ------------------------------------------------------------------ told by the core
    def wrote(self, p: int, n: int, starts: list[int], step: int) -> None:
        """A forward wrote physical slots ``[p, p + n)`` of every row; row ``r`` held ``starts[r]`` positions."""
        prov = self._explicit_provenance() if (self.next_provenance is not None or self._tags) else None
        if prov is not None:  # next_provenance / tagging: same label for every row
            code: int | list[int] = int(prov)
            kind = prov.event if isinstance(prov, Tag) else KIND_OF.get(prov, "verify")
        elif 0 not in starts:  # default, decoding: the model's own tokens
            code, kind = int(Provenance.VERIFIED), "decode"
        else:  # default: a row's first write is its prompt (PREFILL), later writes the model's own (VERIFIED)
            code = [int(Provenance.VERIFIED) if t else int(Provenance.PREFILL) for t in starts]
            if len(set(code)) == 1:
                code = code[0]
            kind = None
        self.cache.storage.note_write(p, n, tick(), code)
        events = self.events
        for r, start in enumerate(starts):
            events.append(CacheEvent(kind or ("decode" if start else "prefill"), r, start, start + n, step))

    def wrote_rows(self, rows: list[int], starts: list[int], n: int, step: int) -> None:
        """A forward over a slot cache (`cache.slots`) wrote positions ``[starts[i], starts[i] + n)`` of row
        ``rows[i]``, each row at its own place (there, positions are slots)."""
        prov = self._explicit_provenance() if (self.next_provenance is not None or self._tags) else None
        kind = None if prov is None else prov.event if isinstance(prov, Tag) else KIND_OF.get(prov, "verify")
        st = self.cache.storage
        at = (torch.tensor(rows)[:, None], torch.tensor(starts)[:, None] + torch.arange(n))  # [R, 1], [R, n]
        codes = [int(prov) if prov is not None else int(Provenance.VERIFIED if s else Provenance.PREFILL)
                 for s in starts]
        st.stamp[at] = tick()
        st.prov[at] = torch.tensor(codes, dtype=torch.int8)[:, None]  # one code per row, over its n positions
        self.events += [CacheEvent(kind or ("decode" if s else "prefill"), r, s, s + n, step)
                        for r, s in zip(rows, starts)]

    def rolled_back(self, row: int, to: int, length: int, rejected_end: int | None = None) -> None:
        """Row ``row`` is about to drop logical positions ``[to, length)``, of which ``[to, rejected_end)``
        are rejected entries (kept with ``keep_rejected``; the rest is padding, never kept)."""
        cache = self.cache
        end = length if rejected_end is None else rejected_end
        if cache.config.keep_rejected and end > to:
            self.rejected.append(self._copy_span(row, to, end))
        self.events.append(CacheEvent("rollback", row, to, length, cache.forward_count))

    def forked(self, child: Recorder, ats: list[int]) -> None:
        """``child``'s cache was forked from this one, row ``r`` at length ``ats[r]``."""
        child.events, child.owner_tags = [], dict(self.owner_tags)
        step = self.cache.forward_count
        for r, t in enumerate(ats):
            ev = CacheEvent("fork", r, 0, t, step)
            self.events.append(ev)
            child.events.append(ev)

    def moved(self, rows: list[tuple[int, int]]) -> None:
        """Rows ``(r, length)`` now live in other physical slots (a relocation or a row gather)."""
        step = self.cache.forward_count
        self.events += [CacheEvent("relocate", r, 0, n, step) for r, n in rows]

    def overwrote(self, row: int, slots: torch.Tensor, positions, provenance: Provenance | Tag | None) -> None:
        """Physical ``slots`` of ``row`` (logical ``positions``) were given new keys and values."""
        st = self.cache.storage
        st.stamp[row, slots] = tick()
        if provenance is not None:
            st.prov[row, slots] = int(self.known(provenance))
        pos = torch.as_tensor(positions).reshape(-1)
        self.events.append(CacheEvent("overwrite", row, int(pos.min()), int(pos.max()) + 1, self.cache.forward_count))

    def known(self, code) -> Provenance | Tag:
        """``code`` as its label (`provenance.label`); an owner's `Tag` is remembered for the summary."""
        lab = label(code)
        if isinstance(lab, Tag):
            seen = self.owner_tags.setdefault(int(lab), lab)
            if (seen.name, seen.event) != (lab.name, lab.event):
                raise ValueError(f"{lab!r} reuses code {int(lab)}, which this cache already knows as {seen!r}: "
                                 "give each owner's Tag its own code")
        return lab

    def _explicit_provenance(self) -> Provenance | Tag | None:
        """The provenance a caller asked for (one-shot ``next_provenance``, then ``tagging``), else None."""
        if self.next_provenance is not None:
            prov, self.next_provenance = self.known(self.next_provenance), None
            return prov
        return self._tags[-1] if self._tags else None

    def _copy_span(self, row: int, start: int, end: int) -> RejectedSpan:
        cache = self.cache
        idx = cache.layout.slots(row, range(start, end))
        st = cache.storage
        return RejectedSpan(
            row=row, start=start, end=end, step=cache.forward_count, provenance=st.prov[row, idx].clone(),
            # keys and values: per layer [kv_heads, n, d_head], each on its layer's device
            keys=[st.k[l][row].index_select(1, idx.to(st.k[l].device)) for l in range(cache.config.n_layers)],
            values=[st.v[l][row].index_select(1, idx.to(st.v[l].device)) for l in range(cache.config.n_layers)],
        )

    # ------------------------------------------------------------------ labels
    @contextlib.contextmanager
    def tagging(self, provenance: Provenance | Tag):
        """Tag every write inside the block with ``provenance`` (a `Provenance`, or an owner's `Tag`).

        Example::

            >>> from beliefscope.cache import Provenance
            >>> from beliefscope.cache.testing import tiny_cache
            >>> c = tiny_cache()
            >>> with c.recorder.tagging(Provenance.DRAFT):
            ...     pass
        """
        self._tags.append(self.known(provenance))
        try:
            yield self.cache
        finally:
            self._tags.pop()

    def provenance_of(self, row: int = 0) -> torch.Tensor:
        """Provenance codes ``[length]`` (int8, compare with :class:`Provenance`) of ``row``.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> c = tiny_cache()
            >>> c.recorder.provenance_of(0).shape
            torch.Size([0])
        """
        cache = self.cache
        if cache.storage is None:
            return torch.zeros(0, dtype=torch.int8)
        return cache.storage.prov[row, cache.layout.slots(row)]

    @property
    def provenance(self):
        """Row 0's provenance ``[length]`` for batch 1; a list of them for a batch."""
        rows = [self.provenance_of(r) for r in range(max(1, len(self.cache.layout.lengths)))]
        return rows[0] if len(rows) == 1 else rows

    def mark(self, start: int, end: int, prov: Provenance | Tag, row: int | None = None) -> None:
        """Relabel logical positions ``[start, end)`` with ``prov`` (e.g. DRAFT -> VERIFIED).

        Example::

            >>> from beliefscope.cache import Provenance
            >>> from beliefscope.cache.testing import tiny_cache
            >>> c = tiny_cache()
            >>> c.recorder.mark(0, 0, Provenance.VERIFIED)
        """
        lay, code = self.cache.layout, int(self.known(prov))
        for r in range(len(lay.lengths)) if row is None else [row]:
            if not 0 <= start <= end <= lay.lengths[r]:
                raise ValueError(f"mark({start}, {end}) for row {r}: need 0 <= start <= end <= {lay.lengths[r]}.")
            if end > start:
                self.cache.storage.prov[r, lay.slots(r, range(start, end))] = code

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> Snapshot:
        """Record lengths and the write clock: O(batch), no tensors.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> c = tiny_cache()
            >>> c.recorder.snapshot().lengths
            (0,)
        """
        cache = self.cache
        return Snapshot(cache_id=cache.id, lengths=tuple(cache.lengths), clock=tick(), step=cache.forward_count)

    def diff(self, snap: Snapshot) -> CacheDiff:
        """Positions added, removed or overwritten (incl. rolled back and rewritten) since ``snap``.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> c = tiny_cache()
            >>> c.recorder.diff(c.recorder.snapshot()).changed
            False
        """
        cache, rows = self.cache, []
        for r, old in enumerate(snap.lengths):
            new = cache.lengths[r]
            common = min(old, new)
            over: tuple[int, ...] = ()
            if common and cache.storage is not None:
                stamps = cache.storage.stamp[r, cache.layout.slots(r, range(common))]
                over = tuple((stamps > snap.clock).nonzero().flatten().tolist())
            rows.append(RowDiff(row=r, added=range(old, max(old, new)), removed=range(new, max(new, old)),
                                overwritten=over))
        return CacheDiff(tuple(rows))

    # ------------------------------------------------------------------ summary
    def summary(self, last_events: int = 8) -> str:
        """A readable table of rows, provenance counts, memory and the latest events (never printed).

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> c = tiny_cache()
            >>> "row" in c.recorder.summary()
            True
        """
        cache = self.cache
        c, lay = cache.config, cache.layout
        labels = [*Provenance, *sorted(self.owner_tags.values())]  # the cache's own, then its owners' (e.g. THOUGHT)
        lines = [f"KVCache #{cache.id} model={c.model_name} layers={c.n_layers} kv_heads={c.kv_heads} "
                 f"d_head={c.d_head} capacity={cache.capacity} physical_end={lay.end} nbytes={cache.nbytes:,} "
                 f"forks_sharing={0 if cache.storage is None else len(cache.storage.holders) - 1}",
                 f"{'row':>4} {'length':>7} {'segments':>9} " + " ".join(f"{p.name:>9}" for p in labels)]
        for r in range(len(lay.lengths)):
            counts = Counter(self.provenance_of(r).tolist())
            rej = sum(s.end - s.start for s in self.rejected if s.row == r)
            # live positions by provenance; REJECTED counts the rolled-back entries kept in `rejected`
            cells = [rej if p is Provenance.REJECTED else counts.get(int(p), 0) for p in labels]
            lines.append(f"{r:>4} {lay.lengths[r]:>7} {len(lay.segments[r]):>9} " + " ".join(f"{x:>9}" for x in cells))
        lines.append(f"events: {len(self.events)} total" + (", latest:" if self.events else ""))
        for e in self.events[-last_events:]:
            lines.append(f"  step {e.step:>4}  {e.kind:<9} row {e.row}  [{e.start}, {e.end})")
        return "\n".join(lines)
