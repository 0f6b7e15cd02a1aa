"""Scoped capture and steering hooks on a TransformerBridge.

Hook functions follow TransformerLens: ``fn(act, *, hook)``. Hooks are removed in ``finally``.

>>> import torch
>>> from beliefscope.models.testing import tiny_gpt2
>>> from beliefscope.hooks import capture
>>> model = tiny_gpt2()  # d_model 32
>>> with capture(model, ["blocks.0.hook_resid_post"]) as cap:
...     _ = model(torch.tensor([[1, 2, 3, 4, 5, 6, 7]]))
>>> cap.stacked("blocks.0.hook_resid_post").shape
torch.Size([1, 7, 32])
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils.hooks import RemovableHandle

from .activation_cache import to_activation_cache
from .names import check_computed, hf_of, hook_names, parse_hooks, resolve_hooks
from .points import PlainPoint, attach, index_owners


@dataclass
class Record:
    """Activations captured by one forward at one hook."""

    positions: torch.Tensor  # [n_new] absolute positions of the captured tokens
    act: torch.Tensor  # [batch, n_new, ...] the activation (detached, on CPU unless asked otherwise)
    tags: dict = field(default_factory=dict)  # caller-set labels, e.g. {"pass": "draft"}


class Capture:
    """Activations collected per hook name, with the absolute positions of every token.

    Positions: each forward starts at ``start``, which is, in order of preference, the value set
    with ``seek`` (consumed by the next forward), the ``cache``'s length before the forward, or a
    running counter. This keeps positions right during cached decoding and after rollbacks.

    Across decode steps a capture keeps what a TransformerLens ``ActivationCache`` (one forward,
    positions from 0) cannot: one `Record` per forward with the **absolute positions** of its
    tokens (a decode step's single token sits at the cache length, not at 0), and **tags** copied
    from ``cap.tags`` when it was recorded; speculative decoding's `Trace` sets ``pass``
    (``draft`` / ``verify``), ``step`` and, once the verify is decided, ``status`` (``committed``
    / ``rolled_back`` / ``partial``). `to_activation_cache` converts one forward, or the stacked
    positions of the records a tag filter keeps, for TL's own methods.
    """

    def __init__(self, names, cache=None, device=None, n_layers: int | None = None):
        self.names = list(names)
        self.n_layers = n_layers  # the model's layer count: lets `stacked` read a hook spec (``resid_post@3``)
        self.cache = cache
        self.device = device
        self.records: dict[str, list[Record]] = {n: [] for n in self.names}
        self.tags: dict = {}  # copied into every new record; set e.g. {"pass": "verify"}
        self._start = 0
        self._seek: int | None = None
        self._counter = 0
        self._positions: tuple = (None, None)  # ((start, n), [n] positions) shared by a forward's records
        self.forwards = 0  # complete bridge forwards seen in the block (stacked() names it when a hook stayed silent)

    def seek(self, position: int) -> None:
        """The next forward's first token is at absolute `position`."""
        self._seek = position

    def begin_forward(self, n_new: int) -> None:
        """Mark the start of a forward over `n_new` tokens (called by a pre-hook on the HF model, which
        every path runs: the Runner's forward and direct calls of the HF model)."""
        if self._seek is not None:
            self._start, self._seek = self._seek, None
        elif self.cache is not None:
            self._start = int(self.cache.get_seq_length())
        else:
            self._start = self._counter
        self._counter = self._start + n_new

    def _record(self, name: str, act: torch.Tensor) -> None:
        n = act.shape[1]
        key, pos = self._positions
        if key != (self._start, n):  # one arange per forward, not per hook (records never modify it)
            pos = torch.arange(self._start, self._start + n)
            self._positions = ((self._start, n), pos)
        kept = act.detach() if self.device is None else act.detach().to(self.device)
        if kept.data_ptr() == act.data_ptr():
            kept = kept.clone()  # same memory as the model's tensor, which later code may modify in place
        self.records[name].append(Record(positions=pos, act=kept, tags=dict(self.tags)))

    def key(self, name: str) -> str:
        """The captured hook ``name`` stands for: a full name, or one hook in the spec grammar
        (`hooks.names.parse_hooks`, e.g. ``resid_post@-1``)."""
        if name in self.records:
            return name
        full = parse_hooks(name, self.n_layers) if self.n_layers else [name]
        if len(full) == 1 and full[0] in self.records:
            return full[0]
        raise KeyError(f"{name!r} was not captured; this capture holds {self.names}")

    def stacked_positions(self, name: str, where=None) -> torch.Tensor:
        """``[n_seen]`` the positions `stacked` lays out for ``name`` (sorted, unique; committed ones under
        decoding)."""
        recs = [_committed(r) for r in self.records[name] if where is None or where(r.tags)]
        return torch.unique(torch.cat([r.positions for r in recs])) if recs else torch.zeros(0, dtype=torch.long)

    def stacked(self, name: str, where=None) -> torch.Tensor:
        """Activations by absolute position, later writes winning. `where(tags) -> bool` filters records.
        Returns ``[batch, n_positions, ...]`` for positions 0..max.

        Under decoding with a trace (`decoding.trace.Trace`) it is the committed sequence: a record of a
        verify step gives only its committed positions (below its ``committed_end`` tag), so rolled-back
        drafts never show here (read them with ``trace.activations(name, status="rolled_back")``) and the
        length is the cache's: the prompt and every committed token but the pending last one."""
        name = self.key(name)
        recs = [r for r in self.records[name] if where is None or where(r.tags)]
        recs = [_committed(r) for r in recs]
        recs = [r for r in recs if len(r.positions)]
        if not recs:
            why = " with that filter" if where else (
                f" in {self.forwards} complete forward(s): the bridge lists this hook but did not fire it (e.g. "
                "hook_pos_embed on a rotary model)" if self.forwards else "")
            raise KeyError(f"nothing captured at {name!r}{why}")
        pos = recs[0].positions
        if len(recs) == 1 and len(pos) and int(pos[0]) == 0 and int(pos[-1]) == len(pos) - 1:
            return recs[0].act.clone()  # one forward over positions 0..n-1 (`_record` keeps an arange): as kept
        n = int(max(r.positions.max() for r in recs)) + 1
        out = torch.zeros((recs[0].act.shape[0], n, *recs[0].act.shape[2:]), dtype=recs[0].act.dtype,
                          device=recs[0].act.device)
        for r in recs:
            out[:, r.positions] = r.act
        return out

    def to_activation_cache(self, model, *, forward: int | None = None, stacked: bool = False, where=None):
        """A TransformerLens ``ActivationCache`` (see `hooks.activation_cache.to_activation_cache`)."""

        return to_activation_cache(self, model, forward=forward, stacked=stacked, where=where)


def _committed(r: Record) -> Record:
    """``r`` cut to its committed positions when a decoding step tagged it (``committed_end``), else ``r``."""
    end = r.tags.get("committed_end")
    if end is None or not len(r.positions) or int(r.positions.max()) < end:
        return r
    keep = r.positions < end
    return Record(r.positions[keep], r.act[:, keep], r.tags)


_INDEXED: "weakref.WeakSet" = weakref.WeakSet()  # models whose block hook points `index_owners` has indexed


@contextmanager
def hooked(model, fwd_hooks):
    """Attach ``[(name, fn)]`` forward hooks for the duration of the block; always removed.

    A block's ``hook_resid_pre`` / ``hook_resid_post`` hook goes on the HF decoder layer itself
    (`hooks.points.attach`), so the forward keeps running the bare HF model; every other hook point
    is hooked through TransformerLens (``HookPoint.add_hook``), which runs the bridge's wrappers."""
    handles = []
    fwd_hooks = list(fwd_hooks)
    points = resolve_hooks(model, [name for name, _ in fwd_hooks]) if fwd_hooks else []
    if any(not isinstance(p, PlainPoint) for p in points) and model not in _INDEXED:
        index_owners(model)
        _INDEXED.add(model)
    try:
        for hp, (_, fn) in zip(points, fwd_hooks):
            plain = attach(hp, fn)
            handles.append((hp, plain if plain is not None else hp.add_hook(fn)))
        yield
    finally:
        for hp, h in handles:
            if isinstance(h, RemovableHandle):
                h.remove()
                continue
            h.hook.remove()
            for lst in (getattr(hp, "fwd_hooks", None),):
                if isinstance(lst, list) and h in lst:
                    lst.remove(h)


def check_device(device) -> None:
    """Refuse a device this torch cannot use, naming it and what it has (before any forward).

    >>> check_device("cpu")
    >>> check_device("tpu")
    Traceback (most recent call last):
    ...
    ValueError: device 'tpu' is not a device torch knows: use 'cpu' (or 'cuda' on a build with CUDA)
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a device torch knows: use 'cpu' (or 'cuda' on a build with "
                         "CUDA)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this torch has no usable CUDA device (a CPU build, or no GPU): keep the "
                         "records on 'cpu', or leave device unset")


@contextmanager
def capture(model, names, cache=None, device=None):
    """Collect activations at `names` for every position of every forward in the block.

    ``names``: hooks in the one spec grammar of `hooks.names.parse_hooks`: full names
    (``blocks.3.hook_resid_post``), ``resid_post@3``, ``resid_post@0-5``, a bare kind for every layer.
    ``device``: where records are kept; None keeps them where the model computed them (pass
    ``"cpu"`` to offload a long capture from a GPU)."""
    names = hook_names(model, names)
    resolve_hooks(model, names)  # fail early, with suggestions
    check_computed(model, names)
    if device is not None:
        check_device(device)
    cap = Capture(names, cache=cache, device=device, n_layers=int(model.cfg.n_layers))

    def pre(module, args, kwargs):
        tokens = args[0] if args else kwargs.get("input", kwargs.get("input_ids"))
        cap.begin_forward(int(tokens.shape[-1]) if torch.is_tensor(tokens) else 0)

    def make(name):
        def fn(act, *, hook):
            cap._record(name, act)
        return fn

    def post(module, args, output):
        cap.forwards += 1

    # On the HF model: every forward runs it (the Runner's own, wrapped by TransformerLens or not, and the
    # decoding loops' direct calls), so a capture sees the same forwards whichever path ran.
    runs = hf_of(model)
    handle = runs.register_forward_pre_hook(pre, with_kwargs=True)
    done = runs.register_forward_hook(post)
    try:
        with hooked(model, [(n, make(n)) for n in names]):
            yield cap
    finally:
        handle.remove()
        done.remove()


@contextmanager
def stream(model, names, sink):
    """Call ``sink(name, act)`` with the activation at each of `names` as the forward computes it.

    Unlike `capture`, nothing is kept and nothing is copied: `act` (``[batch, pos, ...]``) is the
    model's own tensor, valid only during the call, so `sink` must copy out what it keeps (e.g.
    ``buffer.copy_(act)``, one copy straight into its destination) and must not modify it.
    Hooks are attached once for the whole block and removed on exit, even after an exception.

    Usage (not run as a doctest: it needs stored activations, probes or a model)::

        with torch.no_grad(), stream(model, ["blocks.0.hook_resid_post"], sink):
            model(tokens)
    """
    names = [names] if isinstance(names, str) else list(names)

    def make(name):
        def fn(act, *, hook):
            sink(name, act)
        return fn

    with hooked(model, [(n, make(n)) for n in names]):
        yield


@contextmanager
def steer(model, layer, direction: torch.Tensor, alpha: float, positions=None,
          kind: str = "resid_post"):
    """Add ``alpha * direction`` to the residual stream at `layer`.

    ``layer``: an int (with ``kind``), or one hook in the spec grammar of `hooks.names.parse_hooks`
    (``"resid_post@3"``, ``"resid_post@-1"``, ``"blocks.3.hook_attn_out"``); a spec naming several hooks
    is refused.

    `positions` are **sequence positions**, the same whichever way the tokens are computed (one uncached
    forward, cached one-token decoding, or speculative decoding's verify windows of the pending token,
    drafts and padding), so a steer gives the same tokens under plain greedy and speculative decoding:

    - None: every position of every forward;
    - ints >= 0 (an int, a list, a ``range``): those absolute positions, wherever a forward computes them
      (a forward knows its own from its ``position_ids``, else the length of the cache it extends);
    - negative ints: counted from the end of the input, only for a forward that starts at position 0
      (an uncached forward or a prefill). A forward that extends a cache is refused by name: its end is
      the newest token, a draft or padding, depending on how it decodes;
    - a callable ``f(positions) -> bool mask``: given the forward's absolute positions ``[batch, n]``.

    Example::

        >>> from beliefscope.models.testing import tiny_gpt2
        >>> from beliefscope.decoding import SpecConfig, generate
        >>> model, cfg = tiny_gpt2(), SpecConfig(max_new_tokens=4, stop_at_eos=False)
        >>> with steer(model, 0, torch.ones(32), 4.0, positions=range(4, 9)):   # the last prompt token and on
        ...     len(generate(model, [5, 6, 7, 8, 9], cfg).tokens)
        4
    """

    name = steer_hook(model, layer, kind)
    d = direction.detach().flatten()
    state = {"positions": None}  # the running forward's absolute positions [batch, n] (set by its pre-hook)
    wanted = _wanted(positions)

    def fn(act, *, hook):
        if act.shape[-1] != d.shape[0]:
            raise ValueError(f"steering direction has width {d.shape[0]} but {name} has width {act.shape[-1]}")
        vec = (alpha * d).to(act.dtype).to(act.device)
        act = act.clone()
        if positions is None:
            act += vec
            return act
        pos = state["positions"]
        if pos is None or pos.shape[-1] != act.shape[1]:  # a forward no pre-hook saw: positions from 0
            pos = torch.arange(act.shape[1])[None]
        mask = wanted(pos.expand(act.shape[0], -1))  # [batch, n]
        act[mask.to(act.device)] += vec
        return act

    def pre(module, args, kwargs):
        state["positions"] = forward_positions(args, kwargs)

    handle = hf_of(model).register_forward_pre_hook(pre, with_kwargs=True) if positions is not None else None
    try:
        with hooked(model, [(name, fn)]):
            yield
    finally:
        if handle is not None:
            handle.remove()


def steer_hook(model, layer, kind: str = "resid_post") -> str:
    """The one hook `steer` writes to: ``layer`` an int with ``kind``, or a spec naming exactly one hook."""
    if isinstance(layer, str):
        names = hook_names(model, layer)
        if len(names) != 1:
            raise ValueError(f"steer needs one hook, and {layer!r} names {len(names)}: give one layer "
                             "(e.g. 'resid_post@3'), or enter one steer per hook")
        resolve_hooks(model, names)
        return names[0]
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"steer's layer must be an int or a hook spec such as 'resid_post@3', not {layer!r}")
    return hook_names(model, kind if kind.startswith(("blocks.", "hook_")) else f"{kind}@{layer}")[0]


def forward_positions(args, kwargs) -> torch.Tensor | None:
    """Absolute positions ``[batch or 1, n]`` (on the host) of a HF causal LM forward's tokens, from its
    ``position_ids``, else ``cache_position``, else the length of the cache it extends (0 without one)."""
    tokens = args[0] if args and torch.is_tensor(args[0]) else kwargs.get("input_ids")
    if tokens is None:
        tokens = kwargs.get("inputs_embeds")
    if tokens is None:
        return None
    n = int(tokens.shape[1]) if tokens.ndim > 1 else int(tokens.shape[0])
    pid = kwargs.get("position_ids")
    if torch.is_tensor(pid):
        return pid.reshape(-1, n).cpu()
    cp = kwargs.get("cache_position")
    if torch.is_tensor(cp):
        return cp.reshape(1, n).cpu()
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    start = int(cache.get_seq_length()) if hasattr(cache, "get_seq_length") else 0
    return torch.arange(start, start + n)[None]


def _wanted(positions):
    """``f(pos [batch, n]) -> bool mask [batch, n]`` for `steer`'s ``positions`` (checked once, here)."""
    if positions is None:
        return None
    if callable(positions):
        return lambda pos: torch.as_tensor(positions(pos), dtype=torch.bool).expand_as(pos)
    items = [positions] if isinstance(positions, int) else list(positions)
    if not all(isinstance(p, int) for p in items):
        raise TypeError(f"steer(positions={positions!r}): give sequence positions as ints (a list or a range), "
                        "None for every position, or a callable f(positions [batch, n]) -> bool mask")
    ahead = torch.tensor([p for p in items if p >= 0], dtype=torch.long)
    behind = [p for p in items if p < 0]

    def wanted(pos: torch.Tensor) -> torch.Tensor:
        mask = torch.isin(pos, ahead)
        if behind:
            if int(pos[:, 0].min()) != 0:
                a, b = int(pos.min()), int(pos.max())
                raise ValueError(
                    f"steer(positions={positions!r}): {behind} counts from the end of a forward's input, but this "
                    f"forward extends a cache (positions {a}..{b}); under cached or speculative decoding that end is "
                    "the newest token, a draft or padding. Give absolute sequence positions instead, e.g. "
                    "positions=[len(prompt) - 1] for the last prompt token, or range(len(prompt) - 1, len(prompt) + "
                    "max_new_tokens) for it and every generated token")
            n = pos.shape[1]
            mask[:, [p for p in behind if p >= -n]] = True
        return mask

    return wanted
