"""Compiled decoding (``SpecConfig(compile=True)``, ``--compile``): each decode or verify forward shape is
recorded once and replayed, over the `KVCache`'s own preallocated K/V buffers (gpt-fast's way).
`SlotReplays` does the same for the deterministic-request scheduler (``SchedulerConfig(compile=True)``):
its fast rounds, one recording per batch size, and its fixed-shape verifies, over the slot caches.

On a GPU the forward is recorded as a CUDA graph: one launch replays every kernel of the model, which
is what a small model or a small batch waits on in eager mode (a kernel launch per operation, Python
per module). On the CPU the same fixed-shape forward is compiled with ``torch.compile``.

What makes a forward replayable is that every value that changes from step to step lives in a tensor
the recording reads: the tokens ``[B, n]``, their positions ``[B, n]``, the physical slots they write
``[n]`` and the attention mask ``[B, 1, n, C]`` over the cache's whole capacity ``C``. The cache's
bookkeeping (its layout, rollback, the recorder's events and provenance) runs in Python around each
replay, exactly as around an eager forward, so a compiled run records the same events.

A forward runs eagerly instead, and `GraphedForward.why_not` says why, when a replay could not honour
it: a hook on the model or a write hook on the cache (Python that runs per forward), a sliding-window
model, an attention implementation other than ``sdpa`` or ``eager``, or a model split over devices.
A recording is redone when the cache's buffers change (it grew, or a fork moved it).

Attending over the whole capacity instead of the filled length changes the width of the attention
reduction, so a compiled run equals the eager one where the kernels do not depend on it (float32 on
the CPU, tested); in bfloat16 on a GPU it may not, as with any change of shape.
"""

from __future__ import annotations

import torch
from torch.utils.hooks import RemovableHandle

from ..cache.slots import begin_replay, replaying
from ..models.bridge import cache_kwarg
from ..models.forward import forward_module, is_wrapper
from ..models.internals import attention_implementation, forward_hooks
from ..models.profile import sliding_windows
from .core import CompiledForwards, hf_logits

ATTENTION = ("sdpa", "eager")  # attention implementations whose 4D mask a recording can build


def why_not(model, cache) -> str | None:
    """Why forwards of ``model`` over ``cache`` (a `KVCache`) cannot be replayed (None: they can)."""
    if cache.config.layer_devices is not None:
        return "a model split over devices"
    if cache._hooks:
        return "write hooks on the cache"
    return why_not_model(model)


def why_not_model(model) -> str | None:
    """Why forwards of ``model`` cannot be replayed, whatever the cache (None: they can)."""
    hf = forward_module(model)
    conf = hf.config
    impl = attention_implementation(conf)
    if impl not in ATTENTION:
        return f"attention implementation {impl!r} (a recording builds masks for {', '.join(ATTENTION)})"
    if any(w is not None for w in sliding_windows(conf)):
        return "sliding-window layers (their masks are not built for a recording)"
    hooked = [n or "the model" for n, m in hf.named_modules()
              if any(not _ours(fn) for fn in forward_hooks(m))]
    if hooked or any(is_wrapper(m) for m in hf.modules()):  # wrappers: a hook name built the bridge
        return f"{HOOKED}({', '.join(hooked[:3]) or 'TransformerLens hook points'}): they run Python " \
               "per forward, which a replay skips"
    if len({p.device for p in hf.parameters()}) > 1:
        return "a model split over devices"
    return None


KNOWN_HOOKS = ("beliefscope.models.bridge", "beliefscope.models.context", "transformers.utils.output_capturing")
#   modules of hooks a replay may skip: this project's input placement and cache guards (tensor work a recording
#   keeps, or checks a replaying cache turns off: `KVCache.checks_growth`), its context limit (a decoding run's
#   budget keeps every replayed forward inside the context), and the hooks transformers leaves after
#   ``output_hidden_states=True`` (idle unless a forward asks for hidden states, which a recorded one does not)


HOOKED = "hooks on the model "  # how a why_not for hooks begins


def decide_again(replays) -> bool:
    """Whether ``replays`` (a `GraphedForward` or `SlotReplays`) must decide its ``why_not`` again before a forward:
    a hook handle was made since it last did (PyTorch numbers them from one counter: one int compare), or hooks
    made it run eagerly and may since have been removed (a removal leaves the counter as it is)."""
    if RemovableHandle.next_id == replays.hooks_seen and not (replays.why_not or "").startswith(HOOKED):
        return False
    replays.hooks_seen = RemovableHandle.next_id
    return True


