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
        p = self._pend
        for s in self._segs:  # a plain loop: this runs before every forward
            if s:
                if len(s) != 1 or s[0][0] != 0 or s[0][1] != p:
                    return False
            elif p:
                return False
        return True

    def attention_mask(self, n_new: int) -> torch.Tensor:
        """2D mask ``[batch, past + n_new]`` (1 = attend) for the next forward of ``n_new`` tokens per row.

        Calling it plans where the next forward writes; pass the result with ``position_ids``.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> tiny_cache(batch=2).attention_mask(3).shape
            torch.Size([2, 3])
        """
        p = self._pend
        if self._st is not None and self._st.conflicts(self, p, p + n_new):
            p = max(p, self._st.max_end())  # jump past slots other forks use: zero-copy, leaves a hole
        self._plan = (p, n_new)
        b = max(1, len(self._lens))
        dev = self.config.device or torch.get_default_device()  # the keys' device once the cache has any
        if self.is_clean and p == self._pend:
            return torch.ones((b, p + n_new), dtype=torch.long, device=dev)
        mask = torch.zeros((b, p + n_new), dtype=torch.long)
        for r, segs in enumerate(self._segs):
            for a, e in segs:
                mask[r, a:e] = 1
        mask[:, p:] = 1
        return mask.to(dev)

    def position_ids(self, n_new: int) -> torch.Tensor:
        """Logical positions ``[batch, n_new]`` of the next ``n_new`` tokens of every row.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> tiny_cache().position_ids(2).tolist()
            [[0, 1]]
        """
        lens = torch.tensor(self._lens or [0], dtype=torch.long)
        return (lens[:, None] + torch.arange(n_new)).to(self.config.device or torch.get_default_device())

    def forward_kwargs(self, n_new: int) -> dict:
        """``dict(past_key_values=self, attention_mask=..., position_ids=...)`` for the next forward.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> sorted(tiny_cache().forward_kwargs(1))
            ['attention_mask', 'past_key_values', 'position_ids']
        """
        return {"past_key_values": self, "attention_mask": self.attention_mask(n_new),
                "position_ids": self.position_ids(n_new)}

