"""HF's own decoding loops on a KVCache give the tokens they give on HF's default cache.

Reference: ``model.generate`` without ``past_key_values`` (HF's DynamicCache), same seed. Models:
the shipped toy target (GPT-2, trained, chain-of-thought prompts) with the shipped draft as the
assistant, and a tiny random Llama (GQA, RoPE) with another tiny Llama as the assistant, on
prompts that repeat themselves so prompt lookup finds candidates.
"""

import pytest
import torch

from beliefscope.cache import KVCache
from beliefscope.models.testing import compare_generate, generate_modes, tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")

N_NEW = 20


@pytest.fixture(scope="module")
def toy():
    from beliefscope.models import load_hf
    from beliefscope.tasks.coinflip import sample_prompts

    model, tok = load_hf("target", device="cpu")
    draft, _ = load_hf("draft", device="cpu")
    prompts = sample_prompts(4, seed=3, events=(2, 6), fmt="cot")
    ids = [tok(p, return_tensors="pt").input_ids for p in prompts]  # each [1, T]
    return model, tok, draft, ids


def llama_prompts(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        base = torch.randint(3, 50, (1, 5), generator=g)
        out.append(torch.cat([base, base, base[:, :3]], 1))  # [1, 13], repeats: prompt lookup has matches
    return out


@pytest.fixture(scope="module")
def llama():
    return tiny_llama(bridge=False), tiny_llama(seed=1, bridge=False), llama_prompts()


TOY_MODES = sorted(generate_modes(draft=True))  # GPT-2 ignores num_hidden_layers: no early exit
LLAMA_MODES = sorted(generate_modes(draft=True, early_exit=1))


def _modes(draft, early_exit=None):
    return generate_modes(draft, early_exit=early_exit)


@pytest.mark.parametrize("mode", TOY_MODES)
def test_toy_target_generate_equals_default_cache(toy, mode):
    model, _, draft, prompts = toy
    kw = _modes(draft)[mode]
    for i, ids in enumerate(prompts):
        ref, ours = compare_generate(model, ids, seed=i, max_new_tokens=N_NEW, **kw)
        assert ref.shape[1] > ids.shape[1] + 5, "the reference should generate a chain of thought"
        assert torch.equal(ref, ours), f"{mode}, prompt {i}: {ref.tolist()} != {ours.tolist()}"


@pytest.mark.parametrize("mode", LLAMA_MODES)
def test_tiny_llama_generate_equals_default_cache(llama, mode):
    model, draft, prompts = llama
    kw = _modes(draft, early_exit=1)[mode]
    for i, ids in enumerate(prompts):
        ref, ours = compare_generate(model, ids, seed=i, max_new_tokens=N_NEW, **kw)
        assert torch.equal(ref, ours), f"{mode}, prompt {i}: {ref.tolist()} != {ours.tolist()}"


@pytest.mark.parametrize("mode", ["greedy", "sampling", "beam search"])
def test_left_padded_batch_equals_default_cache(toy, llama, mode):
    model, tok, _, _ = toy
    tok.padding_side = "left"
    from beliefscope.tasks.coinflip import sample_prompts

    enc = tok(sample_prompts(4, seed=5, events=(1, 7), fmt="cot"), return_tensors="pt", padding=True)
    assert (enc.attention_mask == 0).any(), "the batch should be ragged"
    kw = generate_modes()[mode]
    ref, ours = compare_generate(model, enc.input_ids, attention_mask=enc.attention_mask, max_new_tokens=N_NEW, **kw)
    assert torch.equal(ref, ours)

    lm, _, prompts = llama
    ids = torch.zeros(3, 13, dtype=torch.long)  # [3, 13] left-padded with 0
    mask = torch.zeros(3, 13, dtype=torch.long)
    for r, n in enumerate((13, 9, 6)):
        ids[r, 13 - n:], mask[r, 13 - n:] = prompts[r][0, :n], 1
    ref, ours = compare_generate(lm, ids, attention_mask=mask, max_new_tokens=N_NEW, pad_token_id=0, **kw)
    assert torch.equal(ref, ours)


def test_crop_follows_hf_semantics_against_dynamic_cache():
    """crop(-k), crop(0) (HF: remove nothing; it wiped the cache before, breaking prompt lookup),
    and the row gathers of beam search, each next to HF's DynamicCache doing the same."""
    from transformers import DynamicCache

    model = tiny_llama(bridge=False)
    ids = torch.tensor([[5, 6, 7, 8, 9], [9, 8, 7, 6, 5]])  # [2, 5]
    ours, ref = KVCache.for_model(model, batch=2), DynamicCache(config=model.config)
    with torch.no_grad():
        for c in (ours, ref):
            model(ids, past_key_values=c)
    ops = [("crop", -2), ("crop", 0), ("reorder_cache", torch.tensor([1, 1])),
           ("batch_repeat_interleave", 2), ("batch_select_indices", torch.tensor([3, 0, 2]))]
    for name, arg in ops:
        getattr(ours, name)(arg)
        getattr(ref, name)(arg)
        assert ours.get_seq_length() == ref.get_seq_length(), name
        for layer in range(2):
            k_ref = ref.layers[layer].keys  # [rows, kv_heads, len, d_head]
            assert torch.equal(ours.keys(layer, row=None), k_ref), (name, layer)
            assert torch.equal(ours.values(layer, row=None), ref.layers[layer].values), (name, layer)
    assert ours.config.batch == 3 and ours.lengths == [3, 3, 3]


def test_reorder_leaves_forks_untouched():
    model = tiny_llama(bridge=False)
    cache = KVCache.for_model(model, batch=2)
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7], [8, 9, 10]]), past_key_values=cache)
    fork = cache.fork()
    before = fork.keys(0, row=None).clone()  # [2, kv_heads, 3, d_head]
    cache.reorder_cache(torch.tensor([1, 0]))
    assert torch.equal(fork.keys(0, row=None), before)
    assert torch.equal(cache.keys(0, row=None), before[[1, 0]])
    with pytest.raises(ValueError, match="2 rows"):
        cache.reorder_cache(torch.tensor([0]))
    with pytest.raises(IndexError, match="rows 0..1"):
        cache.batch_select_indices(torch.tensor([2]))


