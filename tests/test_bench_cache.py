"""The cache benchmark's own mechanics (its timings are not tested): each timed decode leaves both caches at the
prefill's length, and the two caches decode the same logits afterwards."""

import torch
from transformers import DynamicCache

from beliefscope.benchmarks import cache as bench
from beliefscope.cache import KVCache
from beliefscope.models.testing import tiny_gpt2


def test_timed_decodes_leave_both_caches_as_they_were():
    model = tiny_gpt2()
    ours, hf = KVCache.for_model(model, capacity=16), DynamicCache()
    prompt = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        for c in (ours, hf):
            model(prompt, past_key_values=c, return_type="logits")
        for c in (ours, hf):
            assert bench._decode_time(model, c, 3, 50) > 0
        assert ours.seq_len == hf.get_seq_length() == 4


def test_bench_decode_compares_the_same_logits():
    out = bench.bench_decode(tiny_gpt2(), [6], steps=2, repeats=2, vocab=50)["6"]
    assert out["max_abs_diff_logits"] < 1e-5  # float32, the same forward over two caches
    assert out["ms_per_token_kvcache"] > 0 and out["ms_per_token_dynamic"] > 0
