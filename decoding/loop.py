"""One row through the engine (`decoding.engine`): plain decoding, chains and token trees. Each step is
propose -> verify -> accept -> commit, around one setup (prompt, budget, cache, prefill), one clock and
one trace (`SpeculativeRun`). EOS and the token budget are applied by `decoding.core.clip_new`.

What differs between them is a *step kind* (`PlainStep` below, ``decoding.speculative.ChainStep``,
``decoding.tree_generate.TreeStep``), an object with two attributes and six methods:

- ``provenance``: what the verify forward's cache writes are tagged (None: the cache's default);
- ``room``: the widest verify forward (the context must leave room for it);
- ``width(n) -> int``: the verify forward's width for ``n`` tokens (pending token and drafts);

- ``propose(drafter, ids, left) -> Proposal``: at most ``left`` tokens deep;
- ``verify(model, cache, pending, proposal, width) -> logits [1 + n, vocab]``: one target forward of
  ``[pending, drafts..., padding]`` ``width`` wide;
- ``accept(logits, proposal, position) -> (path, next token)``: the accepted drafts, root to leaf;
- ``keep(cache, position, proposal, path, keep) -> engine.Keep``: what the cache keeps (``keep`` positions, and
  the verify window's labels), which the engine applies (a tree first moves its accepted nodes together);
- ``after(result, proposal, path, n_kept, width) -> dict``: its own bookkeeping once ``n_kept`` drafts
  of ``path`` are committed, and the ``Step`` fields only it knows (``rejected``, a tree's parents and path).

>>> from beliefscope.models.testing import tiny_gpt2
>>> from beliefscope.decoding.ngram import NGramDrafter
>>> from beliefscope.decoding.speculative import ChainStep
>>> model, cfg = tiny_gpt2(), SpecConfig(gamma=3, max_new_tokens=6, stop_at_eos=False, trace=True)
>>> out = speculative_loop(model, NGramDrafter(2), [4, 5, 4, 5, 4], cfg, ChainStep(cfg))
>>> out.tokens == generate(model, [4, 5, 4, 5, 4], cfg, window=cfg.window_size).tokens
True
>>> len(out.trace.steps) == out.steps
True
"""

from __future__ import annotations

import time
import weakref
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from beliefscope import hooks

from ..cache import KVCache
from ..cache.guard import shapes_of_guarded
from .config import SpecConfig, with_overrides
from .core import (
    Generation,
    check_prompt,
    clip_new,
    eos_id,
    forward,
    new_cache,
    pad_window,
    pick,
    token_budget,
)
from .drafter import Drafter
from .engine import Keep, run
from .graphed import GraphedForward
from .trace import Step, Trace, close_step, record_counts
from .tree import TokenTree


@dataclass
class Proposal:
    """One step's drafts: a chain, or a token tree."""

    tokens: list[int]  # [n] draft tokens (a tree's in its depth-first order)
    gamma: int  # drafts a chain asked for, or a tree's deepest branch (what Generation.gammas records)
    drafts: torch.Tensor | None = None  # [n] a chain's drafts (None for a tree)
    q: torch.Tensor | None = None  # [n, vocab] a chain's draft distributions when sampling, else None
    tree: TokenTree | None = None  # a tree's parents, ranks and q (None for a chain)


@torch.no_grad()
def speculative_loop(model, drafter, prompt_ids, cfg: SpecConfig, kind, *, tokenizer=None,
                     cache: KVCache | None = None) -> Generation:
    """Decode ``prompt_ids`` with ``drafter`` and the step ``kind`` (see the module docstring): the
    engine (`decoding.engine.run`) stepping a `SpeculativeRun`; ``cache``: continue it (`held_prefix`)."""
    with ExitStack() as stack:
        policy = run(SpeculativeRun(model, drafter, prompt_ids, cfg, kind, tokenizer, stack, cache))
    return policy.finish()