def _count_forwards(model):
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    return calls, handle


def test_beam_search_with_a_cache_of_the_wrong_batch_fails_before_any_forward():
    model = tiny_llama(bridge=False)
    cache = KVCache.for_model(model, batch=1)
    calls, handle = _count_forwards(model)
    try:
        with pytest.raises(ValueError, match=r"'beam_search' runs 3 rows.*batch=3\)"):
            model.generate(torch.tensor([[5, 6, 7]]), num_beams=3, do_sample=False, max_new_tokens=4,
                           past_key_values=cache)
    finally:
        handle.remove()
    assert calls == [] and cache.recorder.events == []


def test_unsupported_mode_fails_before_any_forward(monkeypatch):
    """A mode outside the tested set is refused by name when generate adopts the cache. The modes
    transformers ships outside the library (contrastive search, DoLa, group/constrained beams) need a
    hub download; here contrastive search is routed to the in-library loop, as an older or newer
    transformers might, so the check on the cache is what stops it."""
    from transformers.generation import utils as gen_utils
    from transformers.generation.configuration_utils import GenerationMode

    monkeypatch.setitem(gen_utils.GENERATION_MODES_MAPPING, GenerationMode.CONTRASTIVE_SEARCH, "_sample")
    model = tiny_llama(bridge=False)
    cache = KVCache.for_model(model)
    calls, handle = _count_forwards(model)
    try:
        with pytest.raises(ValueError, match="'contrastive_search' is not supported by KVCache"):
            model.generate(torch.tensor([[5, 6, 7]]), penalty_alpha=0.6, top_k=4, max_new_tokens=4,
                           past_key_values=cache)
    finally:
        handle.remove()
    assert calls == []


def test_ragged_cache_fails_before_any_forward_with_the_mode():
    model = tiny_llama(bridge=False)
    cache = KVCache.for_model(model, batch=2)
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7], [8, 9, 10]]), past_key_values=cache)
    cache.rollback(1, row=1)
    calls, handle = _count_forwards(model)
    try:
        with pytest.raises(ValueError, match="'greedy_search'.*ragged rows or holes"):
            model.generate(torch.tensor([[5, 6, 7, 1], [8, 9, 10, 1]]), do_sample=False, max_new_tokens=2,
                           past_key_values=cache)
    finally:
        handle.remove()
    assert calls == []
