"""Attention masks and position ids for ragged rows and holes (mixed into :class:`cache.KVCache`)."""

from __future__ import annotations

import torch


class MaskMixin:
    """Per-forward ``attention_mask``/``position_ids`` helpers of :class:`cache.KVCache`.

    Example::

        >>> from beliefscope.cache.testing import tiny_cache
        >>> tiny_cache().is_clean
        True
    """

    # ------------------------------------------------------------------ masks for ragged rows / holes
    @property
    def is_clean(self) -> bool:
        """True if every row is the single segment ``[0, physical_end)``: no mask or positions needed."""
        return self.layout.is_clean

    def live_mask(self, n_new: int) -> torch.Tensor:
        """2D ``[batch, past + n_new]`` (1 = a live entry of the row, or one of the next ``n_new``).

        Calling it plans where the next forward writes (``past`` is the physical end of the
        storage the forward will write after).

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> tiny_cache(batch=2).live_mask(3).shape
            torch.Size([2, 3])
        """
        if self._slotted:
            raise ValueError("a slot cache (CacheConfig(slots=True)) has no live mask: its forwards attend over a "
                             "span of each row's slots; use cache.forward_kwargs(n, rows=..., span=...)")
        lay = self.layout
        p = lay.end
        if self.storage is not None and self.storage.conflicts(self, p, p + n_new):
            p = max(p, self.storage.max_end())  # jump past slots other forks use: zero-copy, leaves a hole
        lay.plan = (p, n_new)
        dev = self.config.device or torch.get_default_device()  # the keys' device once the cache has any
        return lay.live_mask(p, n_new).to(dev)

    def attention_mask(self, n_new: int):
        """The mask to pass with the next forward of ``n_new`` tokens per row (plans its slots).

        A 2D ``[batch, past + n_new]`` live mask, from which HF builds the causal (and sliding)
        mask, wherever physical slots are logical positions. A model with sliding windows over a
        cache with holes or ragged rows needs windows measured in logical positions, so it gets a
        boolean 4D ``[batch, 1, n_new, past + n_new]`` mask, or one per layer type
        (``{"full_attention": ..., "sliding_attention": ...}``) for models that alternate.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> tiny_cache(batch=2).attention_mask(3).shape
            torch.Size([2, 3])
        """
        if self._slotted:  # every row over the whole capacity: [batch, 1, n_new, capacity]
            return self._slot_kwargs(n_new, None, None)["attention_mask"]
        live = self.live_mask(n_new)  # [batch, past + n_new]
        windows = self.config.windows
        if windows is None or (self.layout.is_clean and self.layout.plan[0] == self.layout.end):
            return live
        past = live.shape[1] - n_new
        q_pos = self.position_ids(n_new)  # [batch, n_new]
        cols = torch.arange(past + n_new, device=live.device)
        causal = cols[None, :] <= past + torch.arange(n_new, device=live.device)[:, None]  # [n_new, past + n_new]
        mask = live.bool()[:, None, None, :] & causal[None, None]  # [batch, 1, n_new, past + n_new]
        return apply_windows(mask, q_pos, key_positions(live, q_pos), windows)

    def position_ids(self, n_new: int) -> torch.Tensor:
        """Logical positions ``[batch, n_new]`` of the next ``n_new`` tokens of every row.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> tiny_cache().position_ids(2).tolist()
            [[0, 1]]
        """
        if self._slotted:
            return self.layout.position_ids(list(range(self.layout.batch)), n_new)
        return self.layout.positions(n_new).to(self.config.device or torch.get_default_device())

    def forward_kwargs(self, n_new: int, rows=None, span: int | None = None) -> dict:
        """``dict(past_key_values=self, attention_mask=..., position_ids=...)`` for the next forward.

        On a slot cache (``CacheConfig(slots=True)``, `cache.slots`), ``rows`` (default: every row) are the rows
        the forward runs, and ``span`` (default: the capacity) the slots they attend over; elsewhere every row
        takes part in every forward, and passing either is refused.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> sorted(tiny_cache().forward_kwargs(1))
            ['attention_mask', 'past_key_values', 'position_ids']
        """
        if self._slotted:
            return {"past_key_values": self, **self._slot_kwargs(n_new, rows, span)}
        if rows is not None or span is not None:
            raise ValueError(f"forward_kwargs(rows={rows}, span={span}): rows and span plan a forward over some rows "
                             "of a slot cache (CacheConfig(slots=True)); every row of this cache takes part in every "
                             "forward: drop them")
        return {"past_key_values": self, "attention_mask": self.attention_mask(n_new),
                "position_ids": self.position_ids(n_new)}



def key_positions(live: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
    """Logical position ``[batch, past + n]`` of every key column: a live past column's rank among
    its row's live columns, and the new tokens' own positions ``q_pos`` ``[batch, n]`` for the last n.

    >>> key_positions(torch.tensor([[1, 0, 1, 1, 1]]), torch.tensor([[2, 3]])).tolist()
    [[0, 0, 1, 2, 3]]
    """
    n = q_pos.shape[1]
    past = live[:, : live.shape[1] - n].long().cumsum(-1) - 1  # [batch, past]
    return torch.cat([past.clamp(min=0), q_pos.to(past.device)], dim=1)


def apply_windows(mask: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, windows):
    """Restrict a boolean ``[batch, 1, q, k]`` mask to each layer's sliding window, in logical positions.

    ``q_pos`` ``[batch, q]`` and ``k_pos`` ``[batch, k]`` are the queries' and keys' logical
    positions; a query sees a key when ``q_pos - k_pos < window`` (transformers' rule). ``windows``
    is per layer (None = full). Returns the mask itself when no layer slides, one mask when every
    layer has the same window, else ``{"full_attention": ..., "sliding_attention": ...}``, the
    per-layer-type masks transformers' alternating decoders (Gemma 2/3, Qwen2/3) accept.

    >>> m = torch.ones(1, 1, 1, 4, dtype=torch.bool)
    >>> apply_windows(m, torch.tensor([[3]]), torch.tensor([[0, 1, 2, 3]]), (2, 2)).int().tolist()
    [[[[0, 0, 1, 1]]]]
    >>> sorted(apply_windows(m, torch.tensor([[3]]), torch.tensor([[0, 1, 2, 3]]), (2, None)))
    ['full_attention', 'sliding_attention']
    """
    distinct = {w for w in (windows or ())}
    if not distinct or distinct == {None}:
        return mask
    dist = q_pos[:, None, :, None].to(k_pos.device) - k_pos[:, None, None, :]  # [batch, 1, q, k]
    slides = {w for w in distinct if w is not None}
    if len(slides) > 1:
        raise ValueError(f"layers with different sliding windows {sorted(slides)}: one window per model is supported")
    slid = mask & (dist < slides.pop())
    if None not in distinct:
        return slid
    return {"full_attention": mask, "sliding_attention": slid}
