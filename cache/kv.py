"""KVCache: a transformers ``Cache`` with preallocated per-layer buffers, rollback and fork.

Layout. Every holder (a cache or one of its forks) owns, per row, a list of physical
*segments* ``[a, b)`` of a shared :class:`~cache.storage.Storage`, kept by its
:class:`~cache.layout.Layout`. The logical sequence of a row is the concatenation of its segments. All
rows of one forward write the same physical slots ``[p, p + n_new)``; ``get_seq_length()`` reports ``p``
(so HF builds the right causal mask), and
:meth:`KVCache.attention_mask` / :meth:`KVCache.position_ids` hide holes and give every row its own
logical positions. A *clean* cache (each row is one segment ``[0, p)``) needs neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache

from .config import CacheConfig
from .copying import CopyMixin, compacted_storage
from .guard import shapes_of_guarded
from .hf import HFProtocolMixin
from .inspect import InspectMixin
from .layer import KVLayer
from .layout import Layout
from .masks import MaskMixin
from .recorder import Recorder
from .slot_layout import SlotLayout
from .slots import SlotsMixin
from .storage import Storage
from .validate import ValidateMixin

_IDS = itertools.count()

class KVCache(SlotsMixin, HFProtocolMixin, ValidateMixin, MaskMixin, InspectMixin, CopyMixin, Cache):
    """Inspectable layer-wise KV cache: O(1) append/rollback, zero-copy fork, provenance, snapshots.

    Example::

        >>> import torch
        >>> from beliefscope.cache import KVCache
        >>> from beliefscope.models.testing import tiny_gpt2
        >>> bridge = tiny_gpt2()
        >>> cache = KVCache.for_model(bridge, batch=1, capacity=32)
        >>> logits, _ = bridge(torch.tensor([[1, 2, 3]]), past_key_values=cache, return_type="logits_and_cache")
        >>> cache.rollback(2)          # `to` is the new absolute length
        >>> cache.seq_len
        2
    """

    growth_mark: int | None = None  # forward_count before the guarded forward in progress

    def __init__(self, config: CacheConfig, *, _storage: Storage | None = None):
        if config.keep_rejected and not config.record:
            raise ValueError("CacheConfig(keep_rejected=True, record=False): rejected spans are recorded; "
                             "set record=True or keep_rejected=False.")
        self.config = config
        super().__init__(layers=[KVLayer(self, i) for i in range(config.n_layers)])
        self.id = next(_IDS)
        self.storage: Storage | None = _storage  # K/V buffers and per-slot metadata, shared with forks
        self.layout = Layout(config.batch or 0)  # which slots hold each row's positions (cache.layout)
        self._cur: tuple[int, int] | None = None  # (p, n) of the forward in progress
        self._cur_pos: torch.Tensor | None = None  # [batch, n] logical positions being written (lazy)
        self._step = 0
        self._closed = False
        self._hooks: list = []
        # provenance, events, rejected spans and snapshots (cache.recorder); None: this cache records nothing
        self.recorder: Recorder | None = Recorder(self) if config.record else None
        self._slotted = config.slots  # a slot layout (cache.slots): fixed rows, each written at its own length
        self._replay = None  # (rows, span, write positions) while a recorded forward runs (cache.slots.replaying)
        if config.slots:
            self._allocate_slots()
        if _storage is not None:
            _storage.holders.add(self)

    def _allocate_slots(self) -> None:
        c = self.config
        missing = [f for f in ("batch", "kv_heads", "d_head", "dtype", "device") if getattr(c, f) is None]
        if missing or c.layer_devices is not None:
            raise ValueError(f"CacheConfig(slots=True) allocates its rows at once: give {', '.join(missing)} (or build "
                             "it with KVCache.for_model(model, slots=True)); a model split over devices has no slot "
                             "layout" if missing else "a slot layout keeps every layer on one device: this model is "
                             "split over devices")
        self.storage = self.storage or self._new_storage(c.capacity)
        self.storage.holders.add(self)
        self.layout = SlotLayout([0] * c.batch, c.capacity, c.windows, torch.device(c.device))

    # ------------------------------------------------------------------ construction
    @classmethod
    def for_model(cls, model, batch: int = 1, capacity: int = 256, **overrides) -> KVCache:
        """Build a cache shaped for ``model`` (a TransformerBridge or a HF causal LM), which must carry the
        model guard: `load_model` installs it, ``beliefscope.models.guard(model)`` on a model built elsewhere.

        Example::

            >>> from beliefscope.cache import KVCache
            >>> from beliefscope.models.testing import tiny_llama
            >>> KVCache.for_model(tiny_llama(), batch=2, capacity=64).config.kv_heads
            2
        """

        s = shapes_of_guarded(model)
        fields = {f.name for f in dataclasses.fields(CacheConfig)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise TypeError(f"KVCache.for_model got unknown CacheConfig field(s) {', '.join(unknown)}; "
                            f"valid fields: {', '.join(sorted(fields))}")
        windows = s.windows if any(w is not None for w in s.windows) else None
        split = s.layer_devices if len(set(s.layer_devices)) > 1 else None  # a model split over devices
        cfg = CacheConfig(n_layers=s.n_layers, kv_heads=s.kv_heads, d_head=s.d_head, batch=batch,
                          capacity=capacity, dtype=s.dtype, device=s.device, model_name=s.name, windows=windows,
                          layer_devices=split)
        return cls(dataclasses.replace(cfg, **overrides))

    @property
    def forward_count(self) -> int:
        """Forwards that have written this cache (its lineage's, for a fork)."""
        return self._step

    # ------------------------------------------------------------------ writes
    def _new_storage(self, capacity: int) -> Storage:
        c = self.config
        return Storage(c.n_layers, c.batch, c.kv_heads, c.d_head, capacity, c.dtype, torch.device(c.device),
                       c.growth, devices=c.layer_devices)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Append ``[batch, kv_heads, n_new, d_head]`` keys/values of ``layer_idx``; returns views of the buffers."""
        # Hot path (runs per layer per forward): two strided copies and two narrow() views, no allocation.
        # Measured through the bridge, every Python statement here costs more than in isolation (the
        # model's working set evicts it), so per-forward work is done once, at layer 0, in `_begin`,
        # and the common case of the checks is inlined (`_check` gives the errors).
        if self._replay is not None:  # a recorded forward: pure tensor work (cache.slots.replaying)
            return self._replayed_update(key_states, value_states, layer_idx)
        if self._slotted:
            return self._slot_update(key_states, value_states, layer_idx)
        k, v, layer = key_states, value_states, layer_idx
        c, s = self.config, k.shape
        if self._closed or not (s == v.shape and len(s) == 4 and s[0] == c.batch and s[1] == c.kv_heads
                                and s[3] == c.d_head and layer < c.n_layers and k.dtype == c.dtype
                                and k.device == (c.device if c.layer_devices is None else c.layer_devices[layer])):
            if self._closed:
                raise RuntimeError("this KVCache was closed (a fork that left its `with` block); fork again.")
            self._check(k, v, layer)
        n = s[2]
        if layer == 0:
            self._begin(k, n)
        elif self._cur is None or self._cur[1] != n:
            raise RuntimeError(f"layer {layer} wrote {n} positions but layer 0 of this forward wrote "
                               f"{None if self._cur is None else self._cur[1]}; layers must update in order 0..L-1.")
        p = self._cur[0]
        if self._hooks:
            pos = self._positions_being_written()
            for fn in list(self._hooks):
                out = fn(k, v, layer=layer, positions=pos)
                if out is not None:
                    k, v = out
        kb, vb = self.storage.k[layer], self.storage.v[layer]  # [batch, kv_heads, capacity, d_head]
        kb.narrow(2, p, n).copy_(k)
        vb.narrow(2, p, n).copy_(v)
        return kb.narrow(2, 0, p + n), vb.narrow(2, 0, p + n)

    _update = update  # internal name used by KVLayer

    def _positions_being_written(self) -> torch.Tensor:
        """``[batch, n]`` logical positions of the forward in progress (built once, only for write hooks)."""
        if self._cur_pos is None:
            n = self._cur[1]
            self._cur_pos = torch.tensor(self.layout.lengths)[:, None] - n + torch.arange(n)  # [batch, n]
        return self._cur_pos

    def _begin(self, k: torch.Tensor, n: int) -> None:
        """Layer 0 of a forward: choose slots, grow, append to the layout, tell the recorder."""
        st, lay = self.storage, self.layout
        if st is None:
            c = self.config
            if c.kv_heads is None or c.d_head is None or c.batch is None or c.dtype is None or c.device is None \
                    or not lay.batch:
                self._adopt_shape(k)
                lay = self.layout
            st = self.storage = self._new_storage(max(c.capacity, n))
            st.holders.add(self)
        plan = lay.plan
        if plan is not None:
            p, planned = plan
            lay.plan = None
            if planned != n:
                raise RuntimeError(f"attention_mask/position_ids were built for n_new={planned} but the forward "
                                   f"writes {n} positions; call cache.forward_kwargs({n}).")
        else:
            if self.config.strict_masks and not lay.is_clean:
                raise RuntimeError(
                    "this cache has ragged rows or holes (lengths "
                    f"{lay.lengths}, physical end {lay.end}), so the forward needs its mask and positions: "
                    f"call bridge(tokens, **cache.forward_kwargs({n})) "
                    f"(= attention_mask=cache.attention_mask({n}), position_ids=cache.position_ids({n}))."
                )
            p = lay.end
        if st.conflicts(self, p, p + n):
            if plan is not None:
                raise RuntimeError("another fork took the planned slots between attention_mask() and the forward; "
                                   "call cache.forward_kwargs(n) right before each forward.")
            self._relocate()  # clean holder: same layout, private storage
            st, lay = self.storage, self.layout
            p = lay.end
        if p + n > st.capacity:
            st.ensure(p + n)
        starts = lay.append(p, n)
        if self.recorder is not None:
            self.recorder.wrote(p, n, starts, self._step)
        self._cur = (p, n)
        self._cur_pos = None  # built on demand by _positions_being_written (write hooks only)
        self._step += 1

    # ------------------------------------------------------------------ rollback / fork / relocate
    def rollback(self, to: int | Sequence[int], row: int | None = None, *, rejected_end: int | None = None) -> None:
        """Set the new absolute length: ``to`` (all rows, or only ``row``), or one value per row.

        O(1) per rolled-back row: only the segment pointers move (unless ``keep_rejected``).
        ``rejected_end``: with ``keep_rejected``, only ``[to, rejected_end)`` is kept in ``rejected`` (the
        drafts the verifier turned down); what lies beyond is the padding of a fixed-shape forward,
        dropped without a copy. None keeps everything dropped.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> c = tiny_cache()
            >>> c.rollback(0)
        """
        lens = self.layout.lengths
        rows = list(range(len(lens))) if row is None else [row]
        if row is not None and not 0 <= row < len(lens):
            raise IndexError(f"row {row} out of range: this cache has rows 0..{len(lens) - 1}.")
        tos = [to] * len(rows) if isinstance(to, int) else list(to)
        if len(tos) != len(rows):
            raise ValueError(f"rollback got {len(tos)} lengths for {len(rows)} rows; pass one per row or an int.")
        for r, t in zip(rows, tos):
            if not 0 <= t <= lens[r]:
                raise ValueError(
                    f"rollback(to={t}) for row {r}: valid range is 0..{lens[r]} (the row's current length). "
                    f"`to` is the new absolute length, e.g. rollback(cache.lengths[{r}] - k) drops the last k "
                    "positions; a cache cannot roll forward."
                )
        moved = [(r, t) for r, t in zip(rows, tos) if t != lens[r]]
        if self.recorder is not None:
            for r, t in moved:
                self.recorder.rolled_back(r, t, lens[r], lens[r] if rejected_end is None else
                                          max(t, min(rejected_end, lens[r])))
        self.layout.rollback([t for _, t in moved], [r for r, _ in moved])

    def fork(self, at: int | Sequence[int] | None = None) -> KVCache:
        """A branch that shares this cache's prefix (no copy); its writes never touch this cache.

        ``at`` = the branch's length (default: current lengths). A branch from an earlier point
        (``at`` < length) needs ``**branch.forward_kwargs(n)`` in its forwards (zero-copy) or,
        if none are passed, copies its prefix once on its first write.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> with tiny_cache().fork() as branch:
            ...     branch.seq_len
            0
        """
        if self._slotted:
            raise ValueError("fork() of a slot cache (CacheConfig(slots=True)) is refused: its rows are fixed buffers "
                             "that recorded forwards read; copy.deepcopy(cache) gives an independent one")
        lens = self.layout.lengths
        ats = list(lens) if at is None else ([at] * len(lens) if isinstance(at, int) else list(at))
        for r, t in enumerate(ats):
            if not 0 <= t <= lens[r]:
                raise ValueError(f"fork(at={t}) for row {r}: valid range is 0..{lens[r]} (current length).")
        child = KVCache(self.config, _storage=self.storage)
        child.layout = self.layout.copy()
        child._step = self._step
        child._hooks = list(self._hooks)
        child.rollback(ats)
        if self.recorder is not None:
            self.recorder.forked(child.recorder, ats)
        return child

    @contextlib.contextmanager
    def tentative(self, keep_dropped: bool = False):
        """Forwards inside the block write past the current lengths; on exit every row is rolled back to its
        length at entry. What they wrote is dropped unrecorded, or, with ``keep_dropped`` (and the cache's
        ``keep_rejected``), kept in ``recorder.rejected``. For a look-ahead that must leave the cache as it was:
        an early-exit draft on the target's cache, a timing forward, a thought decoded and then set aside.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> c, kv = tiny_cache(), [torch.zeros(1, 2, 3, 8)] * 2   # 2 layers, 3 positions
            >>> c.fill_rows(kv, kv, [3])
            >>> with c.tentative():
            ...     c.fill_rows(kv, kv, [3])
            ...     c.seq_len
            6
            >>> c.seq_len
            3
        """
        entry = list(self.layout.lengths)
        try:
            yield self
        finally:
            for row, length in enumerate(entry):
                if self.layout.lengths[row] > length:
                    self.rollback(length, row=row, rejected_end=None if keep_dropped else length)

    def fill_rows(self, keys: list[torch.Tensor], values: list[torch.Tensor], lengths: Sequence[int]) -> None:
        """Write every layer's ``keys[layer]`` / ``values[layer]`` (``[batch, kv_heads, T, d_head]``, e.g. one
        story expanded to a row per question) after the current lengths, then keep row ``b``'s first
        ``lengths[b]`` of them: a ragged cache built from a shared prefix, with no forward."""
        if len(keys) != self.config.n_layers or len(values) != self.config.n_layers:
            raise ValueError(f"fill_rows takes one key and one value tensor per layer ({self.config.n_layers}); got "
                             f"{len(keys)} and {len(values)}")
        written = keys[0].shape[2]  # T
        if len(lengths) != len(self.layout.lengths) or any(not 0 <= int(n) <= written for n in lengths):
            raise ValueError(f"fill_rows keeps 0..{written} of the {written} positions given, one length per row "
                             f"({len(self.layout.lengths)} rows); got lengths {list(lengths)}")
        start = list(self.layout.lengths)
        for layer, (k, v) in enumerate(zip(keys, values)):
            self.update(k, v, layer)
        self.rollback([a + int(n) for a, n in zip(start, lengths, strict=True)])

    def _relocate(self) -> None:
        """Move this holder's live entries to a private storage, rows left-aligned (O(length) copy)."""
        old = self.storage
        new = compacted_storage(self, max(old.capacity, self.config.capacity))
        if self.recorder is not None:
            self.recorder.moved([(r, n) for r, n in enumerate(self.layout.lengths) if n])
        old.holders.discard(self)
        new.holders.add(self)
        self.storage = new
        self.layout = Layout.left_aligned(self.layout.lengths)

    def compact(self) -> None:
        """Left-align every row in a fresh buffer, dropping holes left by ragged rollbacks (O(length))."""
        if self.storage is not None and not self._slotted:  # a slot cache has no holes
            self._relocate()

    def close(self) -> None:
        """Release this cache's claim on shared buffers (done by ``with cache.fork() as b:``)."""
        if self.storage is not None:
            self.storage.holders.discard(self)
        self._closed = True

    def __enter__(self) -> KVCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
