"""Fixed-shape batched verification of deterministic requests, over a slot `KVCache` (``CacheConfig(slots=True)``).

Every verify forward of the scheduler has the same shape: ``[B, W]`` tokens (B slots, window W)
attending over the *whole* capacity ``C`` of every slot, with a 4D mask that hides what a row
must not see. Each deterministic request owns one slot (one row) for its life; rows that have
nothing to verify in a pass, and free slots, are dummy rows (pad tokens written past their row's
length, which the step's keep rolls back). Since no shape depends on the batch composition or on
the other rows' lengths, a request's verified logits do not either.

The cache is one `KVCache` on a slot layout (`cache.slots`): each forward appends W positions to the
rows it runs, every row at its own length, the recorder logs it per row (so a request's slot has
provenance and events like any cache), and what a step keeps is a rollback the engine applies.

`verify_rows` is the other way, for kernels whose rows are bitwise independent of the batch
(linear layers packed by `models.packed`, attention by `models.invariant_attention`): only the
rows with work to verify, over their own keys (``[n, W]`` over the longest of those rows), so a
verify costs in proportion to the work, and a row's logits still do not depend on its neighbours.

>>> from beliefscope.models.testing import tiny_gpt2
>>> model = tiny_gpt2()
>>> slots = slot_cache(model, slots=2, capacity=16)
>>> verify_slots(slots, model, torch.tensor([[1, 2, 3], [4, 5, 6]])).shape   # [B, W, vocab]
torch.Size([2, 3, 50])
>>> slots.lengths   # the forward appended W to every row; a step's keep rolls back what it rejects
[3, 3]
"""

from __future__ import annotations

import torch

from ..cache import KVCache
from ..cache.slots import load_row
from .core import forward, hf_logits, new_cache


def slot_cache(model, slots: int, capacity: int, record: bool = True) -> KVCache:
    """``slots`` fixed rows of ``capacity`` positions for ``model``, allocated at once (`cache.slots`)."""
    return KVCache.for_model(model, batch=slots, capacity=capacity, slots=True, record=record)


def prefill_slot(cache: KVCache, model, row: int, prompt) -> torch.Tensor:
    """Run ``prompt`` (token ids) alone through ``model`` (a ``[1, n]`` forward, whose shape depends on the
    prompt only) and put its K/V into ``row`` in place of what it held; returns its logits ``[n, vocab]``."""
    ids = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)  # [n]
    alone = new_cache(model, ids.numel())
    logits = forward(model, ids, alone)
    n = alone.config.n_layers
    load_row(cache, row, [alone.keys(i) for i in range(n)], [alone.values(i) for i in range(n)])
    return logits


@torch.no_grad()
def verify_slots(cache: KVCache, model, tokens: torch.Tensor, rows=None, span: int | None = None) -> torch.Tensor:
    """One forward of ``tokens`` ``[R, W]`` for ``rows`` (default: every row; a ``range`` is read through a view of
    the buffers, a list gathered) attending over their first ``span``
    slots (default: the capacity: the fixed shape); logits ``[R, W, vocab]``. Each row's K/V are written at its
    length, which grows by W: the step's keep rolls back what it does not accept."""
    kw = cache.forward_kwargs(tokens.shape[1], rows=rows, span=span)
    return hf_logits(model, tokens, **kw)


@torch.no_grad()
def verify_rows(cache: KVCache, model, tokens: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """A forward of ``tokens [n, W]`` for slots ``rows`` only, over their first ``max(lengths) + W`` keys; logits
    ``[n, W, vocab]``. A row's logits depend on the others only through the kernels: give ``model`` row-invariant
    ones (`models.invariant_attention.row_invariant_copy`)."""
    rows = cache.layout.check_rows(rows)
    span = max(cache.layout.lengths[r] for r in rows) + tokens.shape[1]
    if span > cache.layout.capacity:
        raise ValueError(f"a slot would grow past its capacity {cache.layout.capacity}: raise the scheduler's slot "
                         f"capacity (longest row {span - tokens.shape[1]} + window {tokens.shape[1]})")
    return verify_slots(cache, model, tokens, rows=rows, span=span)  # a list: gathered, whatever the rows
