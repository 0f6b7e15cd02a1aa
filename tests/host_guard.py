"""A second device on a CPU-only machine: catch tensors made without the model's device, without a GPU.

On a GPU, a tensor built with no ``device=`` lands on the host while the model's tensors live on the
card, and the first op that mixes them fails ("Expected all tensors to be on the same device"). On a
CPU-only machine both are the CPU, so such code passes every test and breaks for every GPU user.

`host_guard` replays CUDA's placement rules with tags, while everything still runs on the CPU:

- a tensor is *host* when a factory made it without ``device=`` (``torch.tensor``, ``arange``,
  ``zeros``, ``from_numpy``, a tokenizer's ``return_tensors="pt"``...), with ``device="cpu"``, or by
  ``.cpu()`` / ``.to("cpu")``; an op whose tensor inputs are all host gives host outputs;
- every other tensor is on the *device*: the model's weights, tensors made with ``device=x.device``,
  ``.to(model.device)``, and whatever an op computes from them;
- an op that mixes a host tensor of one or more dimensions with a device tensor raises
  `HostDeviceMix`, naming the op and where the host tensor was made (CUDA allows host scalars, and
  indexing a device tensor with host indices, so these pass here too); so does ``.numpy()`` of a
  device tensor.

What it cannot catch: a device given as ``torch.device("cpu")`` (taken as the device, not the host);
modules built inside the guard without a device (``nn.Linear(...)``: its weights count as device);
placement that happens in C++ without a Python-visible op; kernels that exist on the CPU and not on
CUDA, or differ in numerics there.

>>> import torch
>>> w = torch.ones(3, 2)                    # made before the guard: the "device"
>>> with host_guard():
...     ok = w[torch.tensor([0, 2])] + torch.arange(2, device=w.device)  # host indices are allowed
...     torch.index_select(w, 0, torch.tensor([0, 1]))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
tests.host_guard.HostDeviceMix: index_select at ... mixes a host tensor ... with a device tensor...
"""

from __future__ import annotations

import linecache
import os
import sys
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class HostDeviceMix(RuntimeError):
    """An op mixes a tensor left on the host with tensors on the model's device (a crash on a GPU)."""


# ops that may take host tensors beside device ones on CUDA (indices, sizes) or that only read metadata
_ALLOWED = {"__getitem__", "__setitem__", "index_put_", "index_put", "size", "dim", "numel", "__len__",
            "__repr__", "__format__", "__str__", "tolist", "item", "__bool__", "__int__", "__float__",
            "__index__", "__eq__", "__ne__", "is_floating_point", "element_size", "data_ptr", "stride",
            "__hash__", "__reduce_ex__", "__deepcopy__", "storage_offset", "is_contiguous", "copy_"}
