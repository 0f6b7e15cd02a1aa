"""Tiny random models for tests, doctests and benchmarks (no network), guarded as `load_model` guards
a model, and the HF ``generate`` comparison the cache is tested with."""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from ..cache.kv import KVCache
from .bridge import guard_cache_handoff
from .runner import Runner


def _built(hf_model, arch: str, bridge: bool):
    """``hf_model`` in eval mode, as a guarded bridge or (``bridge=False``) a guarded HF model."""
    hf_model.eval()
    if bridge:
        return Runner(hf_model, arch=arch)
    guard_cache_handoff(hf_model)
    return hf_model


def tiny_gpt2(seed: int = 0, n_layer: int = 2, n_embd: int = 32, n_head: int = 4, vocab: int = 50,
              n_positions: int = 256, bridge: bool = True):
    """A random GPT-2 (as a TransformerBridge unless ``bridge=False``: the guarded HF model).

    Example::

        >>> tiny_gpt2().cfg.n_layers
        2
    """

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                     bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    model = GPT2LMHeadModel(cfg)
    return _built(model, "GPT2LMHeadModel", bridge)


def tiny_llama(seed: int = 0, n_layer: int = 2, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
               vocab: int = 50, bridge: bool = True):
    """A random Llama with grouped-query attention (``kv_heads < heads``).

    Example::

        >>> tiny_llama().original_model.config.num_key_value_heads
        2
    """

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=n_layer,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg)
    return _built(model, "LlamaForCausalLM", bridge)


def compare_generate(model, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None, seed: int = 0,
                     capacity: int = 64, **generate_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Run HF ``model.generate`` twice, with HF's default cache and with a :class:`KVCache`, from the same
    seed; returns ``(reference, ours)`` token tensors ``[rows, prompt + new]``.

    Example::

        >>> import torch
        >>> model = tiny_llama(bridge=False)
        >>> ref, ours = compare_generate(model, torch.tensor([[3, 4, 5, 3, 4]]), max_new_tokens=6,
        ...                              do_sample=False, prompt_lookup_num_tokens=2)
        >>> torch.equal(ref, ours)
        True
    """
    expand = max(generate_kwargs.get("num_beams", 1) or 1, generate_kwargs.get("num_return_sequences", 1) or 1)
    kw = dict(generate_kwargs)
    if attention_mask is not None:
        kw["attention_mask"] = attention_mask
    kw.setdefault("pad_token_id", getattr(model.generation_config, "pad_token_id", None) or 0)
    outs = []
    for cache in (None, KVCache.for_model(model, batch=input_ids.shape[0] * expand, capacity=capacity)):
        torch.manual_seed(seed)
        extra = {} if cache is None else {"past_key_values": cache}
        with torch.no_grad():
            outs.append(model.generate(input_ids, **kw, **extra))  # [rows, prompt + new]
    return outs[0], outs[1]


def generate_modes(draft=None, *, early_exit: int | None = None) -> dict[str, dict]:
    """``generate`` keyword arguments of every HF decoding mode a :class:`KVCache` is tested in, by name.

    ``draft`` (a HF model sharing the tokenizer) adds the assisted modes; ``early_exit`` (a layer
    count) adds assistant early exit, which HF runs only on models whose layer loop honours
    ``config.num_hidden_layers`` (Llama-family, not GPT-2).

    Example::

        >>> sorted(generate_modes())
        ['beam sampling', 'beam search', 'greedy', 'prompt lookup', 'sampling']
    """
    modes = {
        "greedy": {"do_sample": False},
        "sampling": {"do_sample": True, "temperature": 1.5, "top_k": 0},
        "prompt lookup": {"do_sample": False, "prompt_lookup_num_tokens": 3},
        "beam search": {"do_sample": False, "num_beams": 3},
        "beam sampling": {"do_sample": True, "temperature": 1.5, "top_k": 0, "num_beams": 3},
    }
    if draft is not None:
        modes["assisted"] = {"do_sample": False, "assistant_model": draft}
        modes["assisted sampling"] = {"do_sample": True, "temperature": 1.5, "top_k": 0, "assistant_model": draft}
    if early_exit is not None:
        modes["early exit"] = {"do_sample": False, "assistant_early_exit": early_exit}
    return modes
