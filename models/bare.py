"""The Hugging Face model under a TransformerBridge without the bridge's wrappers, for forwards no
hook watches.

TransformerLens 4 builds a bridge by replacing each HF submodule with a wrapper (a *generalized
component*) that holds the original module and calls it between hook points. Every forward pays for
the wrappers, hooked or not: hundreds of Python calls and ``.to()`` calls per forward, which on a
small model or a one-token decode step cost as much as the arithmetic.

`bare_model(hf)` is the same model without them: the HF module tree rebuilt with every wrapper
replaced by the module it wraps. A container on the way (the causal LM, its decoder, a block, an
attention) is a shallow copy that shares the original's parameter, buffer and hook dictionaries; a
module with no wrapper below it is the original itself. So weights, devices, dtypes and any hook
registered on a HF module are one and the same in both trees, and only the wrappers and their hook
points are missing. Its logits are the HF model's, bit for bit.

`runnable(model)` picks, per forward, the bare model when nothing needs the wrappers, else the
bridge's wrapped HF model. The wrappers are needed when a hook is attached to one of them or to one
of their hook points (what ``run_with_cache``, ``hooks()`` and `hooks.capture` do), or when the
bridge runs in a TransformerLens-only mode (compatibility mode, processed weights, start or stop at a
layer). Checking costs one integer comparison while nothing changes: PyTorch numbers every hook
handle from one class counter, so an unchanged counter means no hook was added anywhere since the
last scan (a removal can only make a scan's "hooked" stale, never its "not hooked"). The module tree
is checked too (one identity test per edge), so a module swapped in later (packed linears, LoRA, an
early-exit drafter's shorter block list) rebuilds the bare tree instead of running a stale one. A forward
bound to a module itself (accelerate's device-map dispatch, TransformerLens's in-place patches of
Falcon) is rebound to its copy, so the copy calls its own, unwrapped, children.

>>> import torch
>>> from beliefscope.models.testing import tiny_llama
>>> bridge = tiny_llama()
>>> hf = bridge.original_model
>>> x = torch.tensor([[1, 2, 3]])
>>> runnable(bridge) is bare_model(hf)             # nothing hooked: the bare tree runs
True
>>> float((bare_model(hf)(x).logits - hf(x).logits).abs().max().detach()) < 1e-5  # wrappers round differently
True
>>> handle = bridge.blocks[0].hook_out.add_hook(lambda act, hook: None)
>>> runnable(bridge) is hf                          # a hook point is watched: the wrapped tree runs
True
>>> handle.hook.remove()
"""

from __future__ import annotations

import copy
import functools
import inspect
import operator
import types
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils.hooks import RemovableHandle

from ..hooks.names import hf_of
from .errors import ThoughtsSkippedError
from .profile import writes_thoughts

# Kept beside the HF model, never on it (nothing is written into another library's objects); a deep copy of the
# model gets no entry and builds its own bare tree on its first forward.
_STATES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # HF model -> its _Bare
_BRIDGES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # HF model -> weak reference to its bridge
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
KNOWN_HOOKS: set = set()  # hook functions that do not need the wrappers (models.bridge registers its own)


@dataclass
class _Bare:
    """The bare tree of one wrapped HF model, and what it was built from."""

    model: torch.nn.Module  # the bare tree's root (a shallow copy of the HF model)
    edges: list = field(default_factory=list)  # (modules dict, name, child) of every wrapped-tree edge walked
    columns: tuple = ((), (), ())  # the edges as (dicts, names, children): `intact` compares them in C
    watched: list = field(default_factory=list)  # hook dicts of the wrappers and their hook points
    counter: int = -1  # RemovableHandle.next_id when `watched` was last found empty (-1: not yet)


def is_wrapper(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a TransformerLens generalized component (it wraps an original module)."""
    return "_original_component" in module._modules


def bare_model(hf: torch.nn.Module) -> torch.nn.Module:
    """``hf`` without TransformerLens's wrappers (``hf`` itself when it has none); see the module doc."""
    return _state(hf).model


def runnable(model) -> torch.nn.Module:
    """The module a forward of ``model`` (a bridge or a HF model) should call: its bare HF tree when no
    hook needs the wrappers and the bridge runs no TransformerLens-only mode, else the wrapped HF model.

    A Thinking States model (`models.thinking`) is refused: its HF model alone is its backbone without
    the thoughts its answers are read after, so a forward here would be a silently different model."""
    if writes_thoughts(model):
        name = getattr(model, "name_or_path", "thinking")
        raise ThoughtsSkippedError(
            f"{name!r} is a Thinking States model: this path runs its HF model directly, which answers "
            "without its thoughts. Decode it with beliefscope.decoding.thinking.run_thinking (what "
            f"`beliefscope generate --model {name}` runs), or call the model itself, model(ids), whose "
            "forward injects its thoughts")
    hf = hf_of(model)
    state = _state(hf)
    if state.model is hf or _plain_mode_off(hf) or _watched(state):
        return hf
    if state.model.training != hf.training:
        state.model.train(hf.training)
    return state.model


def last_logits_only(hf: torch.nn.Module) -> dict:
    """``{"logits_to_keep": 1}`` where a forward of ``hf`` may compute the last position's logits alone (what HF's
    own ``generate`` passes at prefill: a SmolLM2 prefill of 512 tokens otherwise spends a third of its time on
    logits it discards), else ``{}``. Its forward must take the argument, and its output layer must be the plain
    module with no hook on it: a TransformerLens wrapper's hook points, or a user's hook, would otherwise see one
    position instead of every one."""
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    if head is None or is_wrapper(head) or head._forward_hooks or head._forward_pre_hooks:
        return {}
    return {"logits_to_keep": 1} if _takes_logits_to_keep(type(hf)) else {}


def takes_logits_to_keep(hf: torch.nn.Module) -> bool:
    """Whether ``hf``'s forward takes ``logits_to_keep`` (an int, or a tensor of the positions whose logits it
    computes), as transformers' causal LMs do."""
    return _takes_logits_to_keep(type(hf))


@functools.cache
def _takes_logits_to_keep(cls: type) -> bool:

    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def link_bridge(hf: torch.nn.Module, bridge) -> None:
    """Remember ``bridge`` as ``hf``'s bridge (weakly), so `runnable` sees its TransformerLens-only modes."""
    _BRIDGES[hf] = weakref.ref(bridge)


def _plain_mode_off(hf) -> bool:
    """Whether the bridge runs a mode that only its wrappers implement."""
    ref = _BRIDGES.get(hf)
    bridge = ref() if ref is not None else None
    if bridge is None:
        return False
    if getattr(bridge, "compatibility_mode", False) or getattr(bridge, "_weights_processed", False):
        return True
    blocks = getattr(bridge, "blocks", None)
    first = blocks[0] if blocks is not None and len(blocks) else None
    return first is not None and (getattr(first, "_stop_at_layer_idx", None) is not None
                                  or getattr(first, "_start_at_layer_idx", None) is not None)


def _watched(state: _Bare) -> bool:
    """Whether a hook that is not ours sits on a wrapper or a hook point (rescanned only when a hook
    handle was made anywhere since the last scan that found none)."""
    counter = RemovableHandle.next_id
    if counter == state.counter:
        return False
    for hooks in filter(None, state.watched):  # the empty dicts (nearly all) are skipped in C
        if not all(map(_needless, hooks.values())):
            state.counter = -1
            return True
    state.counter = counter
    return False


_SEEN_NEEDLESS: "weakref.WeakSet" = weakref.WeakSet()  # hooks `_needless` already cleared (a rescan skips them)


def _needless(fn) -> bool:
    """`_decide_needless`, remembered for the hooks it clears (TransformerLens's wiring stays for good)."""
    try:
        if fn in _SEEN_NEEDLESS:
            return True
    except TypeError:  # not weakly referable: decide afresh
        return _decide_needless(fn)
    found = _decide_needless(fn)
    if found:
        _SEEN_NEEDLESS.add(fn)
    return found


def _decide_needless(fn) -> bool:
    """Whether hook ``fn`` serves only the wrappers: ours (`KNOWN_HOOKS`), or bookkeeping TransformerLens
    wires on its own modules: a block hands the pre-norm residual to its attention's split-QKV hook
    points (on its first forward), and a placeholder component re-fires its subcomponents' hook points
    as its own (OPT's split MLP). A hook anyone else made (``HookPoint.add_hook``, ``run_with_cache``,
    ``register_forward_hook``) is not."""
    if fn in KNOWN_HOOKS:
        return True
    inner = _added(fn)
    where = getattr(inner, "__module__", "") or ""
    name = getattr(inner, "__qualname__", "")
    return where.startswith("transformer_lens.model_bridge") and any(f"{w}.<locals>" in name for w in _TL_WIRING)


_TL_WIRING = ("_maybe_wire_capture_hooks", "_wire_symbolic_hooks")  # TransformerLens's own hook wiring


def _added(fn):
    """The function a ``HookPoint.add_hook`` wrapper calls (found in its closure), else ``fn``."""
    code = getattr(fn, "__code__", None)
    if code is None or "hook" not in code.co_freevars or not fn.__closure__:
        return fn
    try:
        return fn.__closure__[code.co_freevars.index("hook")].cell_contents
    except ValueError:  # an empty cell
        return fn


def _state(hf: torch.nn.Module) -> _Bare:
    """The current bare tree of ``hf`` (rebuilt when a module of the wrapped tree was swapped); ``hf``
    itself when it has no wrapper."""
    state = _STATES.get(hf)
    if state is not None and _intact(state):
        return state
    state = _build(hf)
    state.columns = tuple(zip(*state.edges)) or ((), (), ())
    _STATES[hf] = state
    return state


def _intact(state: _Bare) -> bool:
    """Whether every edge of the wrapped tree still holds the child it held when the bare tree was built:
    one identity test per edge, run in C (``map`` over the columns), since it runs on every forward."""
    dicts, names, children = state.columns
    return all(map(operator.is_, map(dict.get, dicts, names), children))


class _NoBareTree(Exception):
    """A module on the way has its own forward bound in a way `_rebind` does not know."""


def _rebind(out: torch.nn.Module, source: torch.nn.Module) -> None:
    """A forward set on ``source`` itself (accelerate's device-map dispatch: a partial over ``source`` and
    the original bound forward; TransformerLens's in-place patches: a method bound to ``source``) is made
    to run on the copy ``out``, whose children are unwrapped; anything else refuses the bare tree."""
    for key in ("forward", "_old_forward"):
        fn = out.__dict__.get(key)
        if fn is None:
            continue
        if isinstance(fn, types.MethodType) and fn.__self__ is source:
            out.__dict__[key] = types.MethodType(fn.__func__, out)
        elif isinstance(fn, functools.partial) and fn.args[:1] == (source,):
            out.__dict__[key] = functools.update_wrapper(functools.partial(fn.func, out, *fn.args[1:], **fn.keywords),
                                                         fn.func)
        else:
            raise _NoBareTree


def _build(hf: torch.nn.Module) -> _Bare:
    state = _Bare(model=hf)
    if not any(is_wrapper(m) for m in hf.modules()):  # nothing to unwrap: it runs as it is, always right; its
        # edges are kept, so a bridge built later (it wraps the modules in place) is seen: a Runner builds one lazily
        state.edges = [(m._modules, n, c) for m in hf.modules() for n, c in m._modules.items()]
        return state
    shared: set[int] = set()
    memo: dict[int, torch.nn.Module] = {}

    def unwrap(module):
        if id(module) in memo:
            return memo[id(module)]
        source = module
        while is_wrapper(source):
            state.edges.append((source._modules, "_original_component", source._modules["_original_component"]))
            source = source._modules["_original_component"]
        for name, child in source._modules.items():
            state.edges.append((source._modules, name, child))
        children = {name: None if child is None else unwrap(child) for name, child in source._modules.items()}
        if all(children[name] is child for name, child in source._modules.items()):
            out = source  # nothing wrapped below: the module itself
        else:
            out = copy.copy(source)  # shares parameters, buffers and hooks; only the children differ
            out._modules = children
            _rebind(out, source)
        memo[id(module)] = out
        shared.add(id(source))  # a copied module shares its hook dicts with its copy: its hooks fire either way
        return out

    try:
        state.model = unwrap(hf)
    except _NoBareTree:
        return _Bare(model=hf)  # the wrapped model runs, always right
    shared.update(id(m) for m in state.model.modules())
    state.watched = [getattr(m, d) for m in hf.modules() if id(m) not in shared for d in _HOOK_DICTS]
    return state
