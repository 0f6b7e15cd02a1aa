"""Deterministic requests among others (LLM-42 style decode -> verify -> rollback).

Every active request decodes through the *fast path*: one dynamic batch (left-padded, its
composition changes as requests arrive and finish; optionally bfloat16). A request flagged
``deterministic`` owns one of ``verify_slots`` rows of a static :class:`decoding.slots.SlotCache`
and is verified every ``window - 1`` fast tokens by the reference, together with the other
deterministic requests that are due, in one forward of fixed shape ``[verify_slots, window]``
over the slots' whole capacity (rows with nothing to verify, and free slots, are dummy rows). No
shape depends on the batch, so its output depends only on the request (and W, B, capacity).
Other requests keep the fast path's tokens unverified.

>>> from beliefscope.cache.testing import tiny_gpt2
>>> sched = Scheduler(tiny_gpt2(), SchedulerConfig(window=3, max_batch=2))
>>> outs = sched.run([Request([3, 4, 5], 4, deterministic=True), Request([7, 8], 4)])
>>> [len(o) for o in outs]
[4, 4]
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field

import torch
from beliefscope.decoding.config import SpecConfig
from beliefscope.decoding.core import check_prompt, forward, hf_model, new_cache, pad_window, token_budget
from beliefscope.decoding.slots import SlotCache
from beliefscope.decoding.speculative import accept_greedy


@dataclass
class SchedulerConfig:
    """How the scheduler batches and verifies (greedy decoding)."""

    window: int = 4  # verify window W: pending token + up to W-1 fast-path drafts, always padded to W
    verify_slots: int = 4  # B: every verify forward is [B, W]; at most B deterministic requests run at once
    slot_capacity: int = 512  # C: tokens per slot (prompt + new tokens + W); fixed so the shape never changes
    max_batch: int = 16  # most requests decoded together by the fast path (others wait, FIFO)
    fast_dtype: torch.dtype = torch.float32  # dtype of the fast path (bfloat16 = LLM-42's low-precision path)
    eos_token_id: int | None = None  # stop a request after this token (None: never stop early)
    pad_token_id: int = 0  # filler of the left-padded fast-path batch and of verify windows


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
    slot: int | None = None  # row of the scheduler's SlotCache (deterministic requests only)
    verifies: int = 0  # verify passes run
    accepted: int = 0  # fast-path tokens accepted by the verifier
    drafted: int = 0  # fast-path tokens proposed to the verifier

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new_tokens or (self.eos is not None and self.tokens[-1:] == [self.eos])

    eos: int | None = None


class Scheduler:
    """Runs requests to completion; ``run(requests)`` returns their new tokens in input order."""

    def __init__(self, target, cfg: SchedulerConfig | None = None):
        self.cfg = cfg or SchedulerConfig()
        if self.cfg.window < 1:
            raise ValueError(f"window={self.cfg.window} must be >= 1")
        if self.cfg.verify_slots < 1:
            raise ValueError(f"verify_slots={self.cfg.verify_slots} must be >= 1")
        self.target = target
        hf = hf_model(target)
        self.fast = hf if self.cfg.fast_dtype == next(hf.parameters()).dtype else \
            copy.deepcopy(hf).to(self.cfg.fast_dtype).eval()
        self.rounds = 0  # fast-path forwards of the last run

    @torch.no_grad()
    def run(self, requests: list[Request]) -> list[list[int]]:
        cfg = self.cfg
        spec = SpecConfig(gamma=max(1, cfg.window - 1), max_new_tokens=1, stop_at_eos=False)
        waiting = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i))
        active: list[Request] = []
        self.rounds = 0
        self.slots = SlotCache.for_model(self.target, cfg.verify_slots, cfg.slot_capacity)
        free = list(range(cfg.verify_slots))
        for r in requests:
            check_prompt(self.target, r.prompt)
            r.tokens, r.drafts, r.eos, r.verifies, r.accepted, r.drafted = [], [], cfg.eos_token_id, 0, 0, 0
            r.slot = None
            r.max_new_tokens = token_budget(self.target, len(r.prompt), r.max_new_tokens, cfg.window)
            if r.deterministic and len(r.prompt) + r.max_new_tokens + cfg.window > cfg.slot_capacity:
                raise ValueError(f"a deterministic request needs {len(r.prompt)} prompt + {r.max_new_tokens} new + "
                                 f"{cfg.window} window tokens but slot_capacity={cfg.slot_capacity}: raise "
                                 "SchedulerConfig.slot_capacity (the same value for every run you compare)")
        while waiting or active:
            while waiting and len(active) < cfg.max_batch and requests[waiting[0]].arrival <= self.rounds:
                r = requests[waiting[0]]
                if r.deterministic:
                    if not free:  # every verify slot is taken: wait (FIFO) for one to free up
                        break
                    r.slot = free.pop(0)
                    self._prefill(r, spec)
                waiting.pop(0)
                active.append(r)
            if not active:  # nothing has arrived yet: time passes
                self.rounds += 1
                continue
            self._fast_round(active)
            due = []
            for r in active:
                want = min(cfg.window - 1, r.max_new_tokens - len(r.tokens) - 1)
                if r.deterministic and (len(r.drafts) >= want or self._stopped(r.drafts)):
                    due.append(r)
                elif not r.deterministic:
                    r.tokens += r.drafts
                    r.drafts = []
            if due:
                self._verify(due, cfg.window)
            for r in active:
                if r.done and r.slot is not None:
                    self.slots.lengths[r.slot] = 0
                    free.append(r.slot)
                    r.slot = None
            active = [r for r in active if not r.done]
            self.rounds += 1
        return [r.tokens for r in requests]

    def _stopped(self, drafts) -> bool:
        return self.cfg.eos_token_id is not None and self.cfg.eos_token_id in drafts

    def _prefill(self, r: Request, spec: SpecConfig) -> None:
        """Reference prefill ``[1, n]`` (its shape depends on the prompt only); its argmax is the first
        token, and its K/V go into the request's slot."""
        ids = torch.tensor(r.prompt)
        cache = new_cache(self.target, len(r.prompt))
        r.tokens = [int(forward(self.target, ids, cache)[-1].argmax())]
        n_layers = len(self.slots.layers)
        self.slots.load(r.slot, [cache.keys(i) for i in range(n_layers)], [cache.values(i) for i in range(n_layers)])

    def _fast_round(self, active: list[Request]) -> None:
        """One fast-path token for every active request, in one left-padded batch (no cache)."""
        seqs = [r.prompt + r.tokens + r.drafts for r in active]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), self.cfg.pad_token_id, dtype=torch.long)  # [batch, pos]
        mask = torch.zeros((len(seqs), width), dtype=torch.long)  # [batch, pos]
        for i, s in enumerate(seqs):
            ids[i, width - len(s):] = torch.tensor(s)
            mask[i, width - len(s):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [batch, pos]
        logits = self.fast(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]  # [batch, vocab]
        nxt = logits.float().argmax(-1).tolist()
        for r, t in zip(active, nxt):
            if not r.tokens and not r.deterministic:
                r.tokens = [t]  # an unverified request's first token comes from the fast path too
            else:
                r.drafts.append(t)

    def _verify(self, due: list[Request], window: int) -> None:
        """One fixed-shape ``[verify_slots, window]`` reference forward; each due row holds
        ``[pending, drafts..., padding]``, every other row is a dummy. Then accept and roll back per row."""
        pad = self.cfg.pad_token_id
        x = torch.full((self.cfg.verify_slots, window), pad, dtype=torch.long)  # [B, W]
        rows = []
        for r in due:
            budget = r.max_new_tokens - len(r.tokens)
            drafts = torch.tensor(r.drafts[: max(0, min(window - 1, budget - 1))], dtype=torch.long)
            x[r.slot] = pad_window(torch.cat([torch.tensor(r.tokens[-1:]), drafts]), window, pad)
            rows.append((r, drafts, budget))
        logits = self.slots.verify(self.target, x)  # [B, W, vocab]
        for r, drafts, budget in rows:
            accepted, nxt = accept_greedy(logits[r.slot, : drafts.numel() + 1], drafts)
            new = [*drafts[:accepted].tolist(), nxt][:budget]
            if self.cfg.eos_token_id in new:
                new = new[: new.index(self.cfg.eos_token_id) + 1]
            self.slots.lengths[r.slot] += len(new)  # keep the pending token and the accepted drafts: O(1) rollback
            r.tokens += new
            r.drafts = []
            r.verifies += 1
            r.accepted += accepted
            r.drafted += drafts.numel()


def determinism_sweep(model, prompts, others_prompts, others=(0, 1, 3, 7, 15), orders=3, window=4,
                      max_new_tokens=12, fast_dtype=torch.float32, deterministic=True, eos=None):
    """Run every measured prompt (flagged ``deterministic``) among ``k`` other requests at a time for
    every ``k`` in ``others``, in ``orders`` arrival orders (as listed, reversed, shuffled).
    Returns ``{prompt index: set of outputs seen}``; one output per prompt means deterministic.

    >>> from beliefscope.cache.testing import tiny_gpt2
    >>> seen = determinism_sweep(tiny_gpt2(), [[3, 4]], [[5, 6, 7]], others=(0, 1), orders=2, max_new_tokens=3)
    >>> len(seen[0])
    1
    """
    seen = {i: set() for i in range(len(prompts))}
    sched = Scheduler(model, SchedulerConfig(window=window, fast_dtype=fast_dtype, eos_token_id=eos))
    for k in others:
        for order in range(orders):
            reqs = [Request(list(p), max_new_tokens, deterministic=deterministic) for p in prompts]
            n_others = 0 if k == 0 else len(prompts) // 2
            rng = random.Random(f"{k}/{order}")
            reqs += [Request(list(rng.choice(others_prompts)), rng.randint(4, 2 * max_new_tokens))
                     for _ in range(n_others)]
            idx = list(range(len(reqs)))
            if order == 1:
                idx.reverse()
            elif order == 2:
                rng.shuffle(idx)
            for rank, i in enumerate(idx):  # arrival: a few requests per round
                reqs[i].arrival = rank // 3
            sched.cfg.max_batch = k + 1
            outs = sched.run(reqs)
            for i in range(len(prompts)):
                seen[i].add(tuple(outs[i]))
    return seen
