"""Where and in what precision models load: the default device and dtype, settable for a block.

>>> default_device("cpu"), resolve_dtype("bfloat16")
(device(type='cpu'), torch.bfloat16)
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

HOST = torch.device("cpu")  # where weights are staged, hashed and saved (compute goes to default_device())

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
