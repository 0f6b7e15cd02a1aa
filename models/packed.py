"""CPU linear layers with weights pre-packed once for oneDNN: cheaper verify forwards.

On a CPU, PyTorch's default ``F.linear`` calls MKL's sgemm, which re-lays out ("packs") the
weight matrix on every call. For a decode step (1 row) that is a memory-bound GEMV; for a
speculative verify forward of 2-16 rows the packing and a poor small-M path make a forward of
8 tokens cost about 1.4-1.6x a forward of 1 token on SmolLM2-135M. oneDNN can pack each weight
once ahead of time (the same weight prepacking TorchInductor's CPU freezing pass does), after
which a forward of 1-8 rows streams the weights once and costs about the same: measured on a
2-core AMD EPYC, SmolLM2 decode went from 54 ms to 39 ms and an 8-token forward from 1.38x to
1.12x a decode step (``beliefscope bench spec`` reports both in one run).

Each packed layer is bitwise batch-invariant: row ``i`` of the output does not depend on how
many rows were computed with it (``tests/test_packed.py``), so a verify forward sees the same
linear-layer numbers as a decode step. One exception had to be closed: for a single row oneDNN
may take another kernel (measured: SmolLM2's ``down_proj``, 1536 inputs, and a 3072-input layer,
whose one-row outputs differed from the same row among 2-64 rows by up to 1e-5). Each layer
checks this when it packs, on a random probe, and where one row differs it computes a lone row
as two copies of it (no cost to measure on those layers), so the property holds for 1 row too.

``pack_linears(model)`` swaps every ``nn.Linear`` (and transformers' ``Conv1D``, GPT-2's linear)
for a ``PackedLinear`` that keeps the original ``weight`` and ``bias`` parameters, so
``state_dict``, probes and weight edits see the same tensors. A ``PackedLinear`` falls back to
``F.linear`` when autograd needs a graph (training, gradient probes), and re-packs itself when its
weight changed in place. ``unpack_linears`` puts the original modules back.

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
>>> x = torch.randn(5, 4)
>>> ref = net(x)
>>> pack_linears(net) if packing_available() else 2
2
>>> torch.allclose(net(x), ref, atol=1e-5)
True
>>> unpack_linears(net) if packing_available() else 2
2
>>> type(net[0]).__name__
'Linear'
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from .internals import version

BATCH_HINT = 8  # rows oneDNN optimises the packed layout for; 8 was fastest from 1 to 16 rows and batch-invariant
# (a hint of 1 gives a different kernel for 1 row than for 2+, so rows would not be bitwise batch-invariant)


def packing_available() -> bool:
    """Whether this torch build has oneDNN's weight-packing ops (CPU builds from pytorch.org do)."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear(torch.nn.Module):
    """``y = x W^T + b`` through a oneDNN-packed copy of ``W`` (CPU, float32, inference).

    ``weight`` is the original ``[out, in]`` parameter (shared, not copied); ``packed`` is
    oneDNN's layout of it, rebuilt when ``weight`` changes in place."""

    def __init__(self, weight: torch.nn.Parameter, bias, original: torch.nn.Module, batch_hint: int = BATCH_HINT):
        super().__init__()
        self.weight = weight  # [out, in] the original parameter
        self.bias = bias  # [out] or None, the original parameter
        self.batch_hint = batch_hint
        self.enabled = True  # False: plain F.linear (see `packing_disabled`)
        self._original = [original]  # the module this replaced (a list, so it is not registered as a child)
        self._packed = None
        self._packed_version = None  # the weight's in-place version when it was packed
        self._lone_row_differs = False  # set by _pack: a 1-row input takes another oneDNN kernel here
        self._pack()

    def weight_out_in(self) -> torch.Tensor:
        """The weight as ``[out, in]`` (the layout oneDNN packs)."""
        return self.weight

    @property
    def in_features(self) -> int:
        return self.weight_out_in().shape[1]

    @property
    def out_features(self) -> int:
        return self.weight_out_in().shape[0]

    def _pack(self) -> None:
        with torch.no_grad():
            w = self.weight_out_in().detach().contiguous()  # [out, in]
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w, self.batch_hint)
            probe = torch.randn(2, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.device)  # [2, in]
            lone, pair = self._packed_linear(probe[:1]), self._packed_linear(probe)  # [1, out], [2, out]
            self._lone_row_differs = not torch.equal(lone[0], pair[0])
        self._packed_version = version(self.weight)

    def _packed_linear(self, flat: torch.Tensor) -> torch.Tensor:  # [rows, in] -> [rows, out]
        return torch.ops.mkldnn._linear_pointwise(flat, self._packed, self.bias, "none", [], "")

    def __getstate__(self):  # copies and pickles carry no oneDNN tensor: it is re-packed on first use
        state = dict(self.__dict__)
        state["_packed"], state["_packed_version"] = None, None
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        needs_graph = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if (not self.enabled or needs_graph or x.device.type != "cpu" or x.dtype != torch.float32
                or self.weight.dtype != torch.float32):
            return F.linear(x, self.weight_out_in(), self.bias)
        if version(self.weight) != self._packed_version:  # one int compare per forward
            self._pack()  # the weight was edited in place (steering, fine-tuning): re-pack it
        flat = x.reshape(-1, x.shape[-1])  # [rows, in]
        if len(flat) == 1 and self._lone_row_differs:  # the kernel of 2+ rows, so the row keeps its bits
            y = self._packed_linear(flat.expand(2, -1).contiguous())[:1]  # [1, out]
        else:
            y = self._packed_linear(flat)  # [rows, out]
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class _Conv1DPacked(PackedLinear):
    """A ``PackedLinear`` for transformers' ``Conv1D`` (GPT-2's linear; weight stored ``[in, out]``)."""

    def weight_out_in(self) -> torch.Tensor:
        return self.weight.t()


