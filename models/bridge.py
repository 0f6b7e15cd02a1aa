"""Build a TransformerBridge whose attention always reaches the KV cache it was given.

Why this module exists. From transformers 5.24 on, a decoder hands its cache to each attention
layer as ``cache=`` (``past_key_values=`` before; the old name is deprecated until 5.40).
TransformerLens 4.3's attention bridges read only ``past_key_values`` / ``layer_past``, so under
5.24 a cache passed to the bridge is silently never written and every cached forward attends to
its own tokens alone. Two guards, installed once per model by :func:`guard_cache_handoff`:

- **Hand-off:** a forward pre-hook on every attention bridge renames ``cache=`` to
  ``past_key_values=``; with either spelling the cache is written.
- **Generate check:** the model's ``generate`` first lets a cache that declares ``check_generate``
  refuse, by name and before any forward, a decoding mode, a number of rows or a state it cannot
  serve (the mode from transformers' public ``GenerationConfig.get_generation_mode``).
- **Input placement:** a forward pre-hook on the bridge and on the HF model moves every tensor argument
  (token ids, masks, positions) to the device of the input embedding, as TransformerLens's
  ``HookedTransformer`` does with its tokens. Host-built ids then run on any device, and on a model
  split over devices (``device_map``) the first layer gets them where it lives.
- **Context limit:** a forward pre-hook on the HF model refuses, before it runs, a forward whose tokens reach
  past the positions the config states (`models.context`: a raw ``IndexError`` on GPT-2, silence on a rotary
  model otherwise).
- **Growth check:** around the HF model's forward, a cache that declares ``checks_growth``
  (``cache.KVCache`` does) must have grown by the tokens fed, or :class:`CacheBypassedError`
  names the transformers version and the keyword. Two Python hooks per forward (about 10 µs).

>>> import torch
>>> from beliefscope.cache import KVCache
>>> from beliefscope.models.testing import tiny_llama
>>> bridge = tiny_llama()            # built with build_bridge, so already guarded
>>> cache = KVCache.for_model(bridge)
>>> _ = bridge(torch.tensor([[1, 2, 3]]), past_key_values=cache)
>>> cache.seq_len
3
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import types
import weakref
from importlib.metadata import version

import torch
import transformers
from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge
from transformer_lens.model_bridge.sources import build_bridge_from_module

from ..cache.guard import GUARD
from .context import refuse_past_context
from .errors import ModelLoadError
from .internals import attention_implementation
from .profile import compute_device, embedding_of, hf_of, model_shapes
from .tokenizer import tokenizer_adds_bos


class CacheBypassedError(RuntimeError):
    """A forward was given a growth-checked cache and did not write it."""


def build_bridge(hf_model, arch: str | None = None, tok=None):
    """Wrap an in-memory HF causal LM as a guarded TransformerBridge (the model is modified in place).

    Given ``tok``, the bridge's string paths (``to_tokens``, ``to_str_tokens``, a forward or ``generate`` of a
    string) tokenize as ``tok(text)`` does: TransformerLens's ``cfg.default_prepend_bos`` is set to whether the
    tokenizer adds a BOS itself, so no BOS is prepended that ``tok`` would not add (TransformerLens's own default
    prepends one). Pass ``prepend_bos=True`` to those methods for TransformerLens's habit."""


    arch = arch or (hf_model.config.architectures or [type(hf_model).__name__])[0]
    kw = {"tokenizer": tok} if tok is not None else {}
    try:
        bridge = build_bridge_from_module(hf_model, arch, hf_config=hf_model.config, **kw)
    except (RuntimeError, ValueError, KeyError, AttributeError, NotImplementedError, TypeError) as e:
        raise ModelLoadError(
            f"TransformerLens {version('transformer-lens')} cannot build a bridge for {arch} with this config "
            f"({type(e).__name__}: {str(e)[:200]}); models the toolkit is tested on: Llama, GPT-2, GPT-NeoX, "
            "Qwen2/3, Gemma/Gemma2, Mistral, Phi, Phi-3, OPT, Falcon (multi-query), StableLM, OLMo2") from None
    if tok is not None:  # one BOS rule: TransformerLens's string paths tokenize as `tok(text)` does (models.tokenizer)
        bridge.cfg.default_prepend_bos = tokenizer_adds_bos(tok)
    guard_cache_handoff(bridge)
    return bridge


