"""A `KVCache` on a slot layout (``CacheConfig(slots=True)``), mixed into :class:`cache.KVCache`: fixed-shape
forwards over some of its rows, each written at its own length (`cache.slot_layout`), and replayed forwards.

A slot cache is what the deterministic scheduler (``decoding.scheduler``) verifies on: ``B`` rows of a fixed
capacity ``C`` that never grows, moves or forks, so a recorded forward (``decoding.graphed``) reads the same
buffers for the cache's life. A forward over rows ``R`` attending over their first ``span`` slots is planned by
``cache.forward_kwargs(W, rows=R, span=span)``, which returns its mask ``[R, 1, W, span]`` and positions ``[R, W]``;
the forward then writes each of those rows at its own length and appends W positions to each, as a forward
appends to any `KVCache` (the recorder logs it per row), and what a step keeps is a rollback. With
``span`` = the capacity and every row, no shape depends on the rows' lengths; with a subset of rows over their
own keys, the cost follows the work (for kernels whose rows do not depend on the batch).

A *replayed* forward (a CUDA graph, or a forward compiled once per shape) runs no Python, so its bookkeeping is
done before it (`begin_replay`) and its writes go to positions held in a tensor the recording reads
(`replaying`): the recorded forward is pure tensor work over the cache's own buffers. This is also how a
segment-layout cache is replayed (``decoding.graphed.GraphedForward``): its writes go to one set of physical slots.

>>> from beliefscope.cache import KVCache
>>> from beliefscope.models.testing import tiny_gpt2
>>> model = tiny_gpt2()
>>> slots = KVCache.for_model(model, batch=2, capacity=16, slots=True)
>>> kw = slots.forward_kwargs(3, rows=[1], span=8)
>>> kw["attention_mask"].shape, kw["position_ids"].tolist()   # [R, 1, W, span], [R, W]
(torch.Size([1, 1, 3, 8]), [[0, 1, 2]])
"""

from __future__ import annotations

import contextlib

import torch

# what a forward over a slot cache needs from its caller, said in every refusal
PLAN = "plan each forward with cache.forward_kwargs(n, rows=..., span=...) and pass what it returns"


class SlotsMixin:
    """The slot layout's forwards (`cache.slots` module docstring); every method is inert on a segment layout."""

    _replay: tuple | None = None  # (rows, span, write positions) of a replayed forward in progress; None: eager

    @property
    def checks_growth(self) -> bool:
        """Whether the model guard checks that a forward given this cache wrote it (``models.guard``): not while
        a replayed forward runs, whose bookkeeping was done before it (`begin_replay`)."""
        return self._replay is None

    def _slot_kwargs(self, n_new: int, rows, span: int | None) -> dict:
        """``attention_mask`` ``[R, 1, n, span]`` and ``position_ids`` ``[R, n]`` of a forward over ``rows`` (None:
        every row), attending over the first ``span`` slots (None: the capacity); plans that forward. A ``range``
        of rows is written and attended through a view of the buffers; a list is gathered (a copy per layer)."""
        lay = self.layout
        view = rows is None or isinstance(rows, range)  # a run of rows: written and read through a view, no copy
        rows = lay.check_rows(rows)
        span = lay.capacity if span is None else int(span)
        if not 0 < span <= lay.capacity:
            raise ValueError(f"span={span} must be in 1 .. {lay.capacity} (the slot capacity)")
        longest = max(lay.lengths[r] for r in rows)
        if longest + n_new > lay.capacity:
            raise ValueError(f"a slot would grow past its capacity {lay.capacity}: raise the scheduler's slot capacity "
                             f"(longest row {longest} + window {n_new})")
        if longest + n_new > span:
            raise ValueError(f"span={span} is shorter than the longest planned row ({longest} held + {n_new} new): "
                             f"pass span >= {longest + n_new}")
        mask = lay.mask(rows, n_new, span)  # [R, 1, n, span] (refuses a row past the capacity)
        lay.plan = (rows, span, view)
        return {"attention_mask": mask, "position_ids": lay.position_ids(rows, n_new)}

    def _slot_begin(self, n: int) -> tuple:
        """Layer 0 of a forward over a slot cache: take its plan, tell the recorder, append ``n`` positions to each
        planned row; returns ``(rows, span, write positions [R, n])`` for the layers to write through."""
        lay = self.layout
        if lay.plan is None:
            raise RuntimeError(f"a forward over a slot cache (CacheConfig(slots=True)) needs its plan: {PLAN}.")
        rows, span, view = lay.plan
        lay.plan = None
        starts = [lay.lengths[r] for r in rows]
        if max(starts) + n > span:
            raise RuntimeError(f"the forward writes {n} positions but its plan was built for fewer (span {span}, "
                               f"longest row {max(starts)}): {PLAN} for this forward's width.")
        write = lay.write_positions(rows, n)  # [R, n]
        if self.recorder is not None:
            self.recorder.wrote_rows(rows, starts, n, self._step)
        for r in rows:
            lay.lengths[r] += n
        lay.current = (slice(rows[0], rows[0] + len(rows)) if view else torch.tensor(rows), span, write)
        self._cur = (0, n)
        self._step += 1
        return lay.current

    def _slot_update(self, k: torch.Tensor, v: torch.Tensor, layer: int):
        """Write keys/values ``[R, kv_heads, n, d_head]`` of the planned rows at their lengths; returns the rows'
        first ``span`` keys and values ``[R, kv_heads, span, d_head]`` (a view for a run of rows, else a copy)."""
        if layer == 0:
            rows, span, write = self._slot_begin(k.shape[2])
        elif self._cur is None or self._cur[1] != k.shape[2]:
            raise RuntimeError(f"layer {layer} wrote {k.shape[2]} positions but layer 0 of this forward wrote "
                               f"{None if self._cur is None else self._cur[1]}; layers must update in order 0..L-1.")
        else:
            rows, span, write = self.layout.current
        n_rows = len(range(self.layout.batch)[rows]) if isinstance(rows, slice) else len(rows)
        if k.shape[0] != n_rows:
            raise ValueError(f"layer {layer} wrote {k.shape[0]} rows but the forward was planned for {n_rows}: "
                             f"{PLAN}.")
        self._check_slot_write(k, v, layer)
        return self._write(k, v, layer, rows, span, write)

    def _check_slot_write(self, k, v, layer) -> None:
        c = self.config
        if k.shape != v.shape or k.shape[1] != c.kv_heads or k.shape[3] != c.d_head or k.dtype != c.dtype:
            raise ValueError(f"layer {layer} wrote keys {tuple(k.shape)} {k.dtype}, values {tuple(v.shape)}; this slot "
                             f"cache holds [rows, {c.kv_heads}, n, {c.d_head}] {c.dtype}: build it with "
                             "KVCache.for_model(<this model>, slots=True)")

    def _write(self, k, v, layer: int, rows, span, write):
        kb, vb = self.storage.k[layer], self.storage.v[layer]  # [B, kv_heads, C, d_head]
        if rows is None:  # a replayed segment-layout forward: every row, the same physical slots write [n]
            kb.index_copy_(2, write, k)
            vb.index_copy_(2, write, v)
            return kb, vb
        if isinstance(rows, slice):  # a run of rows: write and attend through a view of the buffers
            kv, vv = kb[rows, :, :span], vb[rows, :, :span]  # [R, kv_heads, span, d_head]
            idx = write[:, None, :, None].expand(k.shape)  # [R, kv_heads, n, d_head]
            kv.scatter_(2, idx, k)
            vv.scatter_(2, idx, v)
            return kv, vv
        sel = rows.to(kb.device)[:, None]  # [R, 1]
        kb[sel, :, write] = k.transpose(1, 2)  # [R, n, kv_heads, d_head] into each row's own positions
        vb[sel, :, write] = v.transpose(1, 2)
        return kb[rows.to(kb.device), :, :span], vb[rows.to(vb.device), :, :span]  # [R, kv_heads, span, d_head]

    def _replayed_update(self, k, v, layer: int):
        rows, span, write = self._replay
        return self._write(k, v, layer, rows, span, write)


