"""Deterministic requests among others (LLM-42 style decode -> verify -> rollback).

Every active request decodes through the *fast path*: continuous batching over a KV-cache pool
(one row per request, prefilled alone when it arrives, then one ``[batch, 1]`` decode forward per
round over the active rows). The decode batch grows and shrinks as requests arrive and finish,
so its shapes, and on most hardware its rounding, follow the batch; it may also run in
bfloat16. A request flagged ``deterministic`` also owns one of ``verify_slots`` rows of a
:func:`decoding.slots.slot_cache` (a `KVCache` on a slot layout) and is verified every ``window - 1`` fast tokens by the
reference, together with the other deterministic requests that are due:

- ``verify_kernels="row-invariant"`` (the default for float32 on a CPU): a copy of the model
  whose rows keep their bits in any batch (`models.invariant_attention`) verifies the due rows
  only, over their own keys, so a verify costs what its rows need and its output depends on
  neither the batch, nor W, nor the number of slots;
- ``verify_kernels="fixed-shape"``: one forward of shape ``[verify_slots, window]`` over the
  slots' whole capacity (rows with nothing to verify, and free slots, are dummy rows); no shape
  depends on the batch, so the output depends only on the request and (W, B, capacity).

Other requests keep the fast path's tokens unverified. With ``window=1`` a deterministic request
skips the fast path: every token comes from a verify forward. With ``fast_kernels="row-invariant"``
the fast path itself runs on the row-invariant copy: every request is deterministic, and flagged
ones are not verified (their fast tokens are the verifier's bits).

>>> from beliefscope.models.testing import tiny_gpt2
>>> sched = Scheduler(tiny_gpt2(), SchedulerConfig(window=3, max_batch=2, slot_capacity=32))
>>> outs = sched.run([Request([3, 4, 5], 4, deterministic=True), Request([7, 8], 4)])
>>> [len(o) for o in outs]
[4, 4]
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field

import torch

from ..cache.keep import Keep
from ..cache.slots import empty_row, move_row
from ..models.invariant_attention import row_invariant_copy
from ..models.packed import can_pack
from ..models.profile import sliding_windows
from . import engine
from .core import check_prompt, clip_new, hf_model, pad_window, token_budget
from .graphed import SlotReplays
from .slots import prefill_slot, slot_cache, verify_rows, verify_slots
from .speculative import accept_greedy


@dataclass
class SchedulerConfig:
    """How the scheduler batches and verifies (greedy decoding)."""

    window: int = 4  # verify window W: pending token + up to W-1 fast-path drafts, always padded to W
    verify_slots: int = 4  # B: every verify forward is [B, W]; at most B deterministic requests run at once
    slot_capacity: int = 512  # C: tokens per slot (prompt + new tokens + W); fixed so the shape never changes
    max_batch: int = 16  # most requests decoded together by the fast path (others wait, FIFO)
    fast_dtype: torch.dtype = torch.float32  # dtype of the fast path (bfloat16 = LLM-42's low-precision path)
    eos_token_id: int | None = None  # stop a request after this token (None: never stop early)
    pad_token_id: int = 0  # filler of verify windows and of dummy verify rows
    verify_kernels: str = "auto"  # "row-invariant": a packed, tiled-attention copy verifies only the due rows
    #   over their own keys (cost follows the work; CPU float32); "fixed-shape": [verify_slots, W] over the
    #   whole capacity with dummy rows (any device); "auto": row-invariant where packing is available
    fast_kernels: str = "default"  # "row-invariant": the fast path runs on that copy too (batch-invariant), and
    #   deterministic requests need no verify: their fast tokens are the bits a verify would compute
    verify_invariant_fast: bool = False  # verify them anyway (a check: every draft is then accepted)
    compile: bool = False  # replay the fast rounds (one recording per batch size, over the whole capacity) and the
    #   fixed-shape verifies: CUDA graphs on a GPU, torch.compile on the CPU (decoding.graphed.SlotReplays)


@dataclass
class Request:
    """One generation request."""

    prompt: list[int]  # prompt token ids
    max_new_tokens: int = 16  # tokens to generate
    deterministic: bool = False  # verify in fixed-shape windows (output independent of the batch)
    arrival: int = 0  # scheduler round at which the request arrives
    # filled by the scheduler:
    tokens: list[int] = field(default_factory=list)  # committed new tokens
    drafts: list[int] = field(default_factory=list)  # fast-path tokens awaiting verification
    slot: int | None = None  # row of the scheduler's slot cache, `slots` (deterministic requests only)
    row: int | None = None  # row of the fast path's KV pool while active (None: not on the fast path)
    verifies: int = 0  # verify passes run
    accepted: int = 0  # fast-path tokens accepted by the verifier
    drafted: int = 0  # fast-path tokens proposed to the verifier
    eos: int | None = None  # the scheduler's eos_token_id (set by run)

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new_tokens or (self.eos is not None and self.tokens[-1:] == [self.eos])


class Scheduler:
    """Runs requests to completion; ``run(requests)`` returns their new tokens in input order.

    ``fast`` (optional) replaces the fast path's model (default: the target, cast to
    ``cfg.fast_dtype``), e.g. a perturbed copy in tests; verification always uses ``target``.
    After a run, ``rounds`` counts scheduler rounds and ``batch_sizes`` counts fast-path decode
    forwards by batch size, and ``min_margin`` is the smallest top-1 minus top-2 logit the fast
    path decided on (how close it came to a tie).
    """

    def __init__(self, target, cfg: SchedulerConfig | None = None, fast=None):
        self.cfg = cfg or SchedulerConfig()
        for name in ("window", "verify_slots", "max_batch", "slot_capacity"):
            if getattr(self.cfg, name) < 1:
                raise ValueError(f"SchedulerConfig.{name}={getattr(self.cfg, name)} must be >= 1")
        self.target = target
        hf = hf_model(target)
        if fast is not None:
            self.fast = hf_model(fast)
        elif self.cfg.fast_dtype == next(hf.parameters()).dtype:
            self.fast = hf
        else:
            self.fast = copy.deepcopy(hf).to(self.cfg.fast_dtype).eval()
        self.verify_kernels = self._resolve_kernels(hf)
        # on a batch-invariant fast path with the verifier's kernels, a deterministic request's fast tokens
        # already are its verified tokens (the same bits): it is verified only when asked, as a check
        self._verified = not (self.cfg.fast_kernels == "row-invariant" and self.verify_kernels == "row-invariant"
                              and not self.cfg.verify_invariant_fast)
        self.verifier = row_invariant_copy(hf) if self.verify_kernels == "row-invariant" else None
        if self.cfg.fast_kernels == "row-invariant":
            if self.cfg.fast_dtype != torch.float32 or fast is not None:
                raise ValueError("fast_kernels='row-invariant' runs the fast path on the float32 row-invariant copy: "
                                 f"leave fast_dtype float32 (got {self.cfg.fast_dtype}) and fast unset")
            self.fast = self.verifier if self.verifier is not None else row_invariant_copy(hf)
        elif self.cfg.fast_kernels != "default":
            raise ValueError(f"SchedulerConfig.fast_kernels={self.cfg.fast_kernels!r} is unknown: use 'default' or "
                             "'row-invariant'")
        self.rounds = 0  # scheduler rounds of the last run
        self.batch_sizes: Counter = Counter()  # fast-path decode forwards of the last run, by batch size
        self.verify_forwards = 0  # verify forwards of the last run
        self.verify_rows = 0  # rows they computed for requests (not counting fixed-shape dummy rows)
        self.min_margin = float("inf")  # smallest top-1 minus top-2 logit of any fast-path token of the last run
        self.compiled = ""  # with cfg.compile: what the last run replayed ("cuda-graphs", ...), or why not
        self.replays: dict = {}  # with cfg.compile: the recorded forwards, kept from run to run

    def _resolve_kernels(self, hf) -> str:
        """The verify kernels this run uses: ``cfg.verify_kernels``, with "auto" resolved (row-invariant
        where the weights can be packed and every layer attends to all its keys, else fixed-shape)."""

        kind = self.cfg.verify_kernels
        if kind not in ("auto", "row-invariant", "fixed-shape"):
            raise ValueError(f"SchedulerConfig.verify_kernels={kind!r} is unknown: use 'auto', 'row-invariant' or "
                             "'fixed-shape'")
        sliding = any(w is not None for w in sliding_windows(hf.config))
        if kind == "row-invariant" and sliding:
            raise ValueError("verify_kernels='row-invariant' reads every key of a row, and this model has "
                             "sliding-window layers: use verify_kernels='fixed-shape' (or 'auto', which picks it)")
        if kind != "auto":
            return kind
        return "row-invariant" if can_pack(hf) and not sliding else "fixed-shape"

    def _check(self, requests: list[Request]) -> None:
        cfg = self.cfg
        if not requests:
            raise ValueError("the workload is empty: give Scheduler.run at least one Request")
        for r in requests:
            check_prompt(self.target, r.prompt)
            r.tokens, r.drafts, r.eos, r.verifies, r.accepted, r.drafted = [], [], cfg.eos_token_id, 0, 0, 0
            r.slot = r.row = None
            r.max_new_tokens = token_budget(self.target, len(r.prompt), r.max_new_tokens, cfg.window)
            need = len(r.prompt) + r.max_new_tokens + cfg.window
            if need > cfg.slot_capacity:
                kind = "deterministic request" if r.deterministic else "request (fast-path pool row)"
                raise ValueError(f"a {kind} needs {len(r.prompt)} prompt + {r.max_new_tokens} new + "
                                 f"{cfg.window} window tokens but slot_capacity={cfg.slot_capacity}: raise "
                                 "SchedulerConfig.slot_capacity (the same value for every run you compare)")

    @torch.no_grad()
    def run(self, requests: list[Request], max_batch: int | None = None) -> list[list[int]]:
        """Every request to completion (the engine stepping this scheduler, one round per step); their new
        tokens in input order. ``max_batch``: this run's batch limit, at most ``cfg.max_batch`` (the fast
        path's cache has that many rows): one scheduler, and its recordings, serves runs at several limits."""
        cfg = self.cfg
        limit = cfg.max_batch if max_batch is None else max_batch
        if not 1 <= limit <= cfg.max_batch:
            raise ValueError(f"max_batch={max_batch} for this run must be in [1, {cfg.max_batch}] (the scheduler's "
                             "SchedulerConfig.max_batch, which sizes its fast-path cache): build it with the "
                             "largest limit you will run")
        self._limit = limit
        self._check(requests)
        self._requests = requests
        self._waiting = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i))
        self._active: list[Request] = []
        self._free = list(range(cfg.verify_slots))
        self.rounds, self.batch_sizes, self.verify_forwards, self.min_margin = 0, Counter(), 0, float("inf")
        self.verify_rows = 0
        if cfg.compile and self.replays:  # the recordings read these buffers: keep them, emptied (stale K/V
            self.slots.reset()  # past a row's length is masked, so it changes no bit)
            self.pool.reset()
        else:
            # the verify slots and the fast path's pool (a row per request): slot caches, whose events and
            # provenance say what each request's rows held (`cache.recorder`)
            self.slots = slot_cache(self.target, cfg.verify_slots, cfg.slot_capacity)
            self.pool = slot_cache(self.fast, cfg.max_batch, cfg.slot_capacity)
            self.replays = self._replays() if cfg.compile else {}
        self.rows: list[Request] = []  # rows[i] owns pool row i (compacted as requests finish)
        engine.run(self)
        return [r.tokens for r in requests]

    def _replays(self) -> dict:
        """The recorded forwards of this run: ``{"fast": SlotReplays, "verify": SlotReplays}`` (verify only with
        the fixed-shape kernels: the row-invariant copy is a CPU path); ``compiled`` says what runs."""
        out = {"fast": SlotReplays(self.fast, self.pool)}
        if self.verifier is None:
            out["verify"] = SlotReplays(self.target, self.slots)
        why = {k: r.why_not for k, r in out.items() if r.why_not}
        self.compiled = "; ".join(f"{k}: eager ({w})" for k, w in why.items()) or out["fast"].mode
        return {k: r for k, r in out.items() if not r.why_not}

    def done(self) -> bool:
        return not (self._waiting or self._active)

    def propose(self) -> list[Request] | None:
        """A round up to its verify: admit the requests that arrived, retire finished ones, one fast-path
        token for every pooled request. Returns the deterministic requests due for a verify, or None
        when none is (the round then ends here)."""
        cfg, requests = self.cfg, self._requests
        for i in [i for i in self._waiting if requests[i].arrival <= self.rounds]:  # FIFO among arrivals
            r = requests[i]
            if len(self._active) >= self._limit:
                break
            if self._checked(r):
                if not self._free:  # every verify slot is taken: wait for one (later requests may pass)
                    continue
                r.slot = self._free.pop(0)
                self._prefill(r)
            if not (self._checked(r) and cfg.window == 1):
                self._fast_prefill(r)
            self._waiting.remove(i)
            self._active.append(r)
        if not self._active:  # nothing has arrived yet: time passes
            self.rounds += 1
            return None
        self._active = self._retire(self._active, self._free)
        if self.rows:
            self._fast_round()
        det = [r for r in self._active if self._checked(r)]
        if any(len(r.drafts) >= min(cfg.window - 1, r.max_new_tokens - len(r.tokens) - 1)
               or self._stopped(r.drafts) for r in det):
            # grouped verification: when one is due, every deterministic request with drafts rides
            # along, so they fall into step and share one forward per window
            return [r for r in det if r.drafts or r.row is None or len(r.tokens) + 1 >= r.max_new_tokens]
        self._end_round()
        return None

    def _end_round(self) -> None:
        self._active = self._retire(self._active, self._free)
        self.rounds += 1

    def _retire(self, active: list[Request], free: list[int]) -> list[Request]:
        """Drop finished requests: free their verify slot (it holds the request until another takes it), compact
        the fast pool's rows."""
        for r in active:
            if r.done and r.slot is not None:
                free.append(r.slot)
                r.slot = None
        if any(r.done for r in self.rows):
            kept = [r for r in self.rows if not r.done]
            for i, r in enumerate(kept):  # ascending: a row only moves down, onto a finished or moved one
                if r.row != i:
                    move_row(self.pool, r.row, i)
                    r.row = i
            for r in self.rows:
                if r.done:
                    r.row = None
            self.rows = kept
        return [r for r in active if not r.done]

    def _checked(self, r: Request) -> bool:
        """Whether ``r``'s fast tokens are drafts for a verify (else they are its tokens)."""
        return r.deterministic and self._verified

    def _stopped(self, drafts) -> bool:
        return self.cfg.eos_token_id is not None and self.cfg.eos_token_id in drafts

    def _prefill(self, r: Request) -> None:
        """Reference prefill ``[1, n]`` (its shape depends on the prompt only); its argmax is the first
        token, and its K/V go into the request's slot."""
        model = self.verifier if self.verifier is not None else self.target  # the verifier's own kernels
        r.tokens = [int(prefill_slot(self.slots, model, r.slot, r.prompt)[-1].argmax())]

    def _fast_prefill(self, r: Request) -> None:
        """Fast-path prefill ``[1, n]`` into a new pool row; an unverified request's first token."""
        r.row = len(self.rows)
        self.rows.append(r)
        empty_row(self.pool, r.row)  # a row a finished request left
        logits = verify_slots(self.pool, self.fast, torch.tensor([r.prompt]), rows=range(r.row, r.row + 1),
                        span=len(r.prompt))
        if not self._checked(r):
            r.tokens = [int(logits[0, -1].argmax())]

    def _fast_round(self) -> None:
        """One fast-path token for every request in the pool: a ``[batch, 1]`` decode forward over
        the first ``batch`` rows and as many positions as the longest of them needs."""
        n = len(self.rows)
        x = torch.tensor([[(r.prompt + r.tokens + r.drafts)[-1]] for r in self.rows])  # [batch, 1]
        if "fast" in self.replays:  # [batch, 1] over the whole capacity, one recording per batch size
            best, top = self.replays["fast"].greedy(x)  # [batch], [batch, 2], reduced on the device
        else:  # over the longest row's keys; every row grows by its token
            span = max(self.pool.layout.lengths[:n]) + 1
            last = verify_slots(self.pool, self.fast, x, rows=range(n), span=span)[:, -1]  # [batch, vocab]
            best, top = last.argmax(-1), last.topk(2, dim=-1).values
        self.batch_sizes[n] += 1
        self.min_margin = min(self.min_margin, float((top[:, 0] - top[:, 1]).min()))
        for r, t in zip(self.rows, best.tolist()):
            (r.drafts if self._checked(r) else r.tokens).append(t)

    def verify(self, due: list[Request]) -> tuple[list, torch.Tensor]:
        """One reference forward; each due row holds ``[pending, drafts..., padding]`` (``window`` wide).
        Fixed-shape: ``[verify_slots, window]``, every other row a dummy; row-invariant: the due rows only,
        over their own keys. Returns ``([(request, drafts, budget, logits row)], logits)``."""
        pad, window = self.cfg.pad_token_id, self.cfg.window
        invariant = self.verifier is not None
        x = torch.full((len(due) if invariant else self.cfg.verify_slots, window), pad, dtype=torch.long)  # [B, W]
        rows, self._before = [], list(self.slots.layout.lengths)  # the slots' lengths before the forward appends W
        for i, r in enumerate(due):
            budget = r.max_new_tokens - len(r.tokens)
            drafts = torch.tensor(r.drafts[: max(0, min(window - 1, budget - 1))], dtype=torch.long)
            row = i if invariant else r.slot
            x[row] = pad_window(torch.cat([torch.tensor(r.tokens[-1:]), drafts]), window, pad)
            rows.append((r, drafts, budget, row))
        if invariant:  # the due rows only, over their own keys: a row's bits do not depend on the others
            logits = verify_rows(self.slots, self.verifier, x, [r.slot for r in due])  # [n, W, vocab]
        elif "verify" in self.replays:
            logits = self.replays["verify"].logits(x)  # [B, W, vocab], the same shape, replayed
        else:
            logits = verify_slots(self.slots, self.target, x)  # [B, W, vocab]
        self.verify_forwards += 1
        self.verify_rows += len(due)
        return rows, logits

    def accept(self, due: list[Request], out: tuple[list, torch.Tensor]) -> list[tuple]:
        """Per due row: ``(request, drafts, accepted drafts, new tokens)``, greedy, clipped (`clip_new`)."""
        rows, logits = out
        kept = []
        for r, drafts, budget, row in rows:
            accepted, nxt = accept_greedy(logits[row, : drafts.numel() + 1], drafts)
            new = clip_new([*drafts[:accepted].tolist(), nxt], budget, self.cfg.eos_token_id)
            ended = self.cfg.eos_token_id is not None and new[-1] == self.cfg.eos_token_id
            if not ended and r.row is not None and accepted == len(r.drafts) and len(new) < budget:
                # every fast token accepted: the pool lacks the last draft's K/V, so the reference's
                # extra token waits for the next window (the output is the same greedy sequence)
                new = new[:-1]
            kept.append((r, drafts, accepted, new))
        return kept

    def keep(self, due: list[Request], kept: list[tuple]) -> tuple[Keep, Keep]:
        """What the two caches keep: each verify slot its length before the forward plus its new tokens (every
        other slot, a dummy row of a fixed-shape verify, its length before), and each due request's fast-path
        row its committed tokens less the pending one (its rejected drafts' K/V are dropped)."""
        slots = list(self._before)
        pool = list(self.pool.layout.lengths)
        for r, drafts, accepted, new in kept:
            slots[r.slot] += len(new)
            if r.row is not None:  # (a request that ends here may keep a token its row never fed: min)
                pool[r.row] = min(pool[r.row], len(r.prompt) + len(r.tokens) + len(new) - 1)
        return Keep(slots, cache=self.slots), Keep(pool, cache=self.pool)

    def commit(self, due: list[Request], kept: list[tuple]) -> None:
        """Record each row's accepted tokens (the caches already keep them: `keep`); the round ends."""
        for r, drafts, accepted, new in kept:
            r.tokens += new
            r.drafts = []
            r.verifies += 1
            r.accepted += accepted
            r.drafted += drafts.numel()
        self._end_round()
