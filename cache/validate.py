"""Checks every write against the shape, dtype and device the cache was built for.

Errors name the expected value, what was written, and how to build a matching cache.

>>> from beliefscope.cache.testing import tiny_cache
>>> tiny_cache().config.n_layers > 0
True
"""

from __future__ import annotations

import torch

from .layout import Layout


class ValidateMixin:
    """`_check` each update; `_adopt_shape` fills in shape fields a config left open."""

    def _check(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> None:
        c = self.config
        s = k.shape
        # Fast path (every decode step, every layer): everything matches a fully specified config.
        # Anything else (open fields, a str device, a mismatch) takes the full check below.
        if (layer < c.n_layers and len(s) == 4 and s == v.shape and s[0] == c.batch and s[1] == c.kv_heads
                and s[3] == c.d_head and k.dtype == c.dtype
                and k.device == (c.device if c.layer_devices is None else c.layer_devices[layer])):
            return
        if layer >= c.n_layers:
            raise ValueError(
                f"update for layer {layer}, but this cache was built for {c.n_layers} layers "
                f"(model {c.model_name!r}); valid layers are 0..{c.n_layers - 1}. "
                "Build the cache with KVCache.for_model(<this model>)."
            )
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(f"keys/values must be [batch, kv_heads, n_new, d_head] and equal; got {tuple(k.shape)}"
                             f" and {tuple(v.shape)}")
        b, h, _, d = k.shape
        for name, want, got in (("batch", c.batch, b), ("kv_heads", c.kv_heads, h), ("d_head", c.d_head, d)):
            if want is not None and want != got:
                raise ValueError(
                    f"cache shape mismatch: this cache was built for {name}={want} (model {c.model_name!r}, "
                    f"n_layers={c.n_layers}, kv_heads={c.kv_heads}, d_head={c.d_head}, batch={c.batch}) but layer "
                    f"{layer} wrote {name}={got}. Build a new cache with KVCache.for_model(<this model>, batch={b})."
                )
        if c.dtype is not None and k.dtype != c.dtype:
            raise TypeError(f"dtype mismatch: cache holds {c.dtype}, layer {layer} wrote {k.dtype}. "
                            f"Build the cache with dtype={k.dtype} or cast the model with .to({c.dtype}).")
        want = c.device if c.layer_devices is None else c.layer_devices[layer]
        if want is not None and torch.device(k.device) != torch.device(want):
            raise TypeError(f"device mismatch: the cache keeps layer {layer} on {want}, and the layer wrote on "
                            f"{k.device}. Build the cache with KVCache.for_model(<this model>) after placing the model "
                            f"(it puts each layer's buffers where the layer computes), or move the model to {want}.")

    def _adopt_shape(self, k: torch.Tensor) -> None:
        c = self.config
        c.batch, c.kv_heads, c.d_head = k.shape[0], k.shape[1], k.shape[3]
        c.dtype = c.dtype or k.dtype
        c.device = c.device or k.device
        if not self.layout.batch:
            self.layout = Layout(c.batch)
