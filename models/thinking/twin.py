"""The twin a `ThinkingStates` model runs its hooks on: a second HF model of the backbone's class holding the
backbone's very Parameters, so that TransformerLens's bridge, when a hook name builds it, wraps the twin and never
the backbone the thoughts are computed on."""

from __future__ import annotations

import torch
from torch import nn

TWIN = "hf."  # the state-dict prefix of the twin (Runner.hf): entries a checkpoint neither holds nor needs


def twin_not_missing(module, incompatible) -> None:
    """A state dict without the twin's entries loads in full: they are the backbone's, loaded with it."""
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if not k.startswith(TWIN)]


def twin_of(backbone: nn.Module) -> nn.Module:
    """A second HF model of ``backbone``'s class holding the very same parameters (and its buffers), built on
    the meta device (no weights allocated): TransformerLens's bridge may wrap the twin's modules, never the
    backbone's, so the thought pass stays a plain HF forward."""
    with torch.device("meta"):
        twin = type(backbone)(backbone.config)
    state = backbone.state_dict(keep_vars=True)
    twin.load_state_dict(state, assign=True, strict=False)  # the same Parameters
    for name, buf in backbone.named_buffers(remove_duplicate=False):  # non-persistent ones (rotary frequencies)
        owner, _, attr = name.rpartition(".")  # are not in a state dict
        twin.get_submodule(owner).register_buffer(attr, buf, persistent=name in state)
    mine = dict(backbone.named_modules(remove_duplicate=False))
    for name, module in twin.named_modules(remove_duplicate=False):  # plain tensor attributes set in __init__
        for attr, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and value.is_meta and name in mine:
                setattr(module, attr, getattr(mine[name], attr))
    left = [n for n, t in [*twin.named_parameters(), *twin.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"the twin of this {type(backbone).__name__} keeps tensors with no values ({left[:3]}): its "
                         "class builds state that its state dict and buffers do not hold; Thinking States cannot "
                         "wrap it for hooks")
    return twin.train(backbone.training)
