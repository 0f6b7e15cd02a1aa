"""Measure what a verify forward of each width costs on this machine, and pick the widths worth padding to.

On a CPU the cost of a cached forward is not monotone in its width: oneDNN/MKL pick different
kernels for different row counts (SmolLM2 on 2 threads: 5 tokens cost 1.33x one token, 3 tokens
1.93x). Padding a short verify window up to a cheaper, wider one is then free speed; the padding
is causally invisible. ``efficient_widths`` keeps every width that is cheaper than all wider ones.

>>> efficient_widths({1: 1.0, 2: 1.6, 3: 1.9, 4: 1.5, 5: 1.3, 6: 1.4})
(1, 5, 6)
"""

from __future__ import annotations

import time

import torch

from .config import SpecConfig
from .core import forward, new_cache
from .drafters import make_drafter
from .speculative import speculative_generate
from .thinking import run_thinking


@torch.no_grad()
def time_windows(model, prompt_ids, widths=tuple(range(1, 10)), repeats: int = 7) -> dict[int, list[float]]:
    """Seconds of one cached forward of W tokens after ``prompt_ids``, per W, interleaved in
    alternating order (the first round is a warm-up and is dropped)."""
    ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1)  # [n]
    if repeats < 1 or not widths or min(widths) < 1:
        raise ValueError(f"need repeats >= 1 and positive widths; got repeats={repeats}, widths={widths!r}")
    cache = new_cache(model, ids.numel() + max(widths) + 1)
    forward(model, ids, cache)
    times: dict[int, list[float]] = {w: [] for w in widths}
    for r in range(repeats + 1):
        for w in (widths if r % 2 else tuple(widths)[::-1]):
            x = torch.zeros(w, dtype=torch.long)  # [w]
            with cache.tentative():  # the cache holds the prompt again after each timed forward
                t0 = time.perf_counter()
                forward(model, x, cache)
                dt = time.perf_counter() - t0
            if r:
                times[w].append(dt)
    return times


def efficient_widths(costs: dict[int, float]) -> tuple[int, ...]:
    """Widths cheaper than every wider width (the only ones worth padding up to). Width 1 (a plain
    decode step) is always kept: a step with no draft never pads."""
    keep = [w for w in sorted(costs) if all(costs[w] < costs[x] for x in costs if x > w)]
    return tuple(sorted(set(keep) | ({1} if 1 in costs else set())))


def measure_verify_widths(model, prompt_ids, max_width: int = 9, repeats: int = 11) -> tuple[tuple[int, ...], dict]:
    """``(widths, relative cost per width)`` measured on ``model``: pass the widths to
    ``SpecConfig(fixed_window=False, verify_widths=widths)``. Costs are the fastest of ``repeats``
    interleaved runs (the minimum is what other processes on a shared machine disturb least)."""
    times = time_windows(model, prompt_ids, tuple(range(1, max_width + 1)), repeats)
    base = min(times[1])
    costs = {w: min(t) / base for w, t in times.items()}
    return efficient_widths(costs), costs


def choose_tree_nodes(path_ranks: list[list[int]], costs: dict[int, float], max_nodes: int) -> tuple[int, dict]:
    """The tree size (nodes) that maximises committed tokens per unit of verify cost on this machine.

    ``path_ranks`` are, per verify step of a calibration run with trees of ``max_nodes`` nodes
    (``Generation.path_ranks``), the drafter's ranks of the accepted nodes, root to leaf. A tree of
    the drafter's best ``n`` nodes would have accepted the longest prefix of that path whose ranks
    are all below ``n`` (the nodes' logits depend only on their own path), so one run measures every
    size. ``costs`` maps a forward's width to its cost relative to a 1-token step (``measure_verify_widths``);
    a tree of n nodes pays the cheapest measured width >= n + 1. Returns ``(nodes, {n: tokens per cost})``.

    >>> choose_tree_nodes([[0, 1], [0], [2]], {1: 1.0, 2: 1.2, 3: 1.3, 4: 1.4}, 3)[0]
    3
    """
    if not path_ranks:
        raise ValueError("no calibration steps: run tree decoding with SpecConfig(tree=...) first and pass "
                         "Generation.path_ranks of its steps")
    value = {}
    for n in range(1, max_nodes + 1):
        fits = [c for w, c in costs.items() if w >= n + 1]
        if not fits:
            break
        accepted = sum(next((j for j, r in enumerate(path) if r >= n), len(path)) for path in path_ranks)
        value[n] = (len(path_ranks) + accepted) / len(path_ranks) / min(fits)
    if not value:
        raise ValueError(f"costs cover widths {sorted(costs)}; measure widths up to at least 2 "
                         f"(one node + the pending token)")
    best = max(value.values())
    return min(n for n, v in value.items() if v >= best - 1e-12), value


@torch.no_grad()
def choose_prefill_k(model, prompts, ks=(1, 2, 4, 8, 16), repeats: int = 3, drafter=None) -> tuple[int, dict]:
    """The speculative-prefill width k (chunks drafted per backbone forward) that runs a Thinking
    States model fastest on ``prompts`` (lists of token ids) on this machine, as `measure_verify_widths`
    does for verify widths: ``(k, {k: seconds})``, each the fastest of ``repeats`` interleaved passes
    over all the prompts. ``{"chunked": seconds}`` is there too, for reference. ``drafter()`` gives
    each run its thought drafter (`models.thinking.drafter`; None: run_thinking's default).

    >>> from beliefscope.models import load_model
    >>> model, tok = load_model("thinking-empty")
    >>> k, secs = choose_prefill_k(model, [tok("A coin is heads . Alice stays . State ?")["input_ids"]], ks=(1, 4),
    ...                            repeats=1)
    >>> k in (1, 4) and sorted(secs, key=str)
    [1, 4, 'chunked']
    """

    if not prompts or not ks or min(ks) < 1 or repeats < 1:
        raise ValueError(f"need prompts, ks >= 1 and repeats >= 1; got {len(prompts)} prompts, ks={ks!r}, "
                         f"repeats={repeats}")
    runs = {k: dict(prefill="speculative", k=k) for k in ks} | {"chunked": dict(prefill="chunked")}
    times: dict = {k: [] for k in runs}
    for r in range(repeats):
        for k in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            t0 = time.perf_counter()
            for p in prompts:
                extra = {"thought_drafter": drafter()} if drafter is not None and k != "chunked" else {}
                run_thinking(model, p, max_new_tokens=1, keep_thoughts=False, **runs[k], **extra)
            times[k].append(time.perf_counter() - t0)
    secs = {k: min(v) for k, v in times.items()}
    return min(ks, key=lambda k: (secs[k], k)), secs


def choose_drafter(model, prompts, specs, max_new_tokens: int, repeats: int = 3) -> tuple[str, dict]:
    """The drafter (a `make_drafter` spelling, or ``"none"`` for plain cached greedy) that decodes
    ``prompts`` (lists of token ids) fastest with ``model`` on this machine: ``(spec, {spec: seconds})``,
    each the fastest of ``repeats`` interleaved passes over all the prompts (greedy, ``fixed_window=False``,
    stopping at eos). Used to give a baseline its best drafter before comparing against it.

    >>> from beliefscope.models import load_model
    >>> model, tok = load_model("cot-rope")
    >>> spec, secs = choose_drafter(model, [tok("A coin is heads . Alice flips . State ? Think :")["input_ids"]],
    ...                             ("ngram:3",), max_new_tokens=4, repeats=1)
    >>> spec in ("none", "ngram:3") and sorted(secs)
    ['ngram:3', 'none']
    """

    if not prompts or repeats < 1:
        raise ValueError(f"need prompts and repeats >= 1; got {len(prompts)} prompts, repeats={repeats}")
    names = ["none", *[s for s in specs if s != "none"]]
    drafters = {s: make_drafter(s, model) for s in names}  # built once: a draft model or store loads here
    cfg = SpecConfig(max_new_tokens=max_new_tokens, stop_at_eos=True, fixed_window=False)
    times: dict = {s: [] for s in names}
    for r in range(repeats):
        for s in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            for p in prompts:
                speculative_generate(model, drafters[s], p, cfg)
            times[s].append(time.perf_counter() - t0)
    secs = {s: min(v) for s, v in times.items()}
    return min(names, key=lambda s: (secs[s], names.index(s))), secs
