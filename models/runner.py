"""The one concrete thing that runs a model: `Runner`.

A `Runner` owns a Hugging Face causal LM and its guards (installed in its constructor, as PyTorch hooks through
their public API). Its ``cfg`` is TransformerLens's config, built from the HF config without a bridge
(``build_bridge_config_from_hf``). The TransformerLens bridge is built only when something needs its
wrappers (a hook name, ``run_with_cache``, ``blocks``...), and then it is TransformerLens's bridge, which
wraps the HF model in place as TransformerLens documents. A forward is the HF model's own either way: before the
bridge, HF's logits bit for bit; after it, through the wrappers, so every hook point fires (within float rounding of
HF's: the architecture matrix, tests/architectures.py).

>>> from beliefscope.models.testing import tiny_llama
>>> runner = tiny_llama()
>>> isinstance(runner, Runner), runner.built
(True, False)
"""

from __future__ import annotations

from typing import Any

import torch
from transformer_lens.model_bridge.sources import build_bridge_config_from_hf

from ..cache.guard import GUARD
from ..hooks.points import PlainPoint
from .bridge import build_bridge, guard_cache_handoff, input_device
from .forward import hf_named_tensors
from .profile import decoder_layers, model_shapes
from .tokenizer import tokenizer_adds_bos

_TL_ONLY = {"stop_at_layer", "start_at_layer", "tokens", "loss_per_token", "prepend_bos", "padding_side"}
#   keywords of TransformerLens's forward that HF's does not take: a forward with one runs the bridge's


