"""The random-init twin of a model (the same config, fresh weights: the control a probe is read against)
and the weights hash that tells a model from its twin.

Usage (not run as a doctest: it needs a model)::

    twin, seed = random_twin(bridge, seed=0)
    checkpoint_hash(twin) != checkpoint_hash(bridge)
"""

from __future__ import annotations

import hashlib

import torch

from ..models.devices import HOST
from ..models.forward import hf_named_tensors
from ..models.load import bridge_from_hf
from ..models.profile import compute_device, embedding_of, hf_of


def checkpoint_hash(model) -> str:
    """sha256 over the model's parameters and buffers (names, shapes and bytes), 16 hex digits.

    A tensor reachable under several names (tied embeddings, the bridge's aliases of HF modules:
    SmolLM2's state dict lists its 0.54 GB of weights 3-4 times) is hashed once, under its first name."""
    hf = hf_of(model)
    state = hf_named_tensors(hf)  # the HF names, whether or not a TransformerLens bridge has wrapped the model
    added = getattr(model, "bridge_added", frozenset())  # a Runner: the tensors building its bridge registered
    h = hashlib.sha256()
    seen = set()
    for name in sorted(set(state) - added):
        t = state[name]
        offloaded = t.device.type == "meta"  # placed on the CPU or disk by accelerate: read from its offload
        key = ("meta", id(t)) if offloaded else (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
        if key in seen:
            continue
        seen.add(key)
        if offloaded:
            t = _offloaded(hf, name)
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())  # the bytes in place
    return "v3-" + h.hexdigest()[:16]


def _offloaded(hf, name: str) -> torch.Tensor:
    """The values of an offloaded parameter or buffer (``accelerate`` keeps it on 'meta' between forwards)."""
    from accelerate.utils import align_module_device  # deferred: optional dependency

    owner, _, attr = name.rpartition(".")
    module = hf.get_submodule(owner)
    with align_module_device(module, HOST):
        return getattr(module, attr).detach().clone()


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

    The weights are drawn on the host (the same twin for a seed on any device), then moved; a model split over
    devices (``--device-map``) gets a twin split the same way."""

    hf = hf_of(model)
    torch.manual_seed(seed)
    twin = type(hf)(hf.config).to(dtype=next(hf.parameters()).dtype).eval()
    placed = getattr(hf, "hf_device_map", None)
    if placed and len(set(map(str, placed.values()))) > 1:  # split over devices: the twin is split the same
        # way, with what sat on disk kept in memory (it has no file)
        from accelerate import dispatch_model  # deferred: optional dependency

        twin = dispatch_model(twin, device_map={k: HOST.type if v == "disk" else v for k, v in placed.items()})
    else:
        twin = twin.to(compute_device(embedding_of(hf)))
    bridge = bridge_from_hf(twin, getattr(model, "tokenizer", None))
    bridge.eval()
    bridge.name_or_path = f"random-init(seed={seed}) of {getattr(model, 'name_or_path', type(hf).__name__)}"
    return bridge