def guard_cache_handoff(model) -> None:
    """Install the hand-off and the growth check on ``model`` (a bridge or a HF model); idempotent.
    `load_model` calls it; call it (as ``beliefscope.models.guard``) on a model built any other way before
    ``KVCache.for_model``, which refuses a model without it.

    >>> from beliefscope.cache import KVCache
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> hf = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    >>> guard_cache_handoff(hf)
    >>> KVCache.for_model(hf).config.n_layers
    1
    """
    hf = hf_of(model)
    if not vars(hf).get(GUARD):
        _guard_hf(hf)
    if hf is not model and not vars(model).get(GUARD):  # a bridge: its own attention bridges need the hand-off
        for module in model.modules():
            if isinstance(module, AttentionBridge):  # the wrappers that read past_key_values, never cache=
                module.register_forward_pre_hook(_rename_cache_kwarg, with_kwargs=True)
        model.register_forward_pre_hook(_inputs_to_embedding_device, with_kwargs=True)
        setattr(model, GUARD, model_shapes)  # what KVCache.for_model reads the shapes with


def _guard_hf(hf) -> None:
    """The HF model's part of the guard: the new cache keyword, input placement, eager masks, the context
    limit (`models.context`), the growth check and the checked ``generate``."""
    if cache_kwarg(hf) == "cache":
        hf.register_forward_pre_hook(_to_new_cache_kwarg, with_kwargs=True)
    hf.register_forward_pre_hook(_inputs_to_embedding_device, with_kwargs=True)
    hf.register_forward_pre_hook(_additive_masks_for_eager, with_kwargs=True)
    hf.register_forward_pre_hook(refuse_past_context, with_kwargs=True)  # models.context: before any position
    install_growth_check(hf)
    if hasattr(hf, "generate"):
        hf.generate = types.MethodType(_checked_generate, hf)  # a bound method: deep copies rebind it
    setattr(hf, GUARD, model_shapes)


def _checked_generate(self, *args, **kwargs):
    """HF ``generate``, after a cache that declares ``check_generate`` (``cache.KVCache`` does) has
    checked the decoding mode, the number of rows it runs and its own state, before any forward.
    The mode comes from transformers' public ``GenerationConfig.get_generation_mode``."""
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    if hasattr(cache, "check_generate"):
        config = copy.deepcopy(kwargs.get("generation_config") or self.generation_config)
        config.update(**{k: v for k, v in kwargs.items() if hasattr(config, k)})
        x = kwargs.get("input_ids", args[0] if args else kwargs.get("inputs_embeds"))
        cache.check_generate(config.get_generation_mode(kwargs.get("assistant_model")),
                             batch=None if x is None else x.shape[0], num_beams=config.num_beams or 1,
                             num_return_sequences=config.num_return_sequences or 1)
    placed = _inputs_to_embedding_device(self, args, kwargs)  # HF's generate does not move its inputs
    if placed is not None:
        args, kwargs = placed
    return type(self).generate(self, *args, **kwargs)


def input_device(model) -> torch.device:
    """Where ``model``'s token ids must be: the device of its input embedding (its first layer under a device map)."""
    return compute_device(embedding_of(hf_of(model)))


def _inputs_to_embedding_device(module, args, kwargs):
    dev = input_device(module)
    # .to() of a tensor already there returns it (no copy); called always, so a placement check sees it
    return (tuple(a.to(dev) if isinstance(a, torch.Tensor) else a for a in args),
            {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})


