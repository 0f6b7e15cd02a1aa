"""The transformers ``Cache`` protocol of :class:`cache.KVCache`, as HF's own ``generate`` uses it.

What HF's decoding loops call, and what it means here:

- ``get_seq_length`` / ``get_mask_sizes``: the physical length, so HF builds the right causal mask.
- ``crop(-k)`` drops the last ``k`` positions of every row (assisted generation and prompt lookup
  call it after every verify); ``crop(0)`` removes nothing (HF calls it when every candidate was
  accepted); ``crop(n > 0)`` is refused, as transformers 5.23+ refuses it (``rollback(n)`` keeps
  the first ``n``).
- ``reorder_cache`` (beam search), ``batch_select_indices`` and ``batch_repeat_interleave`` gather
  rows into a fresh buffer (O(length)); forks keep what they had.
- ``generate`` on a model a cache was shaped for (``KVCache.for_model``, or any model built by
  ``models.bridge.build_bridge``) first calls :meth:`HFProtocolMixin.check_generate`: the mode
  (from transformers' public ``GenerationConfig.get_generation_mode``), the number of rows it runs
  and that the rows are clean, so a wrong combination fails before the first forward with the
  mode's name. Call ``cache.check_generate(mode, batch=...)`` yourself for other models.
"""

from __future__ import annotations

from dataclasses import replace

import torch

# Decoding modes of ``GenerationMixin.generate`` (``GenerationMode`` values) tested equal to HF's own
# cache (tests/test_cache_generate.py). Any other mode is refused before the first forward.
GENERATE_MODES = ("greedy_search", "sample", "assisted_generation", "beam_search", "beam_sample")


