"""Tiny random models and caches for tests, doctests and benchmarks (no network)."""

from __future__ import annotations

import torch


def _bridge(hf_model, arch: str):
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    hf_model.eval()
    return build_bridge_from_module(hf_model, arch, hf_config=hf_model.config)


def tiny_gpt2(seed: int = 0, n_layer: int = 2, n_embd: int = 32, n_head: int = 4, vocab: int = 50,
              n_positions: int = 256, bridge: bool = True):
    """A random GPT-2 (as a TransformerBridge unless ``bridge=False``).

    Example::

        >>> tiny_gpt2().cfg.n_layers
        2
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head, bos_token_id=0, eos_token_id=0,
                     attn_implementation="sdpa")
    model = GPT2LMHeadModel(cfg)
    return _bridge(model, "GPT2LMHeadModel") if bridge else model.eval()


def tiny_llama(seed: int = 0, n_layer: int = 2, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
               vocab: int = 50, bridge: bool = True):
    """A random Llama with grouped-query attention (``kv_heads < heads``).

    Example::

        >>> tiny_llama().original_model.config.num_key_value_heads
        2
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=n_layer,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg)
    return _bridge(model, "LlamaForCausalLM") if bridge else model.eval()


def tiny_cache(batch: int = 1, capacity: int = 16):
    """An empty cache shaped for a 2-layer model with 2 KV heads of size 8 (no model needed).

    Example::

        >>> tiny_cache().seq_len
        0
    """
    from .config import CacheConfig
    from .kv import KVCache

    return KVCache(CacheConfig(n_layers=2, kv_heads=2, d_head=8, batch=batch, capacity=capacity,
                               dtype=torch.float32, device=torch.device("cpu")))