def _additive_masks_for_eager(module, args, kwargs):
    """A boolean 4D mask (``cache.KVCache`` gives one where sliding windows meet holes) becomes an additive
    one when the model's attention is HF's eager kernel, which adds the mask to the scores as it is (a
    boolean mask would add 1 where a key is visible and mask nothing). TransformerLens's wrapped
    attention reads either form; HF's own needs this."""
    mask = kwargs.get("attention_mask")
    if mask is None or attention_implementation(module.config) != "eager":
        return None
    if isinstance(mask, dict):
        kwargs["attention_mask"] = {k: _additive(v, module) for k, v in mask.items()}
    else:
        kwargs["attention_mask"] = _additive(mask, module)
    return args, kwargs


def _additive(mask, module):
    if not (torch.is_tensor(mask) and mask.dtype == torch.bool and mask.dim() == 4):
        return mask
    dtype = next(module.parameters()).dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def cache_kwarg(hf_model) -> str:
    """The name ``hf_model``'s forward takes its cache under: ``cache`` from transformers 5.24 on (where
    ``past_key_values`` still works but warns that it is deprecated), ``past_key_values`` before. Read
    once per class (every decode step asks); a forward set on the instance (accelerate's dispatch) is read
    each time."""
    if "forward" in hf_model.__dict__:
        return _cache_kwarg_in(hf_model.forward)
    return _cache_kwarg_of_class(type(hf_model))


@functools.lru_cache(maxsize=None)
def _cache_kwarg_of_class(cls) -> str:
    return _cache_kwarg_in(cls.forward)


def _cache_kwarg_in(forward) -> str:
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params and "past_key_values" not in params else "past_key_values"


_GROWTH_HOOKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # HF model -> its growth-check handles


def install_growth_check(hf_model) -> None:
    """A growth-checked cache given to ``hf_model``'s forward must have been written by it."""
    _GROWTH_HOOKS[hf_model] = (
        hf_model.register_forward_pre_hook(_note_cache_length, with_kwargs=True),
        hf_model.register_forward_hook(_check_cache_grew, with_kwargs=True))


@contextlib.contextmanager
def growth_check_removed(model):
    """Within the block, ``model`` runs without the growth check (``bench cache`` measures its cost)."""
    hf = hf_of(model)
    for h in _GROWTH_HOOKS.pop(hf, ()):
        h.remove()
    try:
        yield
    finally:
        install_growth_check(hf)


def _rename_cache_kwarg(module, args, kwargs):
    if "cache" in kwargs and kwargs.get("past_key_values") is None:
        kwargs["past_key_values"] = kwargs.pop("cache")
        return args, kwargs
    return None




def _to_new_cache_kwarg(module, args, kwargs):
    if "past_key_values" in kwargs and kwargs.get("cache") is None:
        kwargs["cache"] = kwargs.pop("past_key_values")
        return args, kwargs
    return None


def _checked_cache(kwargs):
    cache = kwargs.get("past_key_values")
    if cache is None:
        cache = kwargs.get("cache")
    return cache if getattr(cache, "checks_growth", False) else None


def _fed(args, kwargs) -> int | None:
    """Tokens per row this forward feeds: input_ids' or inputs_embeds' second dimension."""
    x = kwargs.get("input_ids", args[0] if args else None)
    if x is None:
        x = kwargs.get("inputs_embeds")
    return x.shape[1] if isinstance(x, torch.Tensor) and x.dim() >= 2 else None


def _note_cache_length(module, args, kwargs):
    cache = _checked_cache(kwargs)
    if cache is not None:
        cache.growth_mark = cache.forward_count


def _check_cache_grew(module, args, kwargs, output):
    cache = _checked_cache(kwargs)
    if cache is None or getattr(cache, "growth_mark", None) is None:
        return
    before, cache.growth_mark = cache.growth_mark, None
    n = _fed(args, kwargs)
    if n and cache.forward_count == before:

        raise CacheBypassedError(
            f"the forward fed {n} tokens per row with a KVCache, but no attention layer wrote it (it still "
            f"holds {cache.lengths} positions), so every cached result would be wrong. transformers "
            f"{transformers.__version__} hands the cache to attention layers as `cache=` or `past_key_values=`; "
            "this model's attention read neither. Build the bridge with beliefscope.models.build_bridge (or call "
            "beliefscope.models.bridge.guard_cache_handoff(bridge)), or install the versions in constraints.txt."
        )
    return