_LIKE = {"zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like",
         "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "clone"}


def _name(func) -> str:
    return getattr(func, "__name__", None) or str(func)


def _caller() -> str:
    """Where the host tensor was made: the innermost frame of this project's code (not a library's). Walks the
    frames itself: ``traceback.extract_stack`` reads every frame's line and was a tenth of the guarded run."""
    frame = sys._getframe(1)
    while frame is not None:
        f = frame.f_code.co_filename
        if f.startswith(ROOT) and "site-packages" not in f and not f.endswith("host_guard.py"):
            return f"{os.path.relpath(f, ROOT)}:{frame.f_lineno} ({linecache.getline(f, frame.f_lineno).strip()})"
        frame = frame.f_back
    return "?"


def _tensors(tree, out: list | None = None) -> list:
    """The tensors in nested lists, tuples (named ones, torch's return types) and dicts (HF's outputs), in
    order: what ``torch.utils._pytree.tree_flatten`` finds among them, at a tenth of its cost (it was a third
    of the guarded run)."""
    out = [] if out is None else out
    if isinstance(tree, torch.Tensor):
        out.append(tree)
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            _tensors(item, out)
    elif isinstance(tree, dict):
        for item in tree.values():
            _tensors(item, out)
    return out


def _explicit_device(args, kwargs):
    """The device an op was told to use: its ``device=`` kwarg, or a ``.to`` / ``.cpu`` target."""
    if "device" in kwargs and kwargs["device"] is not None:
        return kwargs["device"]
    return None


# ``x.device`` of a host tensor is the CPU, as the model's own device is here: the torch.device objects it
# returned are remembered (held, so their ids stay unique) and count as the host wherever they are passed
_HOST_DEVICES: dict[int, torch.device] = {}


def _is_host_device(device) -> bool:
    if isinstance(device, torch.device):
        return id(device) in _HOST_DEVICES
    return isinstance(device, str) and device.split(":")[0] == "cpu"


class _Guard(TorchFunctionMode):
    def __init__(self, found: list | None):
        super().__init__()
        self.found = found  # None: raise at the first mix; a list: append each distinct message and go on

    def _report(self, msg: str) -> None:
        if self.found is None:
            raise HostDeviceMix(msg)
        if msg not in self.found:
            self.found.append(msg)

    # a host tensor carries where it was made in this attribute (tensors compare by value, so no dict)
    def _tag(self, out, where):
        for t in _tensors(out):
            t._host_made_at = where

    def _untag(self, out):
        for t in _tensors(out):
            if "_host_made_at" in t.__dict__:
                del t._host_made_at

    def _check_indexing(self, name, args) -> None:
        """CUDA's rules for ``x[idx]`` and ``x[idx] = v`` with tensor indices (advanced indexing): host indices
        may index a device tensor, not the reverse; the values written must be where ``x`` is (a slice
        assignment copies across devices and a 0-dim value is a scalar: both pass)."""
        x, idx = args[0], args[1]
        tidx = [t for t in _tensors(idx) if t.dim() > 0]
        if not tidx:
            return
        if _where(x) and any(not _where(t) for t in tidx):
            self._report(f"{name} at {_caller()} indexes a host tensor (made at {_where(x)}) with device indices")
        if name == "__setitem__" and len(args) > 2 and isinstance(args[2], torch.Tensor) and args[2].dim() > 0 \
                and bool(_where(args[2])) != bool(_where(x)):
            host = x if _where(x) else args[2]
            what = "device values into a host" if _where(x) else "host values into a device"
            self._report(f"{name} at {_caller()} writes {what} tensor at tensor indices (host tensor made at "
                         f"{_where(host)}): on a GPU this fails with 'Expected all tensors to be on the same device'")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        tensors = _tensors((args, kwargs))
        hosts = [t for t in tensors if _where(t)]
        devs = [t for t in tensors if not _where(t)]
        if name == "numpy" and devs and not hosts:
            self._report(f".numpy() of a device tensor (at {_caller()}): call .cpu() first")
        if name in ("__setitem__", "__getitem__") and args:
            self._check_indexing(name, args)
        if name in ("to", "cuda", "cpu", "__get__") or name in _ALLOWED:
            out = func(*args, **kwargs)
            if name in ("to", "cuda", "cpu") and out is args[0] and not isinstance(out, torch.nn.Parameter):
                target = "host" if name == "cpu" else "device" if name == "cuda" else _to_target(args[1:], kwargs)
                if target is not None and (target == "host") != bool(_where(out)):  # a move to where it already
                    out = out.view(out.shape)  # is returns the tensor itself: a view takes the new place
            if name == "cpu":
                self._tag(out, _caller())
            elif name in ("to", "cuda"):
                target = "device" if name == "cuda" else _to_target(args[1:], kwargs)
                if target == "host":
                    self._tag(out, _caller())
                elif target == "device":
                    self._untag(out)
                elif args and _where(args[0]):  # dtype-only .to(): keeps its place
                    self._tag(out, _where(args[0]))
            elif isinstance(out, torch.device) and args and _where(args[0]):  # host_tensor.device
                if len(_HOST_DEVICES) > 100_000:
                    _HOST_DEVICES.clear()
                _HOST_DEVICES[id(out)] = out
            elif args and _where(args[0]):  # a view or property of a host tensor (x[i], x.T, x.data)
                self._tag(out, _where(args[0]))
            return out
        big_hosts = [t for t in hosts if t.dim() > 0]
        if big_hosts and devs:
            self._report(f"{name} at {_caller()} mixes a host tensor (made at {_where(big_hosts[0])}) with a device "
                         "tensor: on a GPU "
                         "this fails with 'Expected all tensors to be on the same device'; make it on the device")
        out = func(*args, **kwargs)
        explicit = _explicit_device(args, kwargs)
        if explicit is not None:
            if _is_host_device(explicit):
                self._tag(out, _caller())
        elif name in _LIKE and args and isinstance(args[0], torch.Tensor):
            if _where(args[0]):
                self._tag(out, _where(args[0]))
        elif not tensors or (hosts and not devs):
            where = _where(hosts[0]) if hosts else _caller()
            self._tag(out, where)
        return out


def _where(t) -> str | None:
    """Where a host tensor was made; None for a device tensor."""
    return t.__dict__.get("_host_made_at") if isinstance(t, torch.Tensor) else None


def _to_target(rest, kwargs):
    """Where ``Tensor.to(*rest, **kwargs)`` sends a tensor: "host", "device" or None (dtype only)."""
    cand = kwargs.get("device", rest[0] if rest else None)
    if isinstance(cand, torch.Tensor):
        return "host" if _where(cand) else "device"
    if isinstance(cand, (str, torch.device)):
        return "host" if _is_host_device(cand) else "device"
    return None


@contextmanager
def host_guard(found: list | None = None):
    """Within the block, mixing host tensors with device tensors raises `HostDeviceMix` (module docstring);
    with a list ``found``, each distinct mix is appended to it instead and the block runs on."""
    with _Guard(found):
        yield
