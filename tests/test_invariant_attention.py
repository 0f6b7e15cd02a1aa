"""Row-invariant verification: tiled attention equals PyTorch's attention, and a verify row's bits
do not depend on its neighbours, its slot, the number of rows, the verify window W or the key span.

The references: torch's scaled_dot_product_attention (values, to 1e-5), an uncached Hugging Face
forward (logits, to 1e-4), and the same row computed alone (bits)."""

import pytest
import torch

from beliefscope.decoding.core import hf_model
from beliefscope.decoding.slots import prefill_slot, slot_cache, verify_rows, verify_slots
from beliefscope.models.invariant_attention import TILE, row_invariant_copy, tiled_attention
from beliefscope.models.packed import packing_available
from beliefscope.models.testing import tiny_gpt2, tiny_llama

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build cannot pack weights (oneDNN)")


def _visible(lengths, w, span, window=None):
    """``[B, 1, W, span]``: query i of row b sees keys 0 .. lengths[b] + i (the last `window` of them)."""
    last = torch.as_tensor(lengths)[:, None] + torch.arange(w)  # [B, W]
    keys = torch.arange(span)
    seen = keys[None, None] <= last[..., None]
    if window:
        seen &= keys[None, None] > last[..., None] - window
    return seen[:, None]


@pytest.mark.parametrize("heads,kv_heads,window", [(4, 4, None), (6, 2, None), (4, 2, 5)])
def test_tiled_attention_equals_sdpa(heads, kv_heads, window):
    g = torch.Generator().manual_seed(heads)
    b, w, d = 3, 5, 16
    lengths = [0, 70, 140]  # spans one tile, two and three
    span = max(lengths) + w
    q = torch.randn(b, heads, w, d, generator=g)
    k, v = torch.randn(b, kv_heads, span, d, generator=g), torch.randn(b, kv_heads, span, d, generator=g)
    seen = _visible(lengths, w, span, window)
    out, _ = tiled_attention(None, q, k, v, seen, scaling=0.3)  # [B, W, H, d]
    rep = heads // kv_heads
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                           attn_mask=seen, scale=0.3)
    assert (out.transpose(1, 2) - ref).abs().max() < 1e-5
    additive = torch.zeros(seen.shape).masked_fill(~seen, torch.finfo(torch.float32).min)
    assert torch.equal(tiled_attention(None, q, k, v, additive, scaling=0.3)[0], out)
    causal, _ = tiled_attention(None, q[:1], k[:1, :, :w], v[:1, :, :w], None, scaling=0.3)
    assert torch.equal(causal, tiled_attention(None, q[:1], k[:1, :, :w], v[:1, :, :w], _visible([0], w, w),
                                               scaling=0.3)[0])


def test_a_query_has_the_same_bits_in_any_batch_window_and_span():
    """Query at position p: alone (W = 1, keys 0..p) vs inside windows of 4-32 queries starting
    anywhere before it, beside 0-15 rows of other data, with up to 2 tiles of extra keys."""
    g = torch.Generator().manual_seed(0)
    h, hk, d = 6, 2, 32
    keys, values = torch.randn(1, hk, 400, d, generator=g), torch.randn(1, hk, 400, d, generator=g)
    queries = torch.randn(1, h, 400, d, generator=g)

    def attend(start, w, extra, neighbours):
        span = start + w + extra
        q = torch.cat([queries[:, :, start: start + w], torch.randn(neighbours, h, w, d, generator=g)])
        k = torch.cat([keys[:, :, :span], torch.randn(neighbours, hk, span, d, generator=g)])
        v = torch.cat([values[:, :, :span], torch.randn(neighbours, hk, span, d, generator=g)])
        return tiled_attention(None, q, k, v, _visible([start] * (1 + neighbours), w, span), scaling=0.2)[0][0]

    alone = {p: attend(p, 1, 0, 0)[0] for p in range(100, 240)}
    checked = 0
    for start, w, extra, neighbours in [(100, 4, 0, 0), (101, 8, 7, 1), (130, 16, TILE, 7), (200, 32, 2 * TILE, 15),
                                        (125, 32, 3, 3)]:
        out = attend(start, w, extra, neighbours)
        for i in range(w):
            assert torch.equal(out[i], alone[start + i]), (start, w, extra, neighbours, i)
            checked += 1
    assert checked == 92


