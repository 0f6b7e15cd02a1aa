"""Attention whose every query row has the same bits in any batch, window and key span.

A verify forward computes a few queries per request over that request's own keys. With
PyTorch's fused attention, a query row's rounding can depend on how many other rows, queries
and (masked) keys share the call: the kernel picks its blocking from the shapes. Then a
deterministic request's verified logits depend on its neighbours, on the verify window W and on
the number of slots, which is the limit LLM-42's own runs show (arXiv 2601.17768: verified
outputs differ between verify windows).

``tiled_attention`` fixes the reduction order per query instead of the shape:

- keys are read in tiles of ``TILE`` positions aligned at position 0, so the tiles covering a
  query's visible keys do not depend on how many keys follow them;
- each tile's scores and weighted values are reduced over a fixed size (``d_head``, then
  ``TILE``), in small matrix products whose shapes do not depend on the key span;
- tiles are merged one after another with the online softmax (Milakov & Gimelshein 2018, as in
  FlashAttention, Dao et al. 2022). A tile a query cannot see adds exactly zero with a scale of
  exactly one, so it changes no bit of that query's output.

So a query's output depends only on its own query vector and its visible keys and values. With
the linear layers packed by `models.packed` (bitwise row-invariant), a whole forward is then
row-invariant: a verify row costs only its own work, with no dummy rows and no padding to a
fixed capacity, and its logits are the same bits whatever shares the forward
(``tests/test_invariant_attention.py``).

``use_tiled_attention(model)`` switches a Hugging Face model to it for a block of code and back.

>>> import torch
>>> q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
>>> seen = torch.ones(1, 1, 3, 5, dtype=torch.bool).tril(2)  # query i sees keys 0 .. i + 2
>>> out, _ = tiled_attention(None, q, k, v, seen, scaling=8 ** -0.5)
>>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=seen)
>>> torch.allclose(out.transpose(1, 2), ref, atol=1e-5)
True
"""

from __future__ import annotations

import copy
import weakref
from contextlib import contextmanager

import torch
from transformers import AttentionInterface

from .internals import attention_implementation, version_stamp
from .packed import pack_linears, require_packable

QUERIES = 64  # queries per block: every score and weighted-value product has the shape [QUERIES, TILE]
TILE = 64  # keys per tile: the fixed reduction size of the softmax sums and of the weighted values
NAME = "beliefscope_tiled"  # its name in transformers' AttentionInterface


