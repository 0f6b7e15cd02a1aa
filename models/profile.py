"""What the toolkit needs to know about a model, read in one place.

- `ModelShapes`: layer count, heads, head size, width, context length, dtype and device, read
  from any HF causal LM or TransformerBridge (every cache is shaped from it).
- `ModelProfile`: what a model *name* implies before loading it: which task rendering its
  tokenizer reads (the toy word grammar or natural English) and whether it is a Thinking States
  checkpoint. It replaces name switches such as ``model == "smollm2"``.

>>> from beliefscope.models.testing import tiny_llama
>>> s = model_shapes(tiny_llama())
>>> (s.n_layers, s.n_heads, s.kv_heads, s.d_head)
(2, 4, 2, 8)
>>> model_profile("smollm2").rendering, model_profile("target").rendering
('natural', 'toy')
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..hooks.names import hf_of  # noqa: F401  (re-exported: models.profile.hf_of)
from .cards import read_card
from .devices import HOST
from .internals import accelerate_hooks
from .names import SMOLLM2, checkpoint_path


@dataclass(frozen=True)
class ModelShapes:
    """Shapes of a causal LM, as its HF config states them."""

    n_layers: int  # decoder blocks
    n_heads: int  # query heads per block
    kv_heads: int  # key/value heads per block (< n_heads for grouped-query attention)
    d_head: int  # size of one head's query/key/value vector
    d_model: int  # width of the residual stream
    n_ctx: int  # positions the model can address (n_positions / max_position_embeddings)
    dtype: torch.dtype  # dtype of the weights
    device: torch.device  # device of the weights
    name: str  # the config's _name_or_path, or the class name
    windows: tuple  # per layer: sliding-window length (keys within `w` positions), or None for full attention
    layer_devices: tuple = ()  # per decoder layer: where it computes (several devices for a split model)


def model_shapes(model) -> ModelShapes:
    """Read `ModelShapes` from a TransformerBridge or a HF causal LM."""
    hf = hf_of(model)
    c = hf.config
    heads = getattr(c, "num_attention_heads", None) or c.n_head
    d_model = getattr(c, "hidden_size", None) or c.n_embd
    param = next(hf.parameters())
    try:
        layers = tuple(compute_device(m) for m in decoder_layers(hf))
    except ValueError:  # an architecture without the usual block list: one device
        layers = ()
    return ModelShapes(
        n_layers=getattr(c, "num_hidden_layers", None) or c.n_layer,
        n_heads=heads,
        kv_heads=kv_heads(c, heads),
        d_head=getattr(c, "head_dim", None) or d_model // heads,
        d_model=d_model,
        n_ctx=getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None) or 2048,
        dtype=param.dtype,
        device=compute_device(embedding_of(hf)),
        name=getattr(c, "name_or_path", "") or type(hf).__name__,
        windows=sliding_windows(c),
        layer_devices=layers or (compute_device(hf),) * (getattr(c, "num_hidden_layers", None) or c.n_layer),
    )


def writes_thoughts(model) -> bool:
    """Whether a loaded model writes thoughts of its own (Thinking States, ``models.thinking``): such a
    model runs like any other, but its beliefs are read after its thoughts, chunk by chunk. Every caller
    that reads a model differently for that asks this, and nothing else.

    >>> from beliefscope.models.testing import tiny_gpt2
    >>> writes_thoughts(tiny_gpt2())
    False
    """
    return "thinking_config" in getattr(model, "__dict__", ())  # ~0.1 us: every forward's door asks (models.forward)


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder blocks of a HF model: ``layers`` or ``h`` on its base model (Llama, GPT-2, GPT-NeoX and most
    families), or on the base model's ``decoder`` (OPT)."""
    base = getattr(model, "base_model", None) or getattr(model, "model", None) or getattr(model, "transformer", None)
    for holder in (base, getattr(base, "decoder", None), model):
        for name in ("layers", "h"):
            layers = getattr(holder, name, None) if holder is not None else None
            if isinstance(layers, torch.nn.ModuleList):
                return layers
    raise ValueError(f"cannot find the decoder blocks of {type(model).__name__}")


def embedding_of(hf) -> torch.nn.Module:
    """The input embedding of a HF model (its first parameter's module for a base model without the accessor)."""
    try:
        return hf.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return hf


def compute_device(module: torch.nn.Module) -> torch.device:
    """Where ``module`` computes: the execution device `accelerate` gave it when it placed the model (an
    offloaded module's weights wait on the ``meta`` device meanwhile), else its first parameter's device."""
    for h in accelerate_hooks(module):
        dev = getattr(h, "execution_device", None)
        if dev is not None:
            return torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
    p = next(module.parameters(), None)
    return p.device if p is not None else HOST


def kv_heads(config, heads: int) -> int:
    """Key/value heads per cached layer: ``num_key_value_heads``, or Falcon's layout (multi-query:
    1; the new decoder architecture caches keys repeated to every query head; else ``num_kv_heads``).

    >>> from transformers import FalconConfig
    >>> kv_heads(FalconConfig(num_attention_heads=4, multi_query=True, new_decoder_architecture=False), 4)
    1
    """
    if getattr(config, "num_key_value_heads", None):
        return config.num_key_value_heads
    if getattr(config, "model_type", "") == "falcon":
        if getattr(config, "new_decoder_architecture", False):
            return heads
        return 1 if config.multi_query else heads
    return heads


def sliding_windows(config) -> tuple:
    """Per layer, the sliding window a HF config gives it (None: full attention), read the way
    transformers' decoders read it: ``layer_types`` (Gemma 2/3, Qwen2/3, ...) name each layer's kind;
    without them a ``sliding_window`` (Mistral, Phi-3) applies to every layer.

    >>> from transformers import MistralConfig, Gemma2Config
    >>> sliding_windows(MistralConfig(num_hidden_layers=2, sliding_window=8))
    (8, 8)
    >>> sliding_windows(Gemma2Config(num_hidden_layers=3, sliding_window=8))
    (8, None, 8)
    """
    n = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None) or 0
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not isinstance(window, int) or window <= 0:
        return (None,) * n
    if types:
        return tuple(window if t == "sliding_attention" else None for t in types)
    return (window,) * n


@dataclass(frozen=True)
class ModelProfile:
    """What a model name implies, known before the model is loaded."""

    name: str  # the name or path as given
    rendering: str  # task rendering its tokenizer reads: "toy" (word grammar) or "natural" (English)
    thinking: bool  # a Thinking States checkpoint (load with models.thinking.ckpt.load_thinking)
    pretrained: bool  # a real pretrained LM (not trained here on the toy grammar)


def model_profile(name: str) -> ModelProfile:
    """Profile of a shipped name, a checkpoint folder or a hub name (hub names: natural English)."""

    if name == SMOLLM2:
        return ModelProfile(name=name, rendering="natural", thinking=False, pretrained=True)
    path = checkpoint_path(name, must_exist=False)
    card = read_card(path) if path else {}
    if card:
        return ModelProfile(name=name, rendering=card.get("rendering", "toy"),
                            thinking=card.get("kind") == "thinking", pretrained=card.get("kind") == "adapters")
    return ModelProfile(name=name, rendering="natural", thinking=False, pretrained=True)
