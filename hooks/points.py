"""Hook points read straight from the Hugging Face modules, with or without TransformerLens's wrappers.

A TransformerLens 4 block wrapper (``BlockBridge``) passes its input through ``hook_in``
(``blocks.{l}.hook_resid_pre``) and the first tensor of its output through ``hook_out``
(``blocks.{l}.hook_resid_post``), and between the two it calls the HF decoder layer it wraps. The
same values are the HF layer's input and output, so a plain PyTorch hook on the HF layer (nnsight's
way) sees them without the wrappers. A `models.runner.Runner` whose bridge is not built resolves those two
names to a `PlainPoint` on the HF layer, so a capture of them builds no bridge. Once the bridge is built,
`attach(point, fn)` still hooks the HF layer for those hook points, and returns None for every other one (the
caller then uses ``HookPoint.add_hook``): hook points with a conversion, and those of attention and MLP
wrappers, which may compute their values without calling the HF module they hold.

>>> from beliefscope.models.testing import tiny_llama
>>> runner = tiny_llama()
>>> seen = []
>>> handle = attach(runner.plain_hook_point("blocks.1.hook_resid_post"), lambda act, hook: seen.append(act.shape))
>>> _ = runner(torch.tensor([[1, 2, 3]]))
>>> seen, handle.remove(), runner.built
([torch.Size([1, 3, 32])], None, False)
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent

# hook point -> the block wrapper it belongs to, kept beside the hook points (nothing is written on them)
_OWNERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass(eq=False)
class PlainPoint:
    """A block's input or output read straight from its HF decoder layer, with no TransformerLens bridge built
    (a `models.runner.Runner` gives these): what `attach` hooks, under TransformerLens's name for it."""

    name: str  # e.g. "blocks.3.hook_resid_post"
    module: torch.nn.Module  # the HF decoder layer
    side: str  # "in" (its input) or "out" (the first tensor of its output)

    def layer(self) -> int:
        return int(self.name.split(".")[1])


def owner(point) -> tuple[torch.nn.Module, str] | None:
    """``(the HF module, "in" or "out")`` whose input or output hook point ``point`` carries, or None.
    Only `PLAIN_POINTS` qualify (the matrix in tests/architectures.py checks each against the wrappers)."""
    if isinstance(point, PlainPoint):
        return point.module, point.side
    wrapper = _OWNERS.get(point)
    if wrapper is None or getattr(point, "hook_conversion", None) is not None:
        return None
    original = wrapper.original_component
    if original is None:
        return None
    return original, ("in" if point is getattr(wrapper, "hook_in", None) else "out")


# wrapper class (or a base of it) -> its hook points that carry the HF module's own input / output
# (a block wrapper always calls its HF layer; an MLP or attention wrapper may compute without calling its
# HF module, e.g. Phi-3's fused gate-up MLP, so a hook on that module would miss the wrapped forwards)
PLAIN_POINTS = {"BlockBridge": ("hook_in", "hook_out")}


def index_owners(model) -> None:
    """Note on each such hook point the wrapper it belongs to (once per model; see `PLAIN_POINTS`)."""
    for module in model.modules():
        if not isinstance(module, GeneralizedComponent) or module.original_component is None:
            continue
        bases = [c.__name__ for c in type(module).__mro__]
        for side in next((PLAIN_POINTS[b] for b in bases if b in PLAIN_POINTS), ()):
            point = getattr(module, side, None)
            if point is not None:
                _OWNERS[point] = module


def attach(point, fn):
    """Call ``fn(act, hook=point)`` with ``point``'s value from a PyTorch hook on the HF module it
    reads (a returned tensor replaces the value, as with ``HookPoint.add_hook``). Returns the handle,
    or None where the value is not the HF module's own input or output."""
    found = owner(point)
    if found is None:
        return None
    module, side = found
    if side == "in":
        def pre(mod, args, kwargs):
            if args and torch.is_tensor(args[0]):
                new = fn(args[0], hook=point)
                return None if new is None else ((new, *args[1:]), kwargs)
            if torch.is_tensor(kwargs.get("hidden_states")):
                new = fn(kwargs["hidden_states"], hook=point)
                return None if new is None else (args, {**kwargs, "hidden_states": new})
            return None

        return module.register_forward_pre_hook(pre, with_kwargs=True)

    def post(mod, args, output):
        first = output[0] if isinstance(output, tuple) else output
        new = fn(first, hook=point)
        if new is None:
            return None
        return (new, *output[1:]) if isinstance(output, tuple) else new

    return module.register_forward_hook(post)
