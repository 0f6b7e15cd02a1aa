"""Which module a forward calls, and what its HF tree is, with or without TransformerLens's wrappers.

A `models.runner.Runner` runs its Hugging Face model's own forward. TransformerLens's bridge is built only
when a hook name needs its wrappers (`models.runner`); building it wraps the HF modules in place, as
TransformerLens documents, and from then on the same forward runs through the wrappers, so every hook point
fires. Nothing here copies, swaps or rebinds another library's modules: `forward_module` is the HF model
itself, and `hf_named_tensors` reads the wrapped tree through TransformerLens's public ``original_component``.

>>> import torch
>>> from beliefscope.models.testing import tiny_llama
>>> runner = tiny_llama()
>>> forward_module(runner) is runner.hf
True
>>> any(map(is_wrapper, runner.hf.modules()))      # no hook name has needed the bridge yet
False
>>> _ = runner.bridge                              # built on demand: the HF modules are wrapped in place
>>> any(map(is_wrapper, runner.hf.modules())), forward_module(runner) is runner.hf
(True, True)
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent

from ..hooks.names import hf_of
from .internals import forward_hooks


def is_wrapper(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a TransformerLens generalized component (it wraps an original module)."""
    return isinstance(module, GeneralizedComponent)


def unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    """The HF module a TransformerLens wrapper holds (``module`` itself when it is none)."""
    while isinstance(module, GeneralizedComponent):
        module = module.original_component
    return module


@functools.singledispatch
def forward_module(model) -> torch.nn.Module:
    """The module a forward of ``model`` (a Runner, a bridge or a HF model) calls: its HF model, wrapped by
    TransformerLens where a hook name needed the bridge. A Thinking States model refuses
    (`models.thinking.model` registers the refusal): its HF model alone is its backbone without the thoughts
    its answers are read after, so a forward here would be a silently different model."""
    return hf_of(model)


def hf_named_tensors(hf: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """``{HF name: tensor}`` of every parameter and buffer of ``hf`` under the names the HF model has
    without wrappers: a wrapper is read through its ``original_component``, and the aliases TransformerLens
    registers on the wrappers themselves are skipped. A tensor reachable under several names is listed under each."""
    module = unwrapped(hf)
    out = {prefix + n: t for n, t in module.named_parameters(recurse=False)}
    out.update({prefix + n: t for n, t in module.named_buffers(recurse=False)})
    for name, child in module.named_children():
        out.update(hf_named_tensors(child, f"{prefix}{name}."))
    return out


def last_logits_only(hf: torch.nn.Module) -> dict:
    """``{"logits_to_keep": 1}`` where a forward of ``hf`` may compute the last position's logits alone (what HF's
    own ``generate`` passes at prefill: a SmolLM2 prefill of 512 tokens otherwise spends a third of its time on
    logits it discards), else ``{}``. Its forward must take the argument, and its output layer must be the plain
    module with no hook on it: a TransformerLens wrapper's hook points, or a user's hook, would otherwise see one
    position instead of every one."""
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    if head is None or is_wrapper(head) or _hooked(head):
        return {}
    return {"logits_to_keep": 1} if _takes_logits_to_keep(type(hf)) else {}


def _hooked(module: torch.nn.Module) -> bool:
    """Whether a forward hook or pre-hook sits on ``module``."""
    return bool(forward_hooks(module))


def takes_logits_to_keep(hf: torch.nn.Module) -> bool:
    """Whether ``hf``'s forward takes ``logits_to_keep`` (an int, or a tensor of the positions whose logits it
    computes), as transformers' causal LMs do."""
    return _takes_logits_to_keep(type(hf))


@functools.cache
def _takes_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters
