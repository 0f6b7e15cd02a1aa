"""The determinism workload: measured prompts among other requests that arrive over time, run by the
`decoding.scheduler.Scheduler` in several batch sizes and arrival orders (what `beliefscope determinism`
measures: one output per prompt means deterministic).
"""

from __future__ import annotations

import random
from collections import Counter

import torch

from .scheduler import Request, Scheduler, SchedulerConfig


def sweep_workload(prompts, others_prompts, k: int, order: int, max_new_tokens: int, deterministic: bool,
                   n_others: int | None = None) -> list[Request]:
    """One configuration of the determinism workload: the measured prompts (``max_new_tokens`` each)
    and, when ``k > 0``, ``n_others`` other requests (default half as many; random prompts from
    ``others_prompts``, 1/4x to 2x as many new tokens, so requests finish at different rounds), in
    arrival order ``order`` (0 as listed, 1 reversed, 2 shuffled), arriving over time: random gaps
    with a mean of one request per ``mean length / (k + 1)`` rounds, so a ``max_batch = k + 1`` batch
    fills and drains and the decode batch size changes from round to round."""
    rng = random.Random(f"{k}/{order}")
    reqs = [Request(list(p), max_new_tokens, deterministic=deterministic) for p in prompts]
    n_others = (len(prompts) // 2 if n_others is None else n_others) if k else 0
    reqs += [Request(list(rng.choice(others_prompts)), rng.randint(max(1, max_new_tokens // 4), 2 * max_new_tokens))
             for _ in range(n_others)]
    idx = list(range(len(reqs)))
    if order == 1:
        idx.reverse()
    elif order == 2:
        rng.shuffle(idx)
    mean_len = sum(r.max_new_tokens for r in reqs) / len(reqs)
    t = 0.0
    for i in idx:
        reqs[i].arrival = int(t)
        t += rng.expovariate((k + 1) / mean_len)
    return reqs


def determinism_sweep(model, prompts, others_prompts, others=(0, 1, 3, 7, 15), orders=3, window=4,
                      max_new_tokens=12, fast_dtype=torch.float32, deterministic=True, eos=None,
                      slot_capacity=None, n_others=None, progress=None, stats=None, verify_slots=4,
                      fast_kernels="default", compile=False, schedulers: dict | None = None,
                      max_batch: int | None = None):
    """Run every measured prompt (flagged ``deterministic`` or not) among up to ``k`` other requests
    (``max_batch = k + 1``) for every ``k`` in ``others``, in ``orders`` arrival orders (see
    :func:`sweep_workload`; a lone request, ``k = 0``, has one order). Returns
    ``{prompt index: set of outputs seen}``; one output per prompt means deterministic. ``stats``
    (a dict) receives the fast path's decode batch sizes and acceptance; ``progress(1)`` is called
    after each configuration. ``verify_slots`` is the same B for every k (it is part of the verify shape).
    ``fast_kernels``: `SchedulerConfig.fast_kernels` ("row-invariant": the batch-invariant fast path);
    ``compile``: `SchedulerConfig.compile` (replayed forwards). ``schedulers``: a dict the caller keeps across
    sweeps of one model; a sweep with the same configuration reuses the scheduler (and its recordings) it holds.
    ``max_batch``: the scheduler's batch limit (default ``max(others) + 1``); sweeps that share schedulers give
    the largest they will run, and each run is limited to ``k + 1``.

    >>> from beliefscope.models.testing import tiny_gpt2
    >>> seen = determinism_sweep(tiny_gpt2(), [[3, 4]], [[5, 6, 7]], others=(0, 1), orders=2, max_new_tokens=3)
    >>> len(seen[0])
    1
    """
    if not prompts:
        raise ValueError("the workload is empty: give at least one measured prompt")
    if k_bad := [k for k in others if k < 0]:
        raise ValueError(f"numbers of co-batched requests must be >= 0, got {k_bad}")
    longest = max(len(p) for p in [*prompts, *others_prompts])
    cap = slot_capacity or longest + 2 * max_new_tokens + window
    seen = {i: set() for i in range(len(prompts))}
    stats = {} if stats is None else stats
    stats.setdefault("batch_sizes", Counter())
    for key in ("accepted", "drafted", "configurations"):
        stats.setdefault(key, 0)
    stats.setdefault("min_margin", float("inf"))
    size = max_batch or max(others, default=0) + 1
    if size < max(others, default=0) + 1:
        raise ValueError(f"max_batch={max_batch} is below the largest batch of this sweep ({max(others) + 1}): "
                         "leave it unset or raise it")
    want = SchedulerConfig(window=window, fast_dtype=fast_dtype, eos_token_id=eos, max_batch=size,
                           slot_capacity=cap, verify_slots=verify_slots, fast_kernels=fast_kernels, compile=compile)
    key = (id(model), repr(want))
    sched = schedulers.get(key) if schedulers is not None else None
    if sched is None:  # one scheduler for every k: its slot caches and recordings serve each batch limit
        sched = Scheduler(model, want)
        if schedulers is not None:
            schedulers[key] = sched
    for k in others:
        for order in range(orders if k else 1):
            reqs = sweep_workload(prompts, others_prompts, k, order, max_new_tokens, deterministic, n_others)
            outs = sched.run(reqs, max_batch=k + 1)
            for i in range(len(prompts)):
                seen[i].add(tuple(outs[i]))
            stats["batch_sizes"].update(sched.batch_sizes)
            stats["accepted"] += sum(r.accepted for r in reqs)
            stats["drafted"] += sum(r.drafted for r in reqs)
            stats["configurations"] += 1
            stats["min_margin"] = min(stats["min_margin"], sched.min_margin)
            stats["compiled"] = sched.compiled  # what the scheduler replayed, if it was asked to
            if progress:
                progress(1)
    return seen
