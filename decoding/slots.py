"""A static slot cache for fixed-shape batched verification of deterministic requests.

Every verify forward of the scheduler has the same shape: ``[B, W]`` tokens (B slots, window W)
attending over the *whole* capacity ``C`` of every slot, with a 4D mask that hides what a row
must not see. Each deterministic request owns one slot (one row) for its life; rows that have
nothing to verify in a pass, and free slots, are dummy rows (pad tokens whose writes land past
their row's length and are overwritten before anyone attends to them). Since no shape depends on
the batch composition or on the other rows' lengths, a request's verified logits do not either.

Its buffers are a :class:`cache.storage.Storage`, the one a ``KVCache`` keeps; what differs is the layout,
a :class:`cache.slot_layout.SlotLayout`: a fixed ``[B, C]`` grid with one length per row. Writes go to
each row's own length (``scatter`` along the position axis); rollback is moving a row's length, O(1).

``verify_rows`` is the other way, for kernels whose rows are bitwise independent of the batch
(linear layers packed by `models.packed`, attention by `models.invariant_attention`): only the
rows with work to verify, over their own keys (``[n, W]`` over the longest of those rows), so a
verify costs in proportion to the work, and a row's logits still do not depend on its neighbours.

>>> from beliefscope.models.testing import tiny_gpt2
>>> model = tiny_gpt2()
>>> slots = SlotCache.for_model(model, slots=2, capacity=16)
>>> slots.mask(3).shape  # [B, 1, W, C]
torch.Size([2, 1, 3, 16])
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..cache.slot_layout import SlotLayout
from ..cache.storage import Storage
from ..models.profile import model_shapes
from .core import forward, hf_logits, new_cache


class SlotLayer(CacheLayerMixin):
    """One layer's static buffers ``[B, kv_heads, C, d_head]``."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: SlotCache, k: torch.Tensor, v: torch.Tensor):
        self.owner, self.keys, self.values = owner, k, v
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        return None

    def update(self, key_states, value_states, *args, **kwargs):
        # key_states: [B, kv_heads, W, d_head] written at positions lengths[r] .. lengths[r] + W - 1 of row r
        idx = self.owner.write_index(key_states.shape)  # [B, kv_heads, W, d_head]
        self.keys.scatter_(2, idx, key_states)
        self.values.scatter_(2, idx, value_states)
        return self.keys, self.values  # the full capacity, always: a fixed attention shape

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.capacity, 0

    def get_seq_length(self) -> int:
        return 0  # positions come from position_ids and the 4D mask, never from here

    def get_max_length(self) -> int:
        return self.owner.capacity