@pytest.mark.parametrize("builder", ["tiny_llama", "tiny_gpt2"])
def test_verify_rows_bitwise_across_batch_slot_and_neighbours(builder):
    """A row verified with 0-15 other rows (other slots, other contents and lengths) gives the same
    logit bits as alone, and they equal an uncached forward of the plain model to 1e-4."""
    model = {"tiny_llama": tiny_llama, "tiny_gpt2": tiny_gpt2}[builder]()
    hf = hf_model(model)
    twin = row_invariant_copy(hf)
    g = torch.Generator().manual_seed(1)
    prompt, window = [3, 4, 5, 6, 7], torch.tensor([9, 10, 11, 12])

    def verify(slot, others):
        slots = slot_cache(hf, slots=16, capacity=96)
        prefill_slot(slots, hf, slot, prompt)
        for o in others:
            prefill_slot(slots, hf, o, torch.randint(1, 40, (int(torch.randint(2, 80, (1,), generator=g)),),
                                               generator=g).tolist())
        rows = sorted([slot, *others], key=lambda r: torch.rand(1, generator=g).item())  # any order
        x = torch.randint(1, 40, (len(rows), 4), generator=g)
        x[rows.index(slot)] = window
        return verify_rows(slots, twin, x, rows)[rows.index(slot)]  # [W, vocab]

    alone = verify(0, [])
    full = hf(torch.tensor(prompt + window.tolist())[None]).logits[0, -4:]
    assert (alone - full).abs().max() < 1e-4
    for slot, others in [(3, [1]), (7, [0, 2, 5, 9]), (15, list(range(15))), (8, list(range(8)) + [12, 14])]:
        assert torch.equal(verify(slot, others), alone), (slot, others)


def test_verify_rows_bitwise_across_the_window():
    """The same 24 tokens verified and committed in windows of 1, 4, 8 or 24: every position's
    logits have the same bits, so the K/V a slot keeps do not depend on W either."""
    hf = hf_model(tiny_llama(n_layer=3))
    twin = row_invariant_copy(hf)
    tokens = torch.randint(1, 40, (24,), generator=torch.Generator().manual_seed(2))
    prompt = [5, 6, 7, 8, 9, 10]

    def logits_in_windows(w):
        slots = slot_cache(hf, slots=2, capacity=64)
        prefill_slot(slots, hf, 1, prompt)
        out = []
        for i in range(0, len(tokens), w):  # each verify appends its window to the row
            out.append(verify_rows(slots, twin, tokens[i: i + w][None], [1])[0])
        return torch.cat(out)  # [24, vocab]

    ref = logits_in_windows(1)
    for w in (4, 8, 24):
        assert torch.equal(logits_in_windows(w), ref), w


def test_bad_rows_and_an_overfull_slot_are_refused():
    hf = hf_model(tiny_llama())
    slots = slot_cache(hf, slots=2, capacity=8)
    x = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"rows \[2\] must be distinct slots in 0 .. 1"):
        verify_rows(slots, hf, x, [2])
    with pytest.raises(ValueError, match=r"rows \[0, 0\] must be distinct"):
        verify_rows(slots, hf, torch.ones(2, 4, dtype=torch.long), [0, 0])
    prefill_slot(slots, hf, 0, [1, 2, 3, 4, 5, 6])
    with pytest.raises(ValueError, match="grow past its capacity 8.*longest row 6 \\+ window 4"):
        verify_rows(slots, hf, x, [0])
    assert slots.lengths == [6, 0]  # refused before any forward
    with pytest.raises(ValueError, match="dropout=0.5 must be 0"):
        tiled_attention(None, torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), None,
                        dropout=0.5)


