"""The API a TransformerLens or HF user reaches for (issue "The Python API ... no silent corner", friction items):
``generate(..., cache=...)`` continues a KVCache, ``generate`` without a SpecConfig, a too-long input refused
before any forward, and one BOS rule on the bridge's string paths and ``tok(text)``. Each is checked against a
reference: HF's own greedy ``generate``, HF's own logits, the tokenizer's own ids."""

import pytest
import torch

from beliefscope.cache import KVCache
from beliefscope.decoding import SpecConfig, generate, make_drafter, speculative_generate
from beliefscope.hooks import capture
from beliefscope.models.load import bridge_from_hf, load_model

from .helpers import copy_of, guarded, tiny_gpt2_hf, tiny_llama_hf


def _hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    """HF's own greedy decoding (its own cache), the new tokens only."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("make", [tiny_gpt2_hf, tiny_llama_hf], ids=["gpt2", "llama"])
def test_generate_continues_a_cache_after_rollback(make):
    """Before: ``generate(..., cache=...)`` raised TypeError (no such keyword): no way to continue after a rollback."""
    ref_model = make(seed=0)
    bridge = bridge_from_hf(copy_of(ref_model))
    prompt = [3, 9, 4, 17, 8, 30]
    full = generate(bridge, prompt, max_new_tokens=16, stop_at_eos=False)
    assert full.tokens == _hf_greedy(ref_model, prompt, 16)
    seen = [*prompt, *full.tokens]
    for keep in (len(prompt), len(prompt) + 4, len(prompt) + 10):  # roll back to the prompt's end and past it
        cache = full.cache.fork() if keep != len(prompt) + 10 else full.cache
        cache.rollback(keep - 1)  # the cache holds keep - 1 tokens; the sequence goes on to keep
        out = generate(bridge, seen[:keep], cache=cache, max_new_tokens=5, stop_at_eos=False)
        assert out.tokens == _hf_greedy(ref_model, seen[:keep], 5) == seen[keep: keep + 5]
        assert out.prompt_len == keep and out.cache is cache and cache.seq_len == keep + 4
    cache = full.cache.fork(len(prompt) + 3)  # rolled back, then another token than the model's: a new sequence
    other = [*seen[: len(prompt) + 3], 7, 11]
    out = generate(bridge, other, cache=cache, max_new_tokens=6, stop_at_eos=False)
    assert out.tokens == _hf_greedy(ref_model, other, 6)
    # a cache filled by the user's own forward, continued speculatively
    cache = KVCache.for_model(bridge, capacity=8)  # grows as it is written
    with torch.no_grad():
        bridge(torch.tensor([prompt[:4]]), past_key_values=cache)
    spec = speculative_generate(bridge, make_drafter("early-exit:1", bridge), prompt, cache=cache, max_new_tokens=9,
                                stop_at_eos=False)
    assert spec.tokens == _hf_greedy(ref_model, prompt, 9)


def test_continuing_refuses_what_it_cannot_serve():
    bridge = bridge_from_hf(tiny_gpt2_hf(seed=1))
    prompt = [3, 9, 4, 17, 8]
    full = generate(bridge, prompt, max_new_tokens=6, stop_at_eos=False)
    full.cache.rollback(7)
    new = full.tokens[2:4]
    with pytest.raises(ValueError, match=r"holds 7 positions but prompt_ids has 2 tokens: pass the whole sequence"):
        generate(bridge, new, cache=full.cache)  # only the new tokens (fewer than the cache holds)
    wrong = [*new, *full.tokens[:6]]  # longer than the cache, but not its tokens: refused where the run recorded them
    said = r"differ from the tokens the cache holds at position \d+ \(cache \d+, prompt \d+\): pass the whole"
    with pytest.raises(ValueError, match=said):
        generate(bridge, wrong, cache=full.cache)
    from transformers import DynamicCache

    with pytest.raises(TypeError, match="takes a beliefscope KVCache"):
        generate(bridge, prompt, cache=DynamicCache())
    with pytest.raises(ValueError, match="continues one row; this cache has 2 rows"):
        generate(bridge, prompt, cache=KVCache.for_model(bridge, batch=2))
    with pytest.raises(ValueError, match="built for another model"):
        generate(bridge, prompt, cache=KVCache.for_model(tiny_llama_hf()))


def test_generate_needs_no_specconfig():
    """Before: ``generate(model, ids, max_new_tokens=5)`` raised TypeError (a SpecConfig was the only way)."""
    hf = tiny_gpt2_hf(seed=2)
    bridge = bridge_from_hf(copy_of(hf))
    prompt = [4, 5, 6, 7]
    out = generate(bridge, prompt, max_new_tokens=5, stop_at_eos=False)
    assert out.tokens == _hf_greedy(hf, prompt, 5) and out.stop_reason == "budget"
    assert generate(bridge, prompt).tokens == generate(bridge, prompt, SpecConfig()).tokens  # the defaults
    assert generate(bridge, prompt, SpecConfig(max_new_tokens=9), max_new_tokens=3).tokens == out.tokens[:3]
    with pytest.raises(TypeError, match=r"unknown decoding setting\(s\) max_length: .*max_new_tokens"):
        generate(bridge, prompt, max_length=9)
    with pytest.raises(ValueError, match="max_new_tokens=0 must be >= 1"):
        speculative_generate(bridge, None, prompt, max_new_tokens=0)


def _short_gpt2(n_positions=16):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=n_positions, n_embd=32, n_layer=2, n_head=4)).eval()


def _short_qwen2(max_positions=16):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=max_positions)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.mark.parametrize("make, name", [(_short_gpt2, "n_positions"), (_short_qwen2, "max_position_embeddings")],
                         ids=["gpt2", "qwen2"])
def test_a_too_long_input_is_refused_before_the_forward(make, name):
    """Before: GPT-2 raised a raw IndexError from its position embedding (through the bridge, run_with_cache,
    capture); a Qwen2 ran past max_position_embeddings without a word."""
    ref = make()
    bridge = bridge_from_hf(copy_of(ref))
    fits, long = torch.arange(16)[None] % 60 + 2, torch.arange(20)[None] % 60 + 2
    with torch.no_grad():  # at the limit: no refusal, HF's own logits
        torch.testing.assert_close(bridge(fits, return_type="logits"), ref(fits).logits, rtol=0, atol=1e-5)
    said = rf"needs 20 positions .* context is 16 positions \({name}=16\): shorten the input to at most 16 tokens"
    calls = {"bridge": lambda: bridge(long, return_type="logits"),
             "run_with_cache": lambda: bridge.run_with_cache(long), "hf": lambda: guarded(copy_of(ref))(long)}
    for what, call in calls.items():
        with pytest.raises(ValueError, match=said):
            call()
    with pytest.raises(ValueError, match=said), capture(bridge, ["blocks.0.hook_resid_post"]):
        bridge(long)
    cache = KVCache.for_model(bridge)  # a cache the input extends counts too
    with torch.no_grad():
        bridge(fits[:, :12], past_key_values=cache)
    with pytest.raises(ValueError, match=r"needs 17 positions"):
        bridge(fits[:, :5], past_key_values=cache)
    assert cache.seq_len == 12  # refused before the forward: nothing written
    if name == "max_position_embeddings":  # the documented way to run a rotary model longer on purpose
        bridge.original_model.config.max_position_embeddings = 32
        with torch.no_grad():
            torch.testing.assert_close(bridge(long, return_type="logits"), ref(long).logits, rtol=0, atol=1e-5)


def _bos_tokenizer(folder):
    """A word-level tokenizer that adds a BOS of its own (as Llama-2's does), loaded from ``folder`` as a saved
    one is (TransformerLens reloads a BOS-adding tokenizer by its name_or_path)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from beliefscope.tasks import toy_vocabulary

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", "<bos>", *toy_vocabulary()])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 3)])
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                            bos_token="<bos>").save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)