def tiled_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                    dropout: float = 0.0, scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, H, W, d]``, ``key`` / ``value
    [B, H_kv, L, d]``, ``attention_mask`` boolean ``[B, 1, W, L]`` (True: visible) or additive float,
    or None (causal, the last W keys being the queries'). Returns ``([B, W, H, d], None)``."""
    if dropout:
        raise ValueError(f"tiled_attention is for inference: dropout={dropout} must be 0 (call model.eval())")
    b, h, w, d = query.shape
    hk = key.shape[1]
    g = h // hk  # query heads per key head (grouped-query attention)
    n = key.shape[2]
    if attention_mask is None:
        seen = torch.ones(w, n, dtype=torch.bool, device=query.device).tril(n - w)[None, None]  # [1, 1, W, L]
    elif attention_mask.dtype == torch.bool:
        seen = attention_mask
    else:
        seen = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    scale = scaling if scaling is not None else d ** -0.5
    tiles, rows = -(-n // TILE), -(-(g * w) // QUERIES) * QUERIES  # rows: G*W queries padded to whole blocks
    if tiles * TILE > n:  # pad the last tile with invisible keys: every reduction has TILE terms
        key, value = _pad(key, tiles * TILE - n, 2), _pad(value, tiles * TILE - n, 2)
        seen = torch.nn.functional.pad(seen, (0, tiles * TILE - n), value=False)
    q = _pad((query * scale).reshape(b, hk, g * w, d), rows - g * w, 2)  # [B, H_kv, rows, d]
    q = q.reshape(b, hk, 1, rows // QUERIES, QUERIES, d)
    k = key.reshape(b, hk, tiles, 1, TILE, d).transpose(-1, -2)  # [B, H_kv, nT, 1, d, TILE]
    v = value.reshape(b, hk, tiles, 1, TILE, d)
    vis = seen.expand(b, 1, w, tiles * TILE).reshape(b, 1, 1, w, tiles, TILE).expand(b, hk, g, w, tiles, TILE)
    vis = _pad(vis.reshape(b, hk, g * w, tiles, TILE), rows - g * w, 2, False)  # [B, H_kv, rows, nT, TILE]
    vis = vis.permute(0, 1, 3, 2, 4).reshape(b, hk, tiles, rows // QUERIES, QUERIES, TILE)
    scores = torch.matmul(q, k)  # [B, H_kv, nT, blocks, QUERIES, TILE]: fixed-shape products, d-term sums
    scores = scores.masked_fill(~vis, float("-inf"))
    tops = scores.amax(-1, keepdim=True)  # [..., QUERIES, 1]
    p = torch.exp(scores - torch.where(torch.isinf(tops), torch.zeros_like(tops), tops))  # 0 where invisible
    sums = p.sum(-1, keepdim=True)  # TILE-term sums
    pv = torch.matmul(p, v)  # [B, H_kv, nT, blocks, QUERIES, d]: fixed-shape products, TILE-term sums
    top, total, acc = tops[:, :, 0], sums[:, :, 0], pv[:, :, 0]  # [B, H_kv, blocks, QUERIES, .]
    for i in range(1, tiles):  # merge the tiles in order (online softmax): a fixed order per query
        new_top = torch.maximum(top, tops[:, :, i])
        safe = torch.where(torch.isinf(new_top), torch.zeros_like(new_top), new_top)  # no -inf - -inf
        a, c = torch.exp(top - safe), torch.exp(tops[:, :, i] - safe)  # exactly 1 and 0 past a query's keys
        total = total * a + sums[:, :, i] * c
        acc = acc * a + pv[:, :, i] * c
        top = new_top
    out = (acc / total.clamp(min=torch.finfo(total.dtype).tiny)).reshape(b, hk, rows, d)[:, :, : g * w]
    return out.reshape(b, h, w, d).transpose(1, 2).contiguous(), None  # a query that sees nothing: zeros
def _pad(x: torch.Tensor, extra: int, dim: int, value=0.0) -> torch.Tensor:
    """``x`` with ``extra`` entries of ``value`` appended along ``dim``."""
    if not extra:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_full(shape, value)], dim)


def register() -> str:
    """Register `tiled_attention` in transformers' AttentionInterface (idempotent); its name."""

    AttentionInterface.register(NAME, tiled_attention)
    return NAME


@contextmanager
def use_tiled_attention(model):
    """Run ``model`` (a Hugging Face model) with `tiled_attention` inside the block, and with its own attention
    again after it (transformers' ``set_attn_implementation``)."""
    before = attention_implementation(model.config)
    model.set_attn_implementation(register())
    try:
        yield model
    finally:
        model.set_attn_implementation(before)


def row_invariant_copy(model):
    """A copy of a Hugging Face model (float32, CPU) whose every output row has the same bits in
    any batch: linear layers packed by `models.packed`, attention by `tiled_attention`. ``model``
    is left as it was. Refused, with the reason, where packing is not available.

    The HF model under a TransformerLens 4 bridge has the bridge's components in place of its
    own (they compute attention themselves, to fire ``hook_pattern``); the copy puts the HF
    modules back, so its attention goes through transformers' AttentionInterface. It fires no
    TransformerLens hooks: it is a verifier, not an instrument.

    The copy is made once per model and reused while no weight of ``model`` changes (each
    parameter's storage and in-place version are compared), so many schedulers over one model
    share one copy; an edited weight gets a fresh copy."""

    require_packable(model)
    stamp = version_stamp(model.parameters())
    cached = _COPIES.get(id(model))
    if cached is not None and cached[0]() is model and cached[1] == stamp:
        return cached[2]
    twin = _unbridged(copy.deepcopy(model).eval())
    pack_linears(twin)
    twin.set_attn_implementation(register())
    _COPIES[id(model)] = (weakref.ref(model), stamp, twin)
    weakref.finalize(model, _COPIES.pop, id(model), None)
    return twin


_COPIES: dict = {}  # id(model) -> (weak reference to it, weight stamp, its row-invariant copy)


def _unbridged(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every TransformerLens bridge component replaced by the HF module it wraps
    (its ``original_component``), at every depth."""
    for name, child in list(module.named_children()):
        inner = child
        while isinstance(getattr(inner, "original_component", None), torch.nn.Module):
            inner = inner.original_component
        if inner is not child:
            setattr(module, name, inner)
        _unbridged(inner)
    return module
