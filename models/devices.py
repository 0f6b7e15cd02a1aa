"""Where and in what precision models load: the default device and dtype, settable for a block.

>>> default_device("cpu"), resolve_dtype("bfloat16")
(device(type='cpu'), torch.bfloat16)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from contextlib import contextmanager

import torch

HOST = torch.device("cpu")  # where weights are staged, hashed and saved (compute goes to default_device())

# What `load_model` uses when its caller gives no device / dtype; set for a block with `model_defaults`
# (the CLI's --device / --dtype). None: CUDA when available, else the CPU; float32.
_DEFAULTS: dict = {"device": None, "dtype": None, "placement": None}
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's named strategies
_SIZE = re.compile(r"^\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$", re.IGNORECASE)
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


def parse_device_map(text):
    """``--device-map``: a strategy (auto, balanced, balanced_low_0, sequential), a JSON object of module ->
    device (``"cpu"``, ``"disk"``, ``0``, ``"cuda:1"``) or a path to a JSON file holding one.

    >>> parse_device_map("auto"), parse_device_map('{"model.layers.0": "cpu", "lm_head": "disk"}')
    ('auto', {'model.layers.0': 'cpu', 'lm_head': 'disk'})
    """
    if text is None or isinstance(text, dict) or text in DEVICE_MAPS:
        return text
    raw = open(text).read() if os.path.isfile(text) else text
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"--device-map {text!r} is not one of {', '.join(DEVICE_MAPS)}, a JSON object of module -> "
                         "device or a JSON file holding one: e.g. --device-map auto, or "
                         "'{\"model.embed_tokens\": 0, \"model.layers.0\": 0, \"model.layers.1\": \"cpu\", "
                         "\"lm_head\": \"disk\"}'")
    return value


def parse_max_memory(text):
    """``--max-memory DEVICE=SIZE,...`` as accelerate's dict: GPU indices as ints, ``cpu`` and ``disk`` as names.

    >>> parse_max_memory("0=20GiB,cuda:1=30GiB,cpu=64GiB")
    {0: '20GiB', 1: '30GiB', 'cpu': '64GiB'}
    """
    if text is None or isinstance(text, dict):
        return text
    out = {}
    for part in str(text).split(","):
        dev, _, size = part.partition("=")
        dev, size = dev.strip(), size.strip()
        key = int(dev) if dev.isdigit() else int(dev[5:]) if re.fullmatch(r"cuda:\d+", dev) else dev
        if key not in ("cpu", "disk", "mps") and not isinstance(key, int) or not _SIZE.match(size):
            raise ValueError(f"--max-memory {text!r}: {part!r} is not DEVICE=SIZE (DEVICE: 0, cuda:1, cpu or disk; "
                             "SIZE: e.g. 20GiB or 500MB), e.g. --max-memory 0=20GiB,cpu=64GiB")
        out[key] = size.replace(" ", "")
    return out


def placement_kwargs(device_map=None, max_memory=None, offload_folder=None) -> dict | None:
    """`from_pretrained` keywords that place a model over devices, checked; None when no device map is given."""
    device_map, max_memory = parse_device_map(device_map), parse_max_memory(max_memory)
    if device_map is None:
        if max_memory or offload_folder:
            raise ValueError("--max-memory and --offload-folder place a model over devices: give --device-map too "
                             "(e.g. --device-map auto)")
        return None

    if importlib.util.find_spec("accelerate") is None:
        raise ValueError("--device-map needs the `accelerate` package: pip install accelerate")
    if isinstance(device_map, dict) and "disk" in map(str, device_map.values()) and not offload_folder:
        raise ValueError("--device-map puts modules on 'disk': give --offload-folder DIR, where their weights are "
                         "written")
    kw = {"device_map": device_map}
    if max_memory:
        kw["max_memory"] = max_memory
    if offload_folder:
        kw["offload_folder"] = offload_folder
    return kw


def placement() -> dict | None:
    """The device map `model_defaults` set for `load_model` (None: the whole model on one device)."""
    return _DEFAULTS["placement"]


@contextmanager
def model_defaults(device=None, dtype=None, device_map=None, max_memory=None, offload_folder=None):
    """Within the block, `load_model` calls that give no device / dtype use these (checked at once); with a
    ``device_map`` (see `placement_kwargs`) they place the model over devices, CPU and disk with `accelerate`.

    >>> with model_defaults(device="cpu", dtype="bfloat16"):
    ...     default_device(), resolve_dtype()
    (device(type='cpu'), torch.bfloat16)
    """
    new = {"device": None if device is None else default_device(device),
           "dtype": None if dtype is None else resolve_dtype(dtype),
           "placement": placement_kwargs(device_map, max_memory, offload_folder)}
    old = dict(_DEFAULTS)
    _DEFAULTS.update(new)
    try:
        yield
    finally:
        _DEFAULTS.update(old)


def current_defaults() -> dict:
    """``{"device", "dtype"}`` that the enclosing `model_defaults` block set (None where it set none)."""
    return {"device": _DEFAULTS["device"], "dtype": _DEFAULTS["dtype"]}


def rank_device(device: str, local_rank: int) -> str | None:
    """The device of one torchrun process: ``auto`` is ``cuda:LOCAL_RANK`` (modulo the GPUs of this node) when the
    node has GPUs, else the CPU; any other value is used as given.

    >>> rank_device("cpu", 3)
    'cpu'
    """
    if device != "auto":
        return device
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"cuda:{local_rank % n}" if n else "cpu"