def test_fast_path_decode_rows_bitwise_in_any_batch():
    """The batch-invariant fast path's decode step (`verify_slots` over a run of rows, one token per row
    over the longest row's keys): a row's logits have the same bits alone and among 1-7 rows of other
    lengths, in any row position; with default kernels the run would follow the batch's shape."""
    hf = hf_model(tiny_llama())
    twin = row_invariant_copy(hf)
    g = torch.Generator().manual_seed(3)
    prompt = [4, 8, 15, 16, 23, 42 % 40]

    def decode(row, others):
        pool = slot_cache(twin, slots=8, capacity=128)
        lengths = {row: prompt}
        lengths |= {o: torch.randint(1, 40, (int(torch.randint(2, 100, (1,), generator=g)),), generator=g).tolist()
                    for o in others}
        n = 1 + len(others)
        for r, p in lengths.items():
            prefill_slot(pool, twin, r, p)
        x = torch.randint(1, 40, (n, 1), generator=g)
        x[row] = 7
        span = max(pool.lengths[:n]) + 1
        return verify_slots(pool, twin, x, rows=range(n), span=span)[row]  # [1, vocab]

    alone = decode(0, [])
    for row, others in [(1, [0]), (3, [0, 1, 2]), (5, [0, 1, 2, 3, 4, 6, 7])]:
        assert torch.equal(decode(row, others), alone), (row, others)


def test_invariant_fast_path_tokens_are_the_verified_tokens():
    """On the batch-invariant fast path, a verify recomputes the fast path's own bits: with the check
    on, every draft of every deterministic request is accepted, in any batch; its outputs equal the
    verified outputs under the default fast path and greedy decoding by uncached forwards."""
    from beliefscope.decoding.scheduler import Request, Scheduler, SchedulerConfig

    bridge = tiny_llama(n_layer=3)
    hf = hf_model(bridge)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, 40, (int(n),), generator=g).tolist() for n in torch.randint(3, 30, (6,), generator=g)]

    def run(**kw):
        s = Scheduler(bridge, SchedulerConfig(window=4, max_batch=6, verify_slots=6, slot_capacity=80, **kw))
        reqs = [Request(p, 10, deterministic=i % 2 == 0, arrival=i) for i, p in enumerate(prompts)]
        return s.run(reqs), reqs, s

    checked, reqs, s = run(fast_kernels="row-invariant", verify_invariant_fast=True)
    det = [r for r in reqs if r.deterministic]
    assert s.verify_forwards > 0 and sum(r.drafted for r in det) > 0
    assert all(r.accepted == r.drafted for r in det)  # the fast path's bits are the verifier's bits
    unchecked, _, s2 = run(fast_kernels="row-invariant")
    assert s2.verify_forwards == 0 and unchecked == checked
    verified, _, _ = run()  # default fast path, deterministic requests verified by the row-invariant copy
    for i, p in enumerate(prompts):
        ref = list(p)
        for _ in range(10):  # no eos stop: the scheduler has none here
            ref.append(int(hf(torch.tensor([ref])).logits[0, -1].argmax()))
        assert checked[i] == ref[len(p):], i
        if i % 2 == 0:
            assert verified[i] == checked[i], i


def test_the_copy_is_shared_until_a_weight_changes():
    hf = hf_model(tiny_llama())
    a, b = row_invariant_copy(hf), row_invariant_copy(hf)
    assert a is b
    x = torch.tensor([[3, 4, 5]])
    before = a(x).logits
    with torch.no_grad():
        next(hf.parameters()).mul_(1.5)  # an in-place edit of the original: a fresh copy follows it
    c = row_invariant_copy(hf)
    assert c is not a and (c(x).logits - hf(x).logits).abs().max() < 1e-5
    assert not torch.allclose(c(x).logits, before)