class SlotCache(Cache):
    """``B`` static rows of capacity ``C``; ``lengths[r]`` tokens of row r are committed."""

    write_pos: torch.Tensor | None = None  # [B, W] write positions a recorded forward reads (else from lengths)

    def __init__(self, n_layers: int, slots: int, kv_heads: int, capacity: int, d_head: int, dtype, device,
                 windows: tuple | None = None):
        self.slots, self.device = slots, torch.device(device)
        self.layout = SlotLayout(torch.zeros(slots, dtype=torch.long), capacity, windows, self.device)  # [B] lengths
        self._width = 0  # W of the forward in progress (set by mask())
        # the K/V buffers [B, kv_heads, C, d_head] per layer: the storage a KVCache keeps, never grown here
        self.storage = Storage(n_layers, slots, kv_heads, d_head, capacity, dtype, self.device)
        super().__init__(layers=[SlotLayer(self, k, v) for k, v in zip(self.storage.k, self.storage.v)])

    @property
    def lengths(self) -> torch.Tensor:
        """``[B]`` committed tokens per row (the layout's; move one to commit or roll back)."""
        return self.layout.lengths

    @property
    def capacity(self) -> int:
        return self.layout.capacity

    @property
    def windows(self) -> tuple | None:
        return self.layout.windows

    @classmethod
    def for_model(cls, model, slots: int, capacity: int) -> SlotCache:
        s = model_shapes(model)
        return cls(n_layers=s.n_layers, slots=slots, kv_heads=s.kv_heads, capacity=capacity, d_head=s.d_head,
                   dtype=s.dtype, device=s.device, windows=s.windows)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.capacity, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.capacity

    def write_index(self, shape) -> torch.Tensor:
        b, h, w, d = shape
        pos = self.write_pos  # [B, W] on the device, set by a recording (`decoding.graphed.SlotReplays`)
        if pos is None:
            pos = self.layout.write_positions(w)  # [B, W]
        return pos[:, None, :, None].expand(b, h, w, d)

    def mask(self, width: int, lengths: torch.Tensor | None = None, span: int | None = None):
        """Boolean ``[B, 1, W, C]`` over the whole capacity (`SlotLayout.mask`)."""
        return self.layout.mask(width, lengths, span)

    def position_ids(self, width: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.layout.position_ids(width, lengths)  # [B, W]

    def load(self, row: int, keys: list, values: list) -> None:
        """Put a prefilled context (per layer ``[kv_heads, n, d_head]``) into ``row``; its length becomes n."""
        n = keys[0].shape[1]
        if n > self.capacity:
            raise ValueError(f"a prompt of {n} tokens does not fit a slot of capacity {self.capacity}")
        for layer, k, v in zip(self.layers, keys, values):
            layer.keys[row, :, :n] = k
            layer.values[row, :, :n] = v
        self.lengths[row] = n

    def prefill(self, model, row: int, prompt) -> torch.Tensor:
        """Run ``prompt`` (token ids) alone through ``model`` (a ``[1, n]`` forward, whose shape depends
        on the prompt only) and put its K/V into ``row``; returns its logits ``[n, vocab]``."""
        ids = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)  # [n]
        cache = new_cache(model, ids.numel())
        logits = forward(model, ids, cache)
        n = len(self.layers)
        self.load(row, [cache.keys(i) for i in range(n)], [cache.values(i) for i in range(n)])
        return logits

    def view(self, start: int, stop: int, span: int) -> SlotCache:
        """Rows ``start:stop`` and positions ``0:span`` as a cache of their own, sharing storage and
        lengths: the fast path's dynamic batch over the scheduler's static pool (its shapes follow the
        batch, so its logits may too)."""
        v = SlotCache.__new__(SlotCache)
        Cache.__init__(v, layers=[SlotLayer(v, layer.keys[start:stop, :, :span], layer.values[start:stop, :, :span])
                                  for layer in self.layers])
        v.layout, v.slots, v._width, v.device = self.layout.rows(start, stop, span), stop - start, 0, self.device
        return v

    def move(self, src: int, dst: int) -> None:
        """Copy row ``src``'s committed entries and length to row ``dst`` (compacting a pool)."""
        n = int(self.lengths[src])
        for layer in self.layers:
            layer.keys[dst, :, :n] = layer.keys[src, :, :n]
            layer.values[dst, :, :n] = layer.values[src, :, :n]
        self.lengths[dst] = n

    @torch.no_grad()
    def verify(self, model, tokens: torch.Tensor) -> torch.Tensor:
        """One fixed-shape forward of ``tokens`` ``[B, W]``; logits ``[B, W, vocab]``. Lengths are not
        advanced: the caller commits what it accepts with ``lengths[r] += k``."""
        w = tokens.shape[1]
        return hf_logits(model, tokens, past_key_values=self, attention_mask=self.mask(w),
                         position_ids=self.position_ids(w))

    @torch.no_grad()
    def verify_rows(self, model, tokens: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """A forward of ``tokens [n, W]`` for slots ``rows`` only, over their first ``max(lengths) + W``
        keys; logits ``[n, W, vocab]``. Their K/V are written into their slots (lengths not advanced).
        A row's logits depend on the others only through the kernels: give ``model`` row-invariant
        ones (`models.invariant_attention.row_invariant_copy`)."""
        if len(set(rows)) != len(rows) or not rows or min(rows) < 0 or max(rows) >= self.slots:
            raise ValueError(f"rows {rows} must be distinct slots in 0 .. {self.slots - 1}")
        w = tokens.shape[1]
        idx = torch.tensor(rows, dtype=torch.long)
        lengths = self.lengths[idx]  # [n]
        span = int(lengths.max()) + w
        mask = self.mask(w, lengths, span)  # [n, 1, W, span] (checks the capacity)
        sub = RowsView(self, idx, lengths, span)
        return hf_logits(model, tokens, past_key_values=sub, attention_mask=mask,
                         position_ids=self.position_ids(w, lengths))


class RowsLayer(SlotLayer):
    """One layer of a `RowsView`: the chosen rows' keys ``[n, kv_heads, span, d_head]`` (a copy), whose
    writes also land in the parent's slots."""

    def __init__(self, owner: RowsView, parent: SlotLayer):
        idx = owner.rows.to(parent.keys.device)
        super().__init__(owner, parent.keys[idx, :, : owner.capacity], parent.values[idx, :, : owner.capacity])
        self.parent = parent

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = super().update(key_states, value_states)  # into the copy, at each row's length
        rows = self.owner.rows.to(keys.device)  # [n]
        pos = self.owner.layout.write_positions(key_states.shape[2])  # [n, W]
        self.parent.keys[rows[:, None], :, pos] = key_states.transpose(1, 2)  # [n, W, kv_heads, d_head]
        self.parent.values[rows[:, None], :, pos] = value_states.transpose(1, 2)
        return keys, values


class RowsView(SlotCache):
    """Slots ``rows`` of a `SlotCache` over their first ``span`` positions, as a cache of their own
    (the subset forward of `SlotCache.verify_rows`)."""

    def __init__(self, parent: SlotCache, rows: torch.Tensor, lengths: torch.Tensor, span: int):
        self.rows, self.slots, self.device, self._width = rows, len(rows), parent.device, 0
        self.layout = SlotLayout(lengths, span, parent.windows, parent.device)  # the chosen rows' lengths, a copy
        Cache.__init__(self, layers=[RowsLayer(self, layer) for layer in parent.layers])
