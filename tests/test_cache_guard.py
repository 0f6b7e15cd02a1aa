"""The bridge always writes the KV cache it is given (transformers 5.23 passes it to attention as
``past_key_values=``, 5.24 as ``cache=``), and a forward that bypasses it raises instead of returning
wrong numbers."""

import pytest
import torch
import transformers

from beliefscope.cache import KVCache
from beliefscope.models.bridge import CacheBypassedError
from beliefscope.models.runner import Runner

from .helpers import copy_of, tiny_llama_hf


def test_cached_decode_equals_uncached_forward():
    hf = tiny_llama_hf(seed=2)
    ref = copy_of(hf)
    bridge = Runner(hf)
    x = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    cache = KVCache.for_model(bridge, capacity=16)
    with torch.no_grad():
        out = [bridge(x[:, :8], past_key_values=cache, return_type="logits")]
        out += [bridge(x[:, i:i + 1], past_key_values=cache, return_type="logits") for i in range(8, 12)]
        want = ref(x).logits
    assert cache.seq_len == 12
    assert (torch.cat(out, 1) - want).abs().max() < 1e-4


def test_a_bridge_built_by_transformer_lens_itself_is_refused_until_guarded():
    """A user's own bridge (TransformerLens's builder, no beliefscope wrapper) is refused by name, before
    any forward, even over a guarded HF model (the bridge itself needs the hand-off); after
    ``beliefscope.models.guard(bridge)`` its cached forwards equal an uncached one."""
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    from beliefscope.cache import UnguardedModelError
    from beliefscope.models import guard

    hf = tiny_llama_hf(seed=2)
    ref = copy_of(hf)
    bridge = build_bridge_from_module(hf, "LlamaForCausalLM", hf_config=hf.config)
    with pytest.raises(UnguardedModelError, match=r"TransformerBridge has no cache guard.*models.guard\(model\)"):
        KVCache.for_model(bridge, capacity=16)
    guard(bridge)
    cache = KVCache.for_model(bridge, capacity=16)
    x = torch.arange(1, 9)[None]
    with torch.no_grad():
        bridge(x[:, :5], past_key_values=cache, return_type="logits")
        last = bridge(x[:, 5:], past_key_values=cache, return_type="logits")
        want = ref(x).logits[:, 5:]
    assert cache.seq_len == 8 and (last - want).abs().max() < 1e-4


def test_a_forward_that_bypasses_the_cache_raises():
    """An attention that reads neither keyword (what TransformerLens 4.3 did under transformers 5.24)
    leaves the cache empty: the growth check names the version and the fix."""
    bridge = Runner(tiny_llama_hf(seed=2))
    drop = lambda module, args, kwargs: (args, {k: v for k, v in kwargs.items()
                                                if k not in ("cache", "past_key_values")})
    handles = [m.register_forward_pre_hook(drop, with_kwargs=True)  # on every HF attention (no bridge is built)
               for m in bridge.modules() if type(m).__name__ == "LlamaAttention"]
    assert handles
    cache = KVCache.for_model(bridge, capacity=16)
    with pytest.raises(CacheBypassedError, match=f"transformers {transformers.__version__}.*neither"):
        with torch.no_grad():
            bridge(torch.tensor([[1, 2, 3]]), past_key_values=cache, return_type="logits")
    assert cache.seq_len == 0
    for h in handles:
        h.remove()
    with torch.no_grad():  # once the attention reads the cache again, the same call passes
        bridge(torch.tensor([[1, 2, 3]]), past_key_values=cache, return_type="logits")
    assert cache.seq_len == 3


def test_an_unguarded_hf_model_is_refused():
    """A HF model built by hand has no guard: refused with the fix, whatever was asked of the cache."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from beliefscope.cache import UnguardedModelError

    hf = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    with pytest.raises(UnguardedModelError, match="GPT2LMHeadModel has no cache guard.*load_model"):
        KVCache.for_model(hf)


def test_unknown_cache_override_is_refused():
    with pytest.raises(TypeError, match="unknown CacheConfig field.*capacty"):
        KVCache.for_model(tiny_llama_hf(), capacty=8)


def test_building_a_cache_changes_nothing_on_the_model():
    """The guard is the loaders' (load_model, load_hf, build_bridge, beliefscope.models.guard): building a
    cache adds no hook, replaces no method, and guarding twice adds nothing either."""
    from beliefscope.models import guard

    bridge = Runner(tiny_llama_hf(seed=2))
    modules = [bridge, *bridge.modules()]

    def hooks():
        return [(id(m), tuple(m._forward_pre_hooks), tuple(m._forward_hooks)) for m in modules]

    before, generate = hooks(), bridge.original_model.generate
    KVCache.for_model(bridge, capacity=8)
    KVCache.for_model(bridge.original_model, capacity=8)
    guard(bridge)
    assert hooks() == before and bridge.original_model.generate is generate