def _ours(fn) -> bool:
    return getattr(fn, "__module__", "") in KNOWN_HOOKS


class GraphedForward(CompiledForwards):
    """Forwards of ``model`` over ``cache`` by replay: ``logits(tokens)`` is ``decoding.core.hf_logits``
    with ``past_key_values=cache``, the same host logits and the same cache bookkeeping."""

    cpu_mode = "torch.compile"  # off CUDA: "torch.compile", or "static" (the recorded forward run as it is; tests)

    def __init__(self, model, cache):
        self.model, self.cache = model, cache
        hf = forward_module(model)
        self.device = next(hf.parameters()).device
        self.mode = replay_mode(self.device, self.cpu_mode)
        self.why_not = why_not(model, cache)
        self.recordings: dict[tuple, _Recording] = {}  # (batch, n) -> recording over the current buffers
        self._buffers: tuple | None = None  # (id, data pointer) of the buffers the recordings write
        self.pool = torch.cuda.graph_pool_handle() if self.mode == "cuda-graphs" else None  # shared by its graphs
        self.replays = 0  # forwards run by replay
        self.eager = 0  # forwards run eagerly (why_not, or a first forward before the buffers exist)
        self.hooks_seen = RemovableHandle.next_id  # PyTorch's hook-handle counter when why_not was last decided

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Float logits ``[B, n, vocab]`` on the host of ``tokens`` ``[B, n]`` appended to the cache."""
        cache = self.cache
        if decide_again(self):
            self.why_not = why_not(self.model, cache)
        if self.why_not is not None or cache.storage is None:
            self.eager += 1
            return hf_logits(self.model, tokens, past_key_values=cache)
        b, n = tokens.shape
        live = cache.live_mask(n)  # [B, p + n]; plans the slots [p, p + n)
        p = cache.layout.plan[0]
        positions = cache.position_ids(n)  # [B, n] logical positions
        cache._begin(None, n)  # layout, growth, the recorder's event: as an eager forward's layer 0 does
        st = cache.storage
        buffers = (id(st.k[0]), st.k[0].data_ptr())
        if self._buffers != buffers:  # the cache grew or moved: recordings of the old buffers are stale
            self.recordings.clear()
            self._buffers = buffers
        rec = self.recordings.get((b, n))
        if rec is None:
            slots = torch.zeros(n, dtype=torch.long, device=st.k[0].device)  # [n] physical slots written
            rec = self.recordings[(b, n)] = _Recording(forward_module(self.model), cache, slots, b, n, st.capacity,
                                                       self.mode, self.pool)
        rec.set(tokens, positions, torch.arange(p, p + n), _mask(live, n, st.capacity))
        self.replays += 1
        with replaying(cache, rec.write):  # every layer writes physical slots rec.write [n] of every row
            return rec.run().float().cpu()


def replay_mode(device: torch.device, cpu_mode: str) -> str:
    return "cuda-graphs" if device.type == "cuda" else cpu_mode


class SlotReplays:
    """Fixed-shape forwards of ``model`` over the first rows of a slot `KVCache` (`cache.slots`), replayed: the
    scheduler's fixed-shape verify ``[verify_slots, W]`` and its fast rounds ``[n, 1]`` (one recording per
    batch size ``n``, as serving engines record one CUDA graph per batch size), each over the slots' whole
    capacity. The slot cache never grows, so a recording lasts the scheduler's life."""

    cpu_mode = "torch.compile"  # as GraphedForward.cpu_mode

    def __init__(self, model, slots):
        self.model, self.slots = model, slots
        self.device = next(forward_module(model).parameters()).device
        self.mode = replay_mode(self.device, self.cpu_mode)
        self.why_not = self._why_not()
        self.recordings: dict[tuple, _Recording] = {}  # (rows, width) -> recording
        self.pool = torch.cuda.graph_pool_handle() if self.mode == "cuda-graphs" else None
        self.hooks_seen = RemovableHandle.next_id  # as GraphedForward.hooks_seen
        self.eager = 0  # forwards run eagerly because a hook was attached after the run began

    def _why_not(self) -> str | None:
        windows = self.slots.layout.windows and any(w is not None for w in self.slots.layout.windows)
        return why_not_model(self.model) or (
            "sliding-window layers (their masks are not built for a recording)" if windows else None)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Host float logits ``[n, W, vocab]`` of ``tokens`` ``[n, W]`` for rows ``0 .. n-1``, written at each
        row's length (which grows by W, as in any forward), over the whole capacity: `decoding.slots.verify` of
        ``rows=range(n)``."""
        return self._run(tokens).float().cpu()

    def greedy(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Host ``(argmax [n], two largest logits [n, 2])`` at the last position of `logits`' forward, reduced
        where the logits are (argmax keeps the first maximal index there as on the host), so a decode round
        copies ``3 n`` numbers to the host instead of ``n x vocab``."""
        last = self._run(tokens)[:, -1].float()  # [n, vocab]
        return last.argmax(-1).cpu(), last.topk(2, dim=-1).values.cpu()

    def _run(self, tokens: torch.Tensor) -> torch.Tensor:
        """The logits ``[n, W, vocab]`` of `logits`, where the forward left them."""
        n, w = tokens.shape
        slots, capacity = self.slots, self.slots.layout.capacity
        kw = slots.forward_kwargs(w, rows=range(n), span=capacity)  # plans the forward: mask [n, 1, W, C]
        if decide_again(self):
            self.why_not = self._why_not()
        if self.why_not is not None:  # the same forward, eagerly (its hooks run)
            self.eager += 1
            return hf_logits(self.model, tokens, **kw)
        rec = self.recordings.get((n, w))
        if rec is None:
            write = torch.zeros(n, w, dtype=torch.long, device=self.slots.layout.device)  # [n, W] static
            rec = self.recordings[(n, w)] = _Recording(forward_module(self.model), slots, write, n, w, capacity,
                                                       self.mode, self.pool)
        write = begin_replay(slots, w)  # [n, W]: the eager forward's bookkeeping, and where it would write
        rec.set(tokens, kw["position_ids"], write, kw["attention_mask"].cpu())
        with replaying(slots, rec.write, rows=n, span=capacity):
            return rec.run()