def begin_replay(cache, n: int) -> torch.Tensor:
    """The bookkeeping of a slot cache's planned forward of ``n`` tokens (what layer 0 of an eager forward does):
    returns its write positions ``[R, n]``, which a replay copies into its recording's own tensor."""
    return cache._slot_begin(n)[2]


@contextlib.contextmanager
def replaying(cache, write: torch.Tensor, rows: int | None = None, span: int | None = None):
    """Forwards inside the block write ``cache`` at the positions in ``write`` (a tensor a recording reads) and
    nothing else runs per layer: ``write`` ``[n]`` physical slots of every row of a segment-layout cache, or
    ``[rows, n]`` positions of the first ``rows`` rows of a slot cache, attending over ``span`` slots."""
    rows_of = None if rows is None else slice(0, rows)
    cache._replay = (rows_of, span, write)
    try:
        yield cache
    finally:
        cache._replay = None


def load_row(cache, row: int, keys: list, values: list) -> None:
    """Put a context prefilled elsewhere (per layer ``[kv_heads, n, d_head]``) into ``row`` of a slot cache, in
    place of what it held; its length becomes n."""
    n = keys[0].shape[1]
    if n > cache.layout.capacity:
        raise ValueError(f"a prompt of {n} tokens does not fit a slot of capacity {cache.layout.capacity}")
    empty_row(cache, row)
    for layer, (k, v) in enumerate(zip(keys, values)):
        cache.storage.k[layer][row, :, :n] = k
        cache.storage.v[layer][row, :, :n] = v
    cache.layout.lengths[row] = n
    if cache.recorder is not None:
        cache.recorder.wrote_rows([row], [0], n, cache.forward_count)


def empty_row(cache, row: int) -> None:
    """Hand ``row`` of a slot cache to a new owner: its length becomes 0 (recorded as a rollback, as any)."""
    if cache.layout.lengths[row]:
        cache.rollback(0, row=row)


def move_row(cache, src: int, dst: int) -> None:
    """Copy row ``src``'s entries and length to row ``dst`` of a slot cache (compacting a pool)."""
    n, st = cache.layout.lengths[src], cache.storage
    for kb, vb in zip(st.k, st.v):
        kb[dst, :, :n] = kb[src, :, :n]
        vb[dst, :, :n] = vb[src, :, :n]
    st.prov[dst, :n], st.stamp[dst, :n] = st.prov[src, :n], st.stamp[src, :n]
    cache.layout.lengths[dst] = n
    if cache.recorder is not None:
        cache.recorder.moved([(dst, n)])
