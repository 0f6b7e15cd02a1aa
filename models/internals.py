"""The members of other libraries this project reads that have no public name, each read here alone.

A new release of torch, transformers or accelerate that renames one breaks this module, and nothing else; each
function says why no public way serves. Nothing here writes to another library's object.

>>> import torch
>>> layer = torch.nn.Linear(2, 2)
>>> forward_hooks(layer)
[]
>>> before = version_stamp(layer.parameters())
>>> with torch.no_grad():
...     _ = layer.weight.mul_(2)       # an in-place edit: the stamp changes, the storage does not
>>> version_stamp(layer.parameters()) == before
False
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def forward_hooks(module: torch.nn.Module) -> list:
    """The functions registered on ``module`` with ``register_forward_hook`` and ``register_forward_pre_hook``.
    PyTorch keeps them in the dictionaries ``nn.Module`` documents as where hooks live, and gives no public way
    to list them; a replayed forward must know whether any would be skipped (`decoding.graphed`)."""
    return [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]


def version(tensor: torch.Tensor) -> int:
    """The in-place version counter of ``tensor`` (autograd's; no public name): it changes with every in-place
    edit. The per-forward check of a packed weight (`models.packed`) reads it alone, as cheaply as it can be."""
    return tensor._version


def version_stamp(tensors: Iterable[torch.Tensor]) -> tuple:
    """``(storage pointer, in-place version)`` of every tensor: it changes when a tensor is replaced or edited in
    place (steering, fine-tuning), so a value derived from weights can be kept until then. The version counter
    is autograd's, and has no public name."""
    return tuple((t.data_ptr(), version(t)) for t in tensors)


def attention_implementation(config) -> str | None:
    """The attention kernel a transformers model runs (``"sdpa"``, ``"eager"``, a registered name), or None.
    transformers exposes it as the ``_attn_implementation`` property of its configs (and documents it so); it
    is set with the public ``PreTrainedModel.set_attn_implementation``."""
    return getattr(config, "_attn_implementation", None)


def no_split_modules(model) -> list[str]:
    """The module classes a transformers model says must stay on one device (``_no_split_modules``, the class
    attribute accelerate's placement reads; transformers gives it no public name)."""
    return list(getattr(model, "_no_split_modules", None) or [])


def accelerate_hooks(module: torch.nn.Module) -> list:
    """The hooks accelerate attached to ``module`` when it placed a model (``_hf_hook``, a single hook or a
    sequential one; accelerate gives no public getter): where an offloaded module computes is on them."""
    hook = getattr(module, "_hf_hook", None)
    return list(getattr(hook, "hooks", None) or ([hook] if hook is not None else []))
