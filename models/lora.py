"""Low-rank adapters (LoRA, Hu et al. 2021) on a model's linear layers, with no extra dependency.

``W x`` becomes ``W x + (alpha / r) B A x`` with ``A [r, in]`` random, ``B [out, r]`` zero, so
the adapted model starts equal to the original; only A and B are trained.

>>> import torch
>>> from torch import nn
>>> net = nn.Sequential(nn.Linear(4, 4))
>>> x = torch.randn(2, 4)
>>> ref = net(x)
>>> add_lora(net, rank=2)
1
>>> torch.equal(net(x), ref), sorted(n for n, p in net.named_parameters() if p.requires_grad)
(True, ['0.lora_A', '0.lora_B'])
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trained low-rank update."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base  # the original layer (frozen)
        self.scale = alpha / rank  # update scale (alpha / r)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device))  # [r, in]
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))  # [out, r]
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        base.weight.requires_grad_(False)
        if base.bias is not None:
            base.bias.requires_grad_(False)

    def forward(self, x):  # x [..., in] -> [..., out]
        return self.base(x) + (x @ self.lora_A.T.to(x.dtype)) @ self.lora_B.T.to(x.dtype) * self.scale


def add_lora(model: nn.Module, rank: int = 8, alpha: float = 16.0,
             targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")) -> int:
    """Wrap every linear layer whose attribute name is in `targets` (or, for a bare module list,
    every linear child) in a `LoRALinear`; freezes everything else. Returns the number wrapped."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    for p in model.parameters():
        p.requires_grad_(False)
    n = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and (name in targets or name.isdigit()):
                setattr(module, name, LoRALinear(child, rank, alpha))
                n += 1
    return n


@torch.no_grad()
def merge_lora(model: nn.Module) -> int:
    """Fold every `LoRALinear` into its base layer (``W += scale * B A``) and put the plain
    ``nn.Linear`` back, so hooks, caches and weight packing see an ordinary model. Returns the
    number merged; the outputs are the adapted model's up to float rounding."""
    n = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                base = child.base
                base.weight += (child.lora_B @ child.lora_A).to(base.weight.dtype) * child.scale  # [out, in]
                setattr(module, name, base)
                n += 1
    return n
