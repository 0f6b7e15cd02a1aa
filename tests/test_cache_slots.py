"""A `KVCache` on a slot layout (``CacheConfig(slots=True)``, cache/slots.py): forwards over some rows, each written
at its own length, checked against an uncached forward; and every misuse refused before a write, naming the fix."""

import copy
import dataclasses

import pytest
import torch

from beliefscope.cache import KVCache, Provenance
from beliefscope.cache.keep import Keep, settle
from beliefscope.decoding.core import hf_model
from beliefscope.decoding.slots import prefill_slot, slot_cache, verify_slots
from beliefscope.models.testing import tiny_llama


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def _uncached(model, ids: list[int]) -> torch.Tensor:
    return hf_model(model)(torch.tensor([ids])).logits[0]  # [n, vocab]


@pytest.mark.parametrize("rows", [range(1, 3), [2, 1]])
def test_a_forward_over_some_rows_equals_an_uncached_forward_and_moves_only_their_lengths(model, rows):
    """Rows of different lengths, a run of them (read through a view) or a list (gathered), attending over a span
    shorter than the capacity: each row's logits are an uncached forward's (1e-5), and only they grow."""
    slots = slot_cache(model, slots=4, capacity=32)
    prompts = {0: [5, 6], 1: [3, 4, 5, 6, 7], 2: [9, 10, 11]}
    for r, p in prompts.items():
        prefill_slot(slots, model, r, p)
    x = torch.tensor([[12, 13], [14, 15]])  # [R, 2]
    order = list(rows)
    out = verify_slots(slots, model, x, rows=rows, span=8)  # [R, 2, vocab]
    for i, r in enumerate(order):
        ref = _uncached(model, prompts[r] + x[i].tolist())[-2:]
        assert (out[i] - ref).abs().max() < 1e-5, r
    assert slots.lengths == [2, 7, 5, 0]
    assert slots.recorder.provenance_of(1).tolist() == [int(Provenance.PREFILL)] * 5 + [int(Provenance.VERIFIED)] * 2
    settle(slots, Keep([2, 6, 3, 0]))  # what a step keeps: row 1 one token, row 2 none
    assert slots.lengths == [2, 6, 3, 0]
    assert [e.kind for e in slots.recorder.events[-2:]] == ["rollback", "rollback"]
    kept = int(x[order.index(1), 0])  # row 1 kept the first token it was given
    again = verify_slots(slots, model, torch.tensor([[16, 17]]), rows=[1], span=8)[0]  # over the kept token's K/V
    ref = _uncached(model, prompts[1] + [kept, 16, 17])[-2:]
    assert (again - ref).abs().max() < 1e-5


def test_a_slot_cache_refuses_what_it_cannot_serve_before_any_write(model):
    slots = slot_cache(model, slots=2, capacity=8)
    prefill_slot(slots, model, 0, [1, 2, 3, 4])
    hf = hf_model(model)
    with pytest.raises(RuntimeError, match=r"needs its plan: plan each forward with cache.forward_kwargs\(n, rows"):
        hf(torch.tensor([[1], [2]]), past_key_values=slots, use_cache=True)
    assert slots.lengths == [4, 0]
    with pytest.raises(ValueError, match=r"span=5 is shorter than the longest planned row \(4 held \+ 2 new\): "
                                         r"pass span >= 6"):
        slots.forward_kwargs(2, rows=[0], span=5)
    with pytest.raises(ValueError, match=r"span=9 must be in 1 .. 8"):
        slots.forward_kwargs(1, rows=[0], span=9)
    with pytest.raises(ValueError, match=r"rows \[0, 0\] must be distinct slots in 0 .. 1"):
        slots.forward_kwargs(1, rows=[0, 0])
    with pytest.raises(ValueError, match=r"a run of rows \(step 1\)"):
        slots.forward_kwargs(1, rows=range(0, 2, 2))
    with pytest.raises(ValueError, match="grow past its capacity 8"):
        slots.forward_kwargs(5, rows=[0])
    with pytest.raises(ValueError, match=r"fork\(\) of a slot cache"):
        slots.fork()
    with pytest.raises(ValueError, match="has no live mask"):
        slots.live_mask(1)
    assert slots.lengths == [4, 0]
    segments = KVCache.for_model(model, capacity=8)
    with pytest.raises(ValueError, match="every row of this cache takes part in every forward: drop them"):
        segments.forward_kwargs(1, rows=[0])
    with pytest.raises(ValueError, match=r"CacheConfig\(slots=True\) allocates its rows at once: give batch"):
        KVCache(dataclasses.replace(segments.config, batch=None, slots=True))


def test_a_deep_copy_is_an_independent_slot_cache(model):
    slots = slot_cache(model, slots=2, capacity=16)
    prefill_slot(slots, model, 1, [3, 4, 5])
    twin = copy.deepcopy(slots)
    assert twin.lengths == [0, 3] and twin.capacity == 16
    assert torch.equal(twin.keys(0, row=1), slots.keys(0, row=1))
    x = torch.tensor([[6]])
    a = verify_slots(twin, model, x, rows=[1], span=4)
    b = verify_slots(slots, model, x, rows=[1], span=4)
    assert torch.equal(a, b) and twin.lengths == slots.lengths == [0, 4]
    settle(twin, Keep([0, 3]))
    assert slots.lengths == [0, 4]  # the copy's rollback leaves the original as it was
