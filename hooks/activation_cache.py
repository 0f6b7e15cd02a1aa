"""Captures as TransformerLens ``ActivationCache`` objects, so TL's own analysis methods run on them.

What one forward records converts as is: ``{hook name: [batch, n_new, ...]}``, the layout of
``model.run_with_cache``. A capture across decode steps holds more than an ``ActivationCache`` can
say, and the conversion chooses: ``forward=i`` takes one forward (its tokens sit at absolute
positions ``record.positions``, which the ``ActivationCache`` re-indexes from 0), ``stacked=True``
lays every position 0..max out by absolute position, later writes winning, optionally only
records whose tags match ``where`` (e.g. ``{"status": "committed"}`` from a speculative trace).

>>> import torch
>>> from beliefscope.models.testing import tiny_gpt2
>>> from beliefscope.hooks import capture, decomposition_hooks, to_activation_cache
>>> model = tiny_gpt2()
>>> with torch.no_grad(), capture(model, decomposition_hooks(model)) as cap:
...     _ = model(torch.tensor([[1, 2, 3, 4]]))
>>> to_activation_cache(cap, model).accumulated_resid().shape   # [layers + 1, batch, pos, d_model]
torch.Size([3, 1, 4, 32])
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformer_lens import ActivationCache


def decomposition_hooks(model) -> list[str]:
    """Hook names TL's ``accumulated_resid``, ``decompose_resid`` and ``stack_activation`` of the
    residual stream read (embeddings, resid pre/mid/post, attention and MLP outputs, LayerNorm
    scales), those this model has; capture these to run them on a converted capture."""
    L = model.cfg.n_layers
    per_layer = ["hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out",
                 "ln1.hook_scale", "ln2.hook_scale"]
    names = ["hook_embed", "hook_pos_embed", *(f"blocks.{l}.{n}" for l in range(L) for n in per_layer),
             "ln_final.hook_scale"]
    have = model.hook_dict
    return [n for n in names if n in have]


def to_activation_cache(capture, model, *, forward: int | None = None, stacked: bool = False,
                        where: dict | Callable[[dict], bool] | None = None):
    """A TransformerLens ``ActivationCache`` over ``model`` from a `Capture`.

    ``forward``: index of the forward to convert (default: the capture must hold exactly one).
    ``stacked``: instead, every absolute position 0..max, later writes winning; ``where`` keeps
    only records whose tags match (a dict of required tag values, or ``fn(tags) -> bool``).
    """

    names = [n for n in capture.names if capture.records[n]]
    if not names:
        raise ValueError("this capture recorded nothing: run a forward inside `with capture(model, names) as cap:`")
    if isinstance(where, dict):
        want = dict(where)
        where = lambda tags: all(tags.get(k) == v for k, v in want.items())
    if stacked:
        return ActivationCache({n: _stacked_complete(capture, n, where) for n in names}, model)
    if where is not None:
        raise ValueError("where= filters records of a stacked conversion: pass stacked=True with it")
    counts = {len(capture.records[n]) for n in names}
    if forward is None:
        if counts != {1}:
            raise ValueError(f"this capture holds {max(counts)} forwards per hook; choose one with forward=i "
                             "(0 = first, -1 = last) or lay positions out with stacked=True")
        forward = 0
    out = {}
    for n in names:
        recs = capture.records[n]
        if not -len(recs) <= forward < len(recs):
            raise IndexError(f"forward={forward} out of range: {n!r} has {len(recs)} recorded forwards")
        out[n] = recs[forward].act  # [batch, n_new, ...]
    return ActivationCache(out, model)


def _stacked_complete(capture, name: str, where) -> torch.Tensor:
    """``capture.stacked(name, where)`` after checking that every position 0..max was recorded."""
    recs = [r for r in capture.records[name] if where is None or where(r.tags)]
    if not recs:
        raise KeyError(f"no record of {name!r} matches where=; the tags seen are "
                       f"{sorted({tuple(sorted(r.tags.items())) for r in capture.records[name]})[:4]}")
    seen = capture.stacked_positions(name, where)  # [n_seen] as `stacked` lays them out
    n = int(seen.max()) + 1
    if seen.numel() != n:
        missing = sorted(set(range(n)) - set(seen.tolist()))[:8]
        raise ValueError(f"{name!r}: positions {missing} were never recorded (by the records kept), so a "
                         "stacked ActivationCache would hold zeros there; capture from the prompt on, or convert "
                         "one forward with forward=i")
    return capture.stacked(name, where)  # [batch, n, ...]
