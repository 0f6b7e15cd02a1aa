"""`KVCache.tentative` (look-ahead writes set aside) and `KVCache.fill_rows` (a ragged cache from one prefix),
and `engine.settle` on a ragged step. Reference: an uncached forward of the same tokens (HF's own logits)."""

import torch

from beliefscope.cache import KVCache, Provenance
from beliefscope.cache.keep import Keep, settle
from beliefscope.models.testing import tiny_llama

TOL = 1e-5  # float32 logits of two paths over the same 2-layer model: summation order only


def test_tentative_writes_leave_the_cache_as_it_was_and_keep_the_dropped_span_only_when_asked():
    model = tiny_llama()
    ids = torch.tensor([[3, 5, 7, 9, 11, 2]])
    for keep_dropped in (False, True):
        cache = KVCache.for_model(model, capacity=32, keep_rejected=True)
        with torch.no_grad():
            model(ids[:, :4], past_key_values=cache)
            with cache.tentative(keep_dropped=keep_dropped):
                model(torch.tensor([[30, 31, 32]]), past_key_values=cache)  # a look-ahead
                assert cache.seq_len == 7
            assert cache.seq_len == 4
            got = model(ids[:, 4:], past_key_values=cache)
            want = model(ids)[:, 4:]
        assert (got - want).abs().max() < TOL  # the look-ahead left no trace the next forward sees
        spans = [(s.start, s.end) for s in cache.recorder.rejected]
        assert spans == ([(4, 7)] if keep_dropped else [])


def test_tentative_restores_every_row_even_when_the_block_raises():
    model = tiny_llama()
    cache = KVCache.for_model(model, batch=2, capacity=32)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3], [4, 5, 6]]), past_key_values=cache)
        try:
            with cache.tentative():
                model(torch.tensor([[7], [8]]), past_key_values=cache)
                raise RuntimeError("a drafter failed")
        except RuntimeError:
            pass
    assert cache.lengths == [3, 3]


def test_fill_rows_builds_each_row_from_the_shared_prefix_as_its_own_forward_would():
    """Row b holds the story's first lengths[b] positions: a question after it gives the logits of an uncached
    forward of that prefix and the question (forced answers at every boundary, from one story forward)."""
    model = tiny_llama()
    story, question = [3, 5, 7, 9, 11, 13, 2], [17, 19]
    base = KVCache.for_model(model, capacity=16)
    with torch.no_grad():
        model(torch.tensor([story]), past_key_values=base)
    n = base.config.n_layers
    keys = [base.keys(layer)[None] for layer in range(n)]  # each [1, kv_heads, T, d_head]
    values = [base.values(layer)[None] for layer in range(n)]
    lengths = [2, 5, 7]
    cache = KVCache.for_model(model, batch=3, capacity=16)
    cache.fill_rows([k.expand(3, -1, -1, -1) for k in keys], [v.expand(3, -1, -1, -1) for v in values], lengths)
    assert cache.lengths == lengths
    q = torch.tensor([question] * 3)
    with torch.no_grad():
        got = model(q, **cache.forward_kwargs(2))[:, -1]  # [3, vocab]
        for b, m in enumerate(lengths):
            want = model(torch.tensor([story[:m] + question]))[0, -1]
            assert (got[b] - want).abs().max() < TOL, (b, m)


def test_fill_rows_refuses_a_wrong_number_of_layers_before_writing():
    model = tiny_llama()
    cache = KVCache.for_model(model, capacity=16)
    one = [torch.zeros(1, cache.config.kv_heads, 2, cache.config.d_head)]
    try:
        cache.fill_rows(one, one, [2])
    except ValueError as e:
        assert "one key and one value tensor per layer" in str(e)
    else:
        raise AssertionError("fill_rows took one layer's tensors for a 2-layer cache")
    two = one * 2
    for lengths in ([3], [1, 1], [-1]):  # more than given, a length per row of another batch, negative
        try:
            cache.fill_rows(two, two, lengths)
        except ValueError as e:
            assert "fill_rows keeps 0..2" in str(e), str(e)
        else:
            raise AssertionError(f"fill_rows took lengths {lengths}")
    assert cache.seq_len == 0  # nothing written by a refused call


def test_settle_labels_verified_spans_and_cuts_each_row_to_its_own_length():
    model = tiny_llama()
    cache = KVCache.for_model(model, batch=2, capacity=32)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]), past_key_values=cache)
    settle(cache, Keep([3, 1], verified=((0, 0, 3), (1, 0, 1))))
    assert cache.lengths == [3, 1]
    prov = [cache.recorder.provenance_of(r).tolist() for r in range(2)]
    assert prov == [[int(Provenance.VERIFIED)] * 3, [int(Provenance.VERIFIED)]]