def _mask(live: torch.Tensor, n: int, capacity: int) -> torch.Tensor:
    """Boolean ``[B, 1, n, C]``: query ``t`` (slot ``p + t``) sees the row's live slots before ``p`` and the
    new slots up to its own."""
    b, width = live.shape
    p = width - n
    out = torch.zeros(b, 1, n, capacity, dtype=torch.bool)
    out[:, 0, :, :p] = live[:, None, :p].bool().cpu()
    out[:, 0, :, p:p + n] = torch.ones(n, n, dtype=torch.bool).tril()
    return out


class _Recording:
    """One forward shape's static inputs and its CUDA graph (or compiled function)."""

    def __init__(self, hf, cache, write: torch.Tensor, batch: int, n: int, capacity: int, mode: str, pool=None):
        dev = write.device
        self.hf, self.mode, self.runs, self.pool = hf, mode, 0, pool
        self.ids = torch.zeros(batch, n, dtype=torch.long, device=dev)  # [B, n]
        self.pos = torch.zeros(batch, n, dtype=torch.long, device=dev)  # [B, n]
        self.write = write  # where the K/V go: [n] slots of every row, or [B, n] positions (a slot cache)
        eager = attention_implementation(hf.config) == "eager"
        dtype = next(hf.parameters()).dtype
        self.mask = torch.zeros(batch, 1, n, capacity, dtype=dtype if eager else torch.bool, device=dev)
        self.additive = eager  # eager attention adds the mask: 0 where seen, the dtype's min elsewhere
        self.kw = {cache_kwarg(hf): cache}  # the cache the recorded forward writes through
        self.graph, self.out, self.fn = None, None, None

    def forward(self) -> torch.Tensor:
        return self.hf(input_ids=self.ids, attention_mask=self.mask, position_ids=self.pos, use_cache=True,
                       **self.kw).logits  # [B, n, vocab]

    def set(self, tokens, positions, write, mask) -> None:
        self.ids.copy_(tokens)
        self.pos.copy_(positions)
        self.write.copy_(write)
        if self.additive:
            mask = torch.zeros(mask.shape, dtype=self.mask.dtype).masked_fill_(~mask, torch.finfo(self.mask.dtype).min)
        self.mask.copy_(mask)

    def run(self) -> torch.Tensor:
        self.runs += 1
        if self.mode == "cuda-graphs":
            if self.graph is None:
                self._record()
            self.graph.replay()
            return self.out
        if self.mode == "static":
            return self.forward()
        if self.fn is None:
            self.fn = torch.compile(self.forward, dynamic=False)
        return self.fn()

    def _record(self) -> None:
        """Warm up on a side stream (it writes the step's own K/V, which the replay rewrites), then record."""
        side = torch.cuda.Stream(self.ids.device)
        side.wait_stream(torch.cuda.current_stream(self.ids.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.forward()
        torch.cuda.current_stream(self.ids.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool):
            self.out = self.forward()