# cache -> (its forward_count, the tokens it held) when a decoding run finished with it: a later run that
# continues it checks the prompt against them while no forward has written it since
_HELD: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def held_prefix(model, cache, ids: torch.Tensor) -> int:
    """How many leading tokens of ``ids`` (the whole sequence) ``cache`` holds, checked, for a run that continues it.

    The rule is HF's ``generate(input_ids, past_key_values=cache)``: ``ids`` is the whole sequence, the
    tokens the cache holds and then the new ones, and the cache is extended in place. A cache holding as
    many positions as ``ids`` or more is refused (only new tokens were passed, or the cache is ahead), and
    so is one whose tokens differ from ``ids`` where a decoding run recorded them (no forward since)."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache= takes a beliefscope KVCache (KVCache.for_model(model), or gen.cache of an earlier "
                        f"run); got {type(cache).__name__}")
    if cache.config.batch not in (None, 1) or len(cache.lengths) != 1:
        raise ValueError(f"cache= continues one row; this cache has {len(cache.lengths)} rows: fork one row, or "
                         "serve several with bs.Scheduler")
    mine, theirs = shapes_of_guarded(model), cache.config
    if (theirs.n_layers, theirs.kv_heads, theirs.d_head) != (mine.n_layers, mine.kv_heads, mine.d_head):
        raise ValueError(f"cache= was built for another model ({theirs.model_name!r}: {theirs.n_layers} layers, "
                         f"{theirs.kv_heads} kv heads of {theirs.d_head}) than this one ({mine.name!r}: "
                         f"{mine.n_layers}, {mine.kv_heads} of {mine.d_head}): build it with KVCache.for_model(model)")
    held, n = cache.seq_len, ids.numel()
    if held != cache.get_seq_length():
        raise ValueError(f"cache= has holes (logical length {held}, physical {cache.get_seq_length()}): continue "
                         "a clean cache (roll it back to a length, or fork it there)")
    if held >= n:
        raise ValueError(
            f"the cache holds {held} positions but prompt_ids has {n} tokens: pass the whole sequence, the {held} "
            "tokens the cache holds and then at least one new token (as HF's generate(input_ids, past_key_values="
            f"cache) takes it), not only the new tokens; to decode from a shorter prefix, cache.rollback(k) first")
    record = _HELD.get(cache)
    if record is not None and record[0] == cache.forward_count and len(record[1]) >= held:
        have = ids[:held].tolist()
        if have != record[1][:held]:
            i = next(j for j, (a, b) in enumerate(zip(have, record[1])) if a != b)
            raise ValueError(
                f"prompt_ids differ from the tokens the cache holds at position {i} (cache {record[1][i]}, "
                f"prompt {have[i]}): pass the whole sequence, the {held} tokens the cache holds and then the new "
                "ones (HF's rule for generate(input_ids, past_key_values=cache)), not only the new tokens")
    return held


class SpeculativeRun:
    """One row decoded by a step kind, as a policy of the engine: the prompt is prefilled when it is
    built; each step drafts, verifies the pending token and the drafts in one forward, and keeps the
    accepted path (``clip_new``: the budget and EOS)."""

    def __init__(self, model, drafter, prompt_ids, cfg: SpecConfig, kind, tokenizer, stack: ExitStack,
                 cache: KVCache | None = None):
        self.t_start = time.perf_counter()
        ids0 = check_prompt(model, prompt_ids)
        self.model, self.drafter, self.cfg, self.kind = model, drafter, cfg, kind
        self.n_prompt = n_prompt = ids0.numel()
        held = 0 if cache is None else held_prefix(model, cache, ids0)  # positions of ids0 the given cache holds
        self.eos = eos_id(model, cfg, tokenizer)
        room = kind.room  # the widest verify forward (padding included)
        self.budget = budget = token_budget(model, n_prompt, cfg.max_new_tokens, room)
        self.buf = torch.zeros(n_prompt + budget + room, dtype=torch.long)  # [n_prompt + budget + room] committed
        self.buf[:n_prompt] = ids0
        if cache is None:
            cache = new_cache(model, n_prompt + budget + room, cfg.keep_rejected)
        self.cache = cache
        self.trace = trace = Trace(n_prompt) if cfg.trace else None
        self.res = res = Generation([], n_prompt, 0, 0, 0.0, trace=trace, cache=cache)
        self.caps = _capture_target(stack, model, cache, trace, cfg)
        t = time.perf_counter()
        # [vocab]; prefill of what the cache does not hold yet: the cache then holds the prompt
        logits = forward(model, ids0[held:], cache, last_only=True)[-1]
        res.target_seconds += time.perf_counter() - t
        res.target_forwards = 1
        self.buf[n_prompt] = pick(logits, cfg, n_prompt)
        self.target = _compiled(model, cache, kind, res) if cfg.compile else model  # what verify forwards run
        self.length = n_prompt + 1  # committed tokens; buf[length - 1] is pending, the cache holds length - 1
        t = time.perf_counter()
        drafter.start(model, self.buf[: self.length], cache, cfg)
        res.draft_seconds += time.perf_counter() - t
        _capture_draft_model(stack, self.caps, drafter, cfg)

    def done(self) -> bool:
        return self.length - self.n_prompt >= self.budget or int(self.buf[self.length - 1]) == self.eos

    def propose(self) -> Proposal:
        self.counts, self.n_events = record_counts(self.caps), len(self.cache.recorder.events)
        self.pos = self.length - 1  # absolute position of the pending token
        _set_pass(self.caps, "draft")
        t = time.perf_counter()
        # drafts past the budget are wasted
        prop = self.kind.propose(self.drafter, self.buf[: self.length], self.budget - (self.length - self.n_prompt) - 1)
        self.t_draft = time.perf_counter() - t
        return prop

    def verify(self, prop: Proposal) -> torch.Tensor:
        _set_pass(self.caps, "verify")
        self.t_verify = time.perf_counter()
        self.width = self.kind.width(1 + len(prop.tokens))
        self.cache.recorder.next_provenance = self.kind.provenance
        # [1 + n, vocab]; row j -> pos + 1 + j
        return self.kind.verify(self.target, self.cache, self.buf[self.pos: self.length], prop, self.width)

    def accept(self, prop: Proposal, logits: torch.Tensor) -> tuple[list[int], list[int]]:
        """(accepted path, new tokens): the path's drafts and the verifier's next token, clipped."""
        path, nxt = self.kind.accept(logits, prop, self.pos + 1)
        return path, clip_new([*(prop.tokens[i] for i in path), nxt], self.budget - (self.length - self.n_prompt),
                              self.eos)

    def keep(self, prop: Proposal, accepted: tuple[list[int], list[int]]) -> Keep | tuple[Keep, Keep]:
        """The target's cache keeps the pending token and the accepted drafts (the last new token is pending);
        a drafter with a cache of its own says what that one keeps."""
        path, new = accepted
        target = self.kind.keep(self.cache, self.pos, prop, path, self.pos + len(new))
        own = self.drafter.keep(torch.cat([self.buf[: self.length], torch.tensor(new, dtype=torch.long)]))
        return target if own is None else (target, own)

    def commit(self, prop: Proposal, accepted: tuple[list[int], list[int]]) -> None:
        path, new = accepted
        keep = self.pos + len(new)
        self.buf[self.length: self.length + len(new)] = torch.tensor(new)
        self.length += len(new)
        t_verify = time.perf_counter() - self.t_verify
        t = time.perf_counter()
        self.drafter.sync(self.length)
        t_draft = self.t_draft + time.perf_counter() - t
        res = self.res
        res.record_step(drafted=len(prop.tokens), accepted=len(path), gamma=prop.gamma, n_new=len(new),
                        draft_s=t_draft, verify_s=t_verify)
        fields = self.kind.after(res, prop, path, len(new) - 1, self.width)
        if self.trace is not None:
            self.trace.steps.append(Step(res.steps - 1, self.pos, prop.tokens, len(path), new, gamma=prop.gamma,
                                         draft_seconds=t_draft, verify_seconds=t_verify,
                                         events=[tuple(e) for e in self.cache.recorder.events[self.n_events:]],
                                         **fields))
            close_step(self.caps, self.counts, res.steps - 1, keep, written_end=self.pos + 1 + len(prop.tokens))

    def finish(self) -> Generation:
        _HELD[self.cache] = (self.cache.forward_count, self.buf[: self.length - 1].tolist())  # what it holds now
        self.res.tokens = self.buf[self.n_prompt: self.length].tolist()
        if self.res.tokens and self.res.tokens[-1] == self.eos:
            self.res.stop_reason = "eos"
        else:  # the budget is max_new_tokens, or less where the context runs out first
            self.res.stop_reason = "context" if self.budget < self.cfg.max_new_tokens else "budget"
        runner = self.target if self.target is not self.model else None
        if runner is not None and runner.eager:  # a hook attached mid-run: those forwards ran eagerly
            self.res.compiled += f" ({runner.eager} forwards eager: {runner.why_not or 'hooks attached then'})"
        self.res.draft_forwards = getattr(self.drafter, "forwards", 0)
        self.res.seconds = time.perf_counter() - self.t_start
        return self.res


class NoDrafter(Drafter):
    """Proposes nothing: every step is one plain decoding forward."""

    name = "none"

    def propose(self, ids, n, cfg):
        return ids[:0], None


class PlainStep:
    """Plain decoding as a step kind: no drafts, one token per forward of the pending token, padded to
    ``window`` (``window > 1`` is the fixed-shape reference: the shape of a speculative verify pass)."""

    provenance = None  # the cache's default labels (prefill, then decode)
    replayable = True  # its verify is `forward` of a fixed width: `SpecConfig(compile=True)` replays it

    def __init__(self, cfg: SpecConfig, window: int = 1):
        if window < 1:
            raise ValueError(f"window={window} must be >= 1 (the pending token, then padding)")
        self.cfg, self.room = cfg, window

    def width(self, n: int) -> int:
        return self.room

    def propose(self, drafter, ids: torch.Tensor, left: int) -> Proposal:
        return Proposal([], 0, ids[:0])

    def verify(self, model, cache, pending: torch.Tensor, prop: Proposal, width: int) -> torch.Tensor:
        return forward(model, pad_window(pending, width), cache)[:1]  # [1, vocab]

    def accept(self, logits: torch.Tensor, prop: Proposal, position: int) -> tuple[list[int], int]:
        return [], pick(logits[0], self.cfg, position)

    def keep(self, cache, position: int, prop: Proposal, path: list[int], keep: int) -> Keep:
        return Keep(keep)  # the padding of a fixed-shape forward is cut: no draft, never kept

    def after(self, res: Generation, prop: Proposal, path: list[int], n_kept: int, width: int) -> dict:
        return {"rejected": []}


@torch.no_grad()
def generate(model, prompt_ids, cfg: SpecConfig | None = None, *, window: int = 1, tokenizer=None,
             cache: KVCache | None = None, **settings) -> Generation:
    """Plain cached decoding, one token per target forward (the baseline): the loop with `PlainStep`.

    ``cfg`` is optional: ``SpecConfig()``'s defaults (greedy, 32 new tokens, stop at EOS), and any of its
    fields may be given as a keyword instead (``max_new_tokens=8``, ``temperature=0.7``, ...).

    ``window=1`` is ordinary single-token decoding. ``window=W > 1`` is the *fixed-shape
    reference*: each token comes from a forward of width W (pending token, then padding), the same
    shape as a speculative verify pass, so both see identical numerics (HF issue #39421).

    ``cache``: continue a `KVCache` (an earlier ``gen.cache``, after a rollback or not, or one you filled),
    extended in place. As with HF's ``generate(input_ids, past_key_values=cache)``, ``prompt_ids`` is the
    whole sequence: the tokens the cache holds, then the new ones (at least one). Only the new ones run;
    ``Generation.prompt_len`` counts the whole sequence. Passing only the new tokens is refused where it can
    be seen (`held_prefix`).

    >>> from beliefscope.models.testing import tiny_gpt2
    >>> generate(tiny_gpt2(), [5, 6], SpecConfig(max_new_tokens=3, stop_at_eos=False), window=5).steps
    2
    >>> model = tiny_gpt2()
    >>> full = generate(model, [5, 6, 7], max_new_tokens=6, stop_at_eos=False)
    >>> full.cache.rollback(4)                    # keep the prompt and the first generated token
    >>> again = generate(model, [5, 6, 7, *full.tokens[:2]], cache=full.cache, max_new_tokens=4, stop_at_eos=False)
    >>> again.tokens == full.tokens[2:]
    True
    """
    cfg = with_overrides(cfg, settings)
    return speculative_loop(model, NoDrafter(), prompt_ids, cfg, PlainStep(cfg, window), tokenizer=tokenizer,
                            cache=cache)


def _compiled(model, cache, kind, res: Generation):
    """The verify forwards' runner with ``SpecConfig(compile=True)``: a `decoding.graphed.GraphedForward`
    over the run's cache, or the model itself when they cannot be replayed (``res.compiled`` says why)."""
    if not getattr(kind, "replayable", False):
        res.compiled = f"eager: {type(kind).__name__} verifies with its own masks (token trees are not recorded)"
        return model
    runner = GraphedForward(model, cache)
    if runner.why_not is not None:
        res.compiled = f"eager: {runner.why_not}"
        return model
    res.compiled = runner.mode
    return runner


def _set_pass(caps, name: str) -> None:
    for cap in caps:
        cap.tags["pass"] = name


def _capture_target(stack: ExitStack, model, cache, trace: Trace | None, cfg: SpecConfig) -> list:
    """Capture ``cfg.capture`` from the target into the trace (records tagged with their pass)."""
    if not cfg.capture:
        return []

    cap = stack.enter_context(hooks.capture(model, list(cfg.capture), cache=cache))
    trace.captures = [cap]
    _set_pass(trace.captures, "verify")
    return trace.captures


def _capture_draft_model(stack: ExitStack, caps: list, drafter, cfg: SpecConfig) -> None:
    """Also capture the draft model's activations (names it has), tagged pass=draft."""
    model = getattr(drafter, "model", None)
    if not cfg.capture or model is None or not hasattr(model, "hook_dict"):
        return

    names = [n for n in cfg.capture if n in model.hook_dict]
    if names:
        cap = stack.enter_context(hooks.capture(model, names, cache=drafter.cache))
        cap.tags["pass"] = "draft"
        caps.append(cap)
