"""The random-init twin of a model (the same config, fresh weights: the control a probe is read against)
and the weights hash that tells a model from its twin.

Usage (not run as a doctest: it needs a model)::

    twin, seed = random_twin(bridge, seed=0)
    checkpoint_hash(twin) != checkpoint_hash(bridge)
"""

from __future__ import annotations

import hashlib

import torch
from beliefscope.models.profile import hf_of


def checkpoint_hash(model) -> str:
    """sha256 over the model's parameters and buffers (names, shapes and bytes), 16 hex digits.

    A tensor reachable under several names (tied embeddings, the bridge's aliases of HF modules:
    SmolLM2's state dict lists its 0.54 GB of weights 3-4 times) is hashed once, under its first name."""
    hf = hf_of(model)
    h = hashlib.sha256()
    seen = set()
    for name, t in sorted(hf.state_dict().items()):
        key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
        if key in seen:
            continue
        seen.add(key)
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy())  # the bytes in place (no copy)
    return "v2-" + h.hexdigest()[:16]


def random_twin(model, seed: int = 0, tries: int = 8):
    """(random-init twin, the seed it used): the twin of `seed`, or of the next seed where that twin's weights
    are the model's own (a folder model that *is* a random init of seed 0 would otherwise be its own control)."""
    want = checkpoint_hash(model)
    for s in range(seed, seed + tries):
        twin = random_init_like(model, s)
        if checkpoint_hash(twin) != want:
            return twin, s
    raise RuntimeError(f"the random-init twins of seeds {seed}-{seed + tries - 1} all equal the model: is the model "
                       "untrained? pass --no-random-init")


def random_init_like(model, seed: int = 0):
    """A freshly initialised model with the same HF config, wrapped as a bridge, on the model's device and dtype.

    The weights are drawn on the host (the same twin for a seed on any device), then moved."""
    from beliefscope.models.load import bridge_from_hf

    hf = hf_of(model)
    like = next(hf.parameters())
    torch.manual_seed(seed)
    twin = type(hf)(hf.config).to(device=like.device, dtype=like.dtype).eval()
    bridge = bridge_from_hf(twin, getattr(model, "tokenizer", None))
    bridge.eval()
    bridge.name_or_path = f"random-init(seed={seed}) of {getattr(model, 'name_or_path', type(hf).__name__)}"
    return bridge
