"""The context limit: every forward of a guarded model is refused, before it runs, when its tokens reach past the
positions the model's config states (``n_positions`` for GPT-2's learned positions, ``max_position_embeddings``
for rotary and the rest).

Without it a model with learned positions (GPT-2, OPT) raises a raw ``IndexError`` from its position
embedding, and a rotary model (Llama, Qwen2, Mistral, ...) runs past the length it was built for with
no word. Both now raise `ContextLimitError` (a ``ValueError``) naming the length, the limit and the fix.
The check is a forward pre-hook that the model guard (`models.bridge.guard_cache_handoff`) installs on the
HF model, so a bridge forward, ``run_with_cache``, `hooks.capture`, decoding and HF's own ``generate``
all pass through it. To run a rotary model past its stated length on purpose (with a ``rope_scaling`` that
covers it), raise ``model.config.max_position_embeddings`` first: the check reads the config on every forward.

>>> import torch
>>> from beliefscope.models.testing import tiny_gpt2
>>> model = tiny_gpt2(n_positions=8)
>>> model(torch.arange(9)[None])  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
beliefscope.models.context.ContextLimitError: this forward needs 9 positions (...) but the model's context is 8 ...
"""

from __future__ import annotations

import torch

_NAMES = ("n_positions", "max_position_embeddings", "n_ctx")  # where HF configs state the addressable positions


class ContextLimitError(ValueError):
    """A forward's tokens reach past the positions the model's config states."""


def position_limit(config) -> int | None:
    """Positions a model with this HF ``config`` can address, or None where the config states none.

    >>> from transformers import GPT2Config
    >>> position_limit(GPT2Config(n_positions=64))
    64
    """
    for name in _NAMES:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def refuse_past_context(module, args, kwargs):
    """Forward pre-hook (with kwargs) of a HF causal LM: raise `ContextLimitError` when the forward's last
    position is at or past the limit. The end is read from ``position_ids`` when they are on the host, else
    from the length of the cache the forward extends plus the tokens it feeds; tensors on an accelerator are
    never read (no device sync), and nothing is checked while compiling or recording a graph."""
    limit = position_limit(module.config)
    if limit is None or torch.compiler.is_compiling():
        return None
    end = _end(args, kwargs)
    if end is not None and end > limit:
        raise ContextLimitError(
            f"this forward needs {end} positions (its tokens after the cache it extends) but the model's context is "
            f"{limit} positions "
            f"({_limit_name(module.config)}={limit}): shorten the input to at most {limit} tokens in all (cache "
            "included), e.g. keep its last tokens; a rotary model meant to run longer needs its "
            "config.max_position_embeddings raised on purpose first")
    return None


def _limit_name(config) -> str:
    return next(name for name in _NAMES if isinstance(getattr(config, name, None), int))


def _end(args, kwargs) -> int | None:
    """One past the last position this forward computes, or None where it cannot be read cheaply."""
    x = kwargs.get("input_ids", args[0] if args else None)
    if not torch.is_tensor(x):
        x = kwargs.get("inputs_embeds")
    if not torch.is_tensor(x) or x.dim() < 2:
        return None
    pid = kwargs.get("position_ids")
    if torch.is_tensor(pid):
        if not pid.is_cpu or pid.numel() == 0:
            return None  # explicit positions on an accelerator: not read (a sync per forward, or a graph capture)
        return int(pid.max()) + 1
    cache = kwargs.get("past_key_values")
    if cache is None:
        cache = kwargs.get("cache")
    try:
        past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
    except (TypeError, ValueError):
        return None
    return past + int(x.shape[1])