def _as_packed(module: torch.nn.Module, batch_hint: int) -> PackedLinear | None:
    kind = (PackedLinear if isinstance(module, torch.nn.Linear)
            else _Conv1DPacked if type(module).__name__ == "Conv1D" and hasattr(module, "nf") else None)
    if kind is None or module.weight.dtype != torch.float32 or module.weight.device.type != "cpu":
        return None
    return kind(module.weight, module.bias, module, batch_hint)


def can_pack(model: torch.nn.Module) -> bool:
    """Whether ``model`` can run on packed linears here: float32 weights on the CPU, and a torch build
    with oneDNN packing."""
    param = next(model.parameters())
    return param.device.type == "cpu" and param.dtype == torch.float32 and packing_available()


def require_packable(model: torch.nn.Module) -> None:
    """Raise a ``ValueError`` naming the fix unless ``model``'s weights are float32 on the CPU."""
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32:
        raise ValueError(f"packed linears need float32 weights on the CPU; this model is {param.dtype} on "
                         f"{param.device}: load it with device 'cpu' and dtype 'float32' (CLI: --device cpu --dtype "
                         "float32), or do not pack")


def pack_linears(model: torch.nn.Module, batch_hint: int = BATCH_HINT) -> int:
    """Replace every float32 CPU ``nn.Linear`` / ``Conv1D`` in ``model`` by a ``PackedLinear``; returns how many.

    Raises if this torch build cannot pack (``packing_available()`` is False)."""
    if not packing_available():
        raise RuntimeError("this torch build has no oneDNN weight packing (torch.ops.mkldnn._reorder_linear_weight): "
                           "run without packed linears, or install a CPU build of torch from pytorch.org")
    if batch_hint < 1:
        raise ValueError(f"batch_hint={batch_hint} must be >= 1 (the rows oneDNN optimises for; {BATCH_HINT} is tuned)")
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            packed = _as_packed(child, batch_hint)
            if packed is not None:
                setattr(module, child_name, packed)
                count += 1
    return count


def unpack_linears(model: torch.nn.Module) -> int:
    """Put back the modules ``pack_linears`` replaced; returns how many."""
    count = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, PackedLinear):
                setattr(module, child_name, child._original[0])
                count += 1
    return count


def is_packed(model: torch.nn.Module) -> bool:
    """Whether ``model`` has at least one ``PackedLinear``."""
    return any(isinstance(m, PackedLinear) for m in model.modules())


@contextmanager
def packing_disabled(model: torch.nn.Module):
    """Within the block, ``model``'s packed layers run plain ``F.linear`` (the default kernels), for comparisons."""
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    before = [m.enabled for m in layers]
    for m in layers:
        m.enabled = False
    try:
        yield
    finally:
        for m, e in zip(layers, before):
            m.enabled = e