class HFProtocolMixin:
    """Length, crop, reset and row-gather methods HF calls, and the check of ``generate``'s mode.

    Example::

        >>> import torch
        >>> from beliefscope.cache.testing import tiny_cache
        >>> c = tiny_cache(batch=2)
        >>> for layer in range(2):
        ...     _ = c.update(torch.ones(2, 2, 4, 8), torch.ones(2, 2, 4, 8), layer)
        >>> c.crop(-1); c.lengths
        [3, 3]
        >>> c.crop(0); c.lengths      # HF's "remove nothing"
        [3, 3]
        >>> c.reorder_cache(torch.tensor([1, 1])); c.lengths
        [3, 3]
    """

    # ------------------------------------------------------------------ lengths
    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Physical length HF sees (== logical length for a clean cache; see ``seq_len``)."""
        if self._slotted:
            return 0  # a slot cache's forwards take their positions and mask from its plan, never from here
        lay = self.layout
        return lay.plan[0] if lay.plan is not None else lay.end

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    @property
    def batch_size(self) -> int:
        return self.layout.batch or -1

    # ------------------------------------------------------------------ crop / reset
    def crop(self, tokens_to_remove: int) -> None:
        """HF's crop: ``-k`` drops the last ``k`` positions of every row, ``0`` drops nothing; a
        positive value is refused, as transformers refuses it (``rollback(n)`` keeps the first ``n``)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): a positive value is refused, as transformers' own caches "
                             f"refuse it; crop(-k) drops the last k positions, cache.rollback({tokens_to_remove}) "
                             f"keeps the first {tokens_to_remove}.")
        if tokens_to_remove < 0:
            self.rollback([max(0, n + tokens_to_remove) for n in self.layout.lengths])

    def reset(self) -> None:
        """Empty every row (buffers are kept)."""
        if self.layout.batch:
            self.rollback([0] * self.layout.batch)

    def activate_past_recording(self) -> None:
        """HF asks caches to keep what ``crop`` may need; this cache keeps every position anyway."""

    # ------------------------------------------------------------------ row gathers (beam search)
    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Row ``r`` becomes old row ``beam_idx[r]`` (beam search); ``beam_idx`` has one entry per row."""
        idx = torch.as_tensor(beam_idx, dtype=torch.long).reshape(-1).cpu()  # [batch]
        if idx.numel() != self.layout.batch:
            raise ValueError(f"reorder_cache got {idx.numel()} indices for a cache of {self.layout.batch} rows; "
                             "pass one source row per row (batch_select_indices changes the number of rows).")
        self._gather_rows(idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` (in that order); the cache's batch becomes ``len(indices)``."""
        self._gather_rows(torch.as_tensor(indices, dtype=torch.long).reshape(-1).cpu())

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row ``repeats`` times in place (row 0, row 0, ..., row 1, ...)."""
        if repeats < 1:
            raise ValueError(f"batch_repeat_interleave(repeats={repeats}): repeats must be >= 1.")
        self._gather_rows(torch.arange(self.layout.batch).repeat_interleave(repeats))

    def _gather_rows(self, idx: torch.Tensor) -> None:
        """New row ``r`` = old row ``idx[r]`` (``idx`` ``[new_batch]``), in buffers of this holder alone."""
        n_rows = self.layout.batch
        if idx.numel() == 0 or int(idx.min()) < 0 or int(idx.max()) >= n_rows:
            raise IndexError(f"row indices {idx.tolist()} out of range: this cache has rows 0..{n_rows - 1}.")
        if idx.numel() == n_rows and bool((idx == torch.arange(n_rows)).all()):
            return  # identity (most beam steps early on)
        if idx.numel() != self.config.batch:

            self.config = replace(self.config, batch=idx.numel())  # forks share the old config object
        if self.storage is not None:
            old = self.storage
            self.storage = old.gather_rows(idx)
            old.holders.discard(self)
            self.storage.holders.add(self)
        self.layout = self.layout.gather(idx.tolist())
        if self.recorder is not None:
            self.recorder.moved([(r, self.layout.lengths[r]) for r, src in enumerate(idx.tolist()) if src != r])

    # ------------------------------------------------------------------ HF generate adopting this cache
    _is_user_defined = False  # set by HF generate when it adopts a cache the caller passed

    def check_generate(self, mode, *, batch: int | None = None, num_beams: int = 1,
                       num_return_sequences: int = 1) -> None:
        """Raise unless HF ``generate`` in ``mode`` (a ``GenerationMode`` or its value) can use this cache.

        Run by ``generate`` itself before its first forward; callable directly.

        Example::

            >>> from beliefscope.cache.testing import tiny_cache
            >>> tiny_cache().check_generate("greedy_search", batch=1)
            >>> tiny_cache().check_generate("contrastive_search")  # doctest: +NORMALIZE_WHITESPACE
            Traceback (most recent call last):
            ...
            ValueError: HF generate mode 'contrastive_search' is not supported by KVCache (supported: greedy_search,
            sample, assisted_generation, beam_search, beam_sample); run it without past_key_values (HF's
            DynamicCache) or with a supported mode.
        """
        name = str(getattr(mode, "value", mode))
        if name not in GENERATE_MODES:
            raise ValueError(f"HF generate mode {name!r} is not supported by KVCache (supported: "
                             f"{', '.join(GENERATE_MODES)}); run it without past_key_values (HF's DynamicCache) "
                             "or with a supported mode.")
        if self._closed:
            raise RuntimeError(f"HF generate mode {name!r} got a closed KVCache (a fork that left its `with` "
                               "block); pass an open cache.")
        rows = None if batch is None else batch * max(num_beams, num_return_sequences)
        if rows is not None and self.config.batch is not None and rows != self.config.batch:
            raise ValueError(
                f"HF generate mode {name!r} runs {rows} rows (batch {batch} x "
                f"{max(num_beams, num_return_sequences)} for num_beams={num_beams}, "
                f"num_return_sequences={num_return_sequences}) but this KVCache has batch={self.config.batch}; "
                f"build it with KVCache.for_model(model, batch={rows}).")
        if not self.is_clean:
            raise ValueError(
                f"HF generate mode {name!r} builds its own attention mask from get_seq_length(), but this KVCache "
                f"has ragged rows or holes (lengths {self.layout.lengths}, physical end {self.layout.end}); pass a "
                "fresh cache, "
                "or call cache.compact() first if every row has the same length.")