@pytest.mark.parametrize("adds_bos", [False, True], ids=["tokenizer-without-bos", "tokenizer-with-bos"])
def test_one_bos_rule_for_the_bridge_and_the_tokenizer(adds_bos, tmp_path):
    """Before: ``bridge.to_tokens(text)`` prepended a BOS that ``tok(text)`` does not add (9 tokens against 8 on
    the toy target, 14 against 13 on SmolLM2), so the TransformerLens path and ours saw different sequences."""
    from beliefscope.models.tokenizer import toy_tokenizer

    tok = _bos_tokenizer(tmp_path) if adds_bos else toy_tokenizer()
    text = "A coin is heads . Alice flips ."
    ids = tok(text)["input_ids"]
    assert (ids[0] == tok.bos_token_id) == adds_bos
    hf = tiny_gpt2_hf(vocab=len(tok))
    ref = copy_of(hf)
    bridge, _ = load_model(hf, tokenizer=tok)
    assert bridge.to_tokens(text)[0].tolist() == ids
    assert len(bridge.to_str_tokens(text)) == len(ids)
    with torch.no_grad():  # a forward of the string is the forward of tok(text)
        torch.testing.assert_close(bridge(text, return_type="logits"), ref(torch.tensor([ids])).logits, rtol=0,
                                   atol=1e-5)
    with_bos = bridge.to_tokens(text, prepend_bos=True)[0].tolist()  # TransformerLens's habit, asked for by name
    assert with_bos[1:] == ids[1:] if adds_bos else with_bos[1:] == ids


def test_one_bos_rule_on_the_shipped_target():
    bridge, tok = load_model("target")
    text = "A coin is heads . Alice flips . Bob stays ."
    assert bridge.to_tokens(text)[0].tolist() == tok(text)["input_ids"]


@pytest.mark.slow
def test_one_bos_rule_on_smollm2(smollm2):
    bridge, tok = smollm2
    text = "A coin is heads. Alice flips it. Is it heads?"
    assert bridge.to_tokens(text)[0].tolist() == tok(text)["input_ids"]