class Runner(torch.nn.Module):
    """A HF causal LM, guarded, with TransformerLens's hooks by name on demand (see the module doc)."""

    def __init__(self, hf: torch.nn.Module, tokenizer: Any = None, name_or_path: str = "", arch: str | None = None):
        super().__init__()
        self.hf = hf  # the HF model: its parameters are this module's
        self.train(hf.training)  # the Runner's mode is its model's (a module starts in training mode)
        guard_cache_handoff(hf)
        self.tokenizer = tokenizer
        self.name_or_path = name_or_path or hf.config.name_or_path or type(hf).__name__
        self.arch = arch or (hf.config.architectures or [type(hf).__name__])[0]
        cfg = build_bridge_config_from_hf(hf.config, self.arch, self.name_or_path, next(hf.parameters()).dtype)
        cfg.device = str(input_device(hf))
        if tokenizer is not None:  # one BOS rule: as `tokenizer(text)` does (models.tokenizer)
            cfg.default_prepend_bos = tokenizer_adds_bos(tokenizer)
        self.cfg = cfg
        self.__dict__["_bridge"] = None  # built on first need (`bridge`)
        # the tensors building the bridge registered on the HF model (TransformerLens gives a bias-free unembedding
        # a zero bias): the checkpoint hash (probes.twin) leaves them out, so it is the same before and after
        self.bridge_added: frozenset = frozenset()
        setattr(self, GUARD, model_shapes)  # what KVCache.for_model reads the shapes with

    # ------------------------------------------------------------------ the model and its bridge
    @property
    def original_model(self) -> torch.nn.Module:
        """The HF model (TransformerLens's name for it)."""
        return self.hf

    @property
    def built(self) -> bool:
        """Whether the TransformerLens bridge has been built (and has wrapped the HF model)."""
        return self.__dict__["_bridge"] is not None

    @property
    def bridge(self):
        """TransformerLens's bridge over the HF model, built on first use (it wraps the model in place)."""
        if self.__dict__["_bridge"] is None:
            before = set(hf_named_tensors(self.hf))
            b = build_bridge(self.hf, self.arch, tok=self.tokenizer)
            self.bridge_added = frozenset(set(hf_named_tensors(self.hf)) - before)
            b.train(self.training)
            b.name_or_path = self.name_or_path
            self.__dict__["_bridge"] = b
        return self.__dict__["_bridge"]

    # ------------------------------------------------------------------ forwards
    def forward(self, input, return_type: str | None = "logits", **kwargs):
        """Logits ``[batch, pos, d_vocab]`` of the HF model (``return_type="logits"``); other return types, and
        strings, go through the bridge as TransformerLens defines them."""
        if isinstance(input, str) or (isinstance(input, list) and input and isinstance(input[0], str)):
            input = self.to_tokens(input)
        if return_type not in ("logits", None) or not torch.is_tensor(input) or self.compatibility_mode \
                or kwargs.keys() & _TL_ONLY:  # what only TransformerLens's forward does
            return self.bridge(input, return_type=return_type, **kwargs)
        out = self.hf(input_ids=input, **kwargs)  # through the wrappers once a hook name built them
        return None if return_type is None else out.logits

    def generate(self, *args, **kwargs):
        """TransformerLens's ``generate`` (through the bridge)."""
        return self.bridge.generate(*args, **kwargs)

    # ------------------------------------------------------------------ TransformerLens, by name
    def run_with_cache(self, *args, **kwargs):
        return self.bridge.run_with_cache(*args, **kwargs)

    def run_with_hooks(self, *args, **kwargs):
        return self.bridge.run_with_hooks(*args, **kwargs)

    def hooks(self, *args, **kwargs):
        return self.bridge.hooks(*args, **kwargs)

    def get_hook_point(self, name: str):
        return self.bridge.get_hook_point(name)

    def plain_hook_point(self, name: str):
        """``blocks.{l}.hook_resid_pre`` / ``hook_resid_post`` as a `hooks.points.PlainPoint` on the HF decoder
        layer, while no bridge is built (None otherwise, or for any other name: the bridge resolves those)."""
        parts = name.split(".")
        if self.built or len(parts) != 3 or parts[0] != "blocks" or not parts[1].isdigit():
            return None
        side = {"hook_resid_pre": "in", "hook_resid_post": "out"}.get(parts[2])
        layers = decoder_layers(self.hf)
        if side is None or int(parts[1]) >= len(layers):
            return None
        return PlainPoint(name, layers[int(parts[1])], side)

    @property
    def hook_dict(self) -> dict:
        return self.bridge.hook_dict

    @property
    def blocks(self):
        return self.bridge.blocks

    @property
    def embed(self):
        return self.bridge.embed

    @property
    def unembed(self):
        return self.bridge.unembed

    @property
    def ln_final(self):
        return self.bridge.ln_final

    @property
    def compatibility_mode(self) -> bool:
        return self.built and bool(getattr(self.bridge, "compatibility_mode", False))

    def enable_compatibility_mode(self, *args, **kwargs):
        return self.bridge.enable_compatibility_mode(*args, **kwargs)

    def to_tokens(self, input, prepend_bos: bool | None = None, **kwargs):
        """Token ids ``[batch, pos]`` as ``tokenizer(text)`` gives them (one BOS rule, `models.tokenizer`);
        ``prepend_bos=True`` puts a BOS first where the tokenizer adds none. Without a tokenizer, or with
        TransformerLens's other options, the bridge's ``to_tokens``."""
        if self.tokenizer is None or kwargs or (prepend_bos and self.tokenizer.bos_token_id is None):
            return self.bridge.to_tokens(input, prepend_bos=prepend_bos, **kwargs)  # TL picks a stand-in BOS
        texts = [input] if isinstance(input, str) else list(input)
        ids = self.tokenizer(texts, return_tensors="pt", padding=len(texts) > 1).input_ids  # [batch, pos]
        adds = tokenizer_adds_bos(self.tokenizer)
        bos = self.tokenizer.bos_token_id
        if prepend_bos and not adds and bos is not None:
            ids = torch.cat([torch.full((ids.shape[0], 1), bos, dtype=ids.dtype), ids], 1)
        elif prepend_bos is False and adds:
            ids = ids[:, 1:]
        return ids.to(self.cfg.device)

    def to_str_tokens(self, input, prepend_bos: bool | None = None, **kwargs):
        """The strings of `to_tokens`' ids (one string: a list; TransformerLens's other inputs: the bridge's)."""
        if self.tokenizer is None or kwargs or not isinstance(input, str):
            return self.bridge.to_str_tokens(input, prepend_bos=prepend_bos, **kwargs)
        return self.tokenizer.convert_ids_to_tokens(self.to_tokens(input, prepend_bos)[0].tolist())

    def to_string(self, *args, **kwargs):
        return self.bridge.to_string(*args, **kwargs)
