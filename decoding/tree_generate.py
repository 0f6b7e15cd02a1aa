"""Speculative decoding with token trees: draft a tree, verify it in one forward, commit the longest
accepted path (``SpecConfig(tree=TreeConfig(...))``; ``speculative_generate`` dispatches here).

>>> from beliefscope.cache.testing import tiny_gpt2
>>> from beliefscope.decoding.config import SpecConfig, TreeConfig
>>> from beliefscope.decoding.core import generate
>>> from beliefscope.decoding.drafters import NGramDrafter
>>> model = tiny_gpt2()
>>> cfg = SpecConfig(max_new_tokens=6, stop_at_eos=False, tree=TreeConfig(nodes=4, depth=3))
>>> out = tree_generate(model, NGramDrafter(2), [4, 5, 4, 6, 4, 5, 4], cfg)
>>> out.tokens == generate(model, [4, 5, 4, 6, 4, 5, 4], cfg, window=cfg.window_size).tokens
True
"""

from __future__ import annotations

import time

import torch
from beliefscope.cache import Provenance
from beliefscope.decoding.config import SpecConfig, TreeConfig
from beliefscope.decoding.core import (
    Generation,
    check_prompt,
    clip_new,
    eos_id,
    hf_logits,
    new_cache,
    pick,
    token_budget,
)
from beliefscope.decoding.trace import Step, Trace
from beliefscope.decoding.tree import (
    TokenTree,
    accept_tree_greedy,
    accept_tree_sampled,
    commit_path,
    tree_forward_kwargs,
)


@torch.no_grad()
def tree_forward(model, cache, pending: int, tree: TokenTree, width: int) -> torch.Tensor:
    """Logits ``[1 + len(tree), vocab]`` of ``[pending, nodes...]`` padded to ``width``, one forward
    with the tree mask; the cache then holds the pending token and every node (and the padding)."""
    x = torch.zeros(width, dtype=torch.long)  # [width]: pending, nodes, padding (token 0, seen by no node)
    x[0] = pending
    if len(tree):
        x[1:1 + len(tree)] = torch.tensor(tree.tokens)
    kw = tree_forward_kwargs(cache, tree, width, model)
    return hf_logits(model, x[None], **kw)[0, : 1 + len(tree)]


@torch.no_grad()
def tree_generate(model, drafter, prompt_ids, cfg: SpecConfig, *, tokenizer=None) -> Generation:
    """Draft a tree per step (``drafter.propose_tree``), verify it in one forward, commit the longest
    accepted path. Greedy output equals the fixed-shape reference ``generate(window=cfg.window_size)``
    with ``fixed_window=True`` (each node's logits come from its own path, in a forward of the same
    width); sampling uses SpecInfer's multi-candidate rule (``decoding.tree.accept_tree_sampled``).
    """
    shape: TreeConfig = cfg.tree
    if cfg.capture:
        raise ValueError("activation capture (SpecConfig.capture) is not supported with token trees yet: "
                         "drop capture, or set tree=None for chains")
    t_start = time.perf_counter()
    ids0 = check_prompt(model, prompt_ids)
    n_prompt = ids0.numel()
    eos = eos_id(model, cfg, tokenizer)
    room = cfg.max_verify_width
    budget = token_budget(model, n_prompt, cfg.max_new_tokens, room)
    buf = torch.zeros(n_prompt + budget + room, dtype=torch.long)  # committed tokens, prompt first
    buf[:n_prompt] = ids0
    cache = new_cache(model, n_prompt + budget + room, cfg.keep_rejected)
    trace = Trace(n_prompt) if cfg.trace else None
    res = Generation([], n_prompt, 0, 0, 0.0, trace=trace, cache=cache)
    t = time.perf_counter()
    logits = hf_logits(model, ids0[None], past_key_values=cache)[0, -1]
    res.target_seconds += time.perf_counter() - t
    res.target_forwards = 1
    buf[n_prompt] = pick(logits, cfg, n_prompt)
    length = n_prompt + 1  # committed tokens; buf[length - 1] is pending, the cache holds length - 1
    t = time.perf_counter()
    drafter.start(model, buf[:length], cache, cfg)
    res.draft_seconds += time.perf_counter() - t
    while length - n_prompt < budget and int(buf[length - 1]) != eos:
        n_events = len(cache.events)
        pos = length - 1  # absolute position of the pending token
        left = budget - (length - n_prompt) - 1  # drafts past the budget are wasted
        t = time.perf_counter()
        tree = TokenTree([], [])
        if left > 0:
            step_shape = TreeConfig(nodes=shape.nodes, depth=min(shape.depth, left), branch=shape.branch,
                                    min_share=shape.min_share)
            tree = drafter.propose_tree(buf[:length], step_shape, cfg)
        t_draft = time.perf_counter() - t
        t = time.perf_counter()
        width = cfg.verify_width(len(tree) + 1)
        cache.next_provenance = Provenance.VERIFIED
        logits = tree_forward(model, cache, int(buf[pos]), tree, width)  # [1 + n, vocab]
        if cfg.temperature == 0:
            path, nxt = accept_tree_greedy(logits, tree)
        else:
            path, nxt = accept_tree_sampled(logits, tree, cfg.temperature, cfg.seed, pos + 1)
        new = [tree.tokens[i] for i in path] + [nxt]
        new = clip_new(new, budget - (length - n_prompt), eos)
        keep = pos + len(new)  # the pending token and the accepted nodes stay; the last new token is pending
        commit_path(cache, pos, tree, path, keep, cfg.keep_rejected)
        buf[length:length + len(new)] = torch.tensor(new)
        length += len(new)
        t_verify = time.perf_counter() - t
        t = time.perf_counter()
        drafter.sync(length)
        t_draft += time.perf_counter() - t
        res.record_step(drafted=len(tree), accepted=len(path), gamma=max(tree.depths(), default=0),
                        n_new=len(new), draft_s=t_draft, verify_s=t_verify)
        res.tree_nodes.append(len(tree))
        res.path_ranks.append([tree.rank[i] for i in path])
        if trace is not None:
            on_path = set(path[: len(new) - 1])
            trace.steps.append(Step(res.steps - 1, pos, list(tree.tokens), len(path), new,
                                    [tree.tokens[i] for i in range(len(tree)) if i not in on_path],
                                    max(tree.depths(), default=0), t_draft, t_verify,
                                    [tuple(e) for e in cache.events[n_events:]], tree_parents=list(tree.parents),
                                    path=list(path),
                                    rejected_order=_rejected_order(tree, path[: len(new) - 1], width)
                                    if cfg.keep_rejected else None))
    res.tokens = buf[n_prompt:length].tolist()
    res.draft_forwards = getattr(drafter, "forwards", 0)
    res.seconds = time.perf_counter() - t_start
    return res


def _rejected_order(tree: TokenTree, kept: list[int], width: int) -> list[int]:
    """Proposal index of each slot of the step's rejected span (-1 = padding), as ``commit_path`` lays it out."""
    taken = set(kept)
    return [i for i in range(len(tree)) if i not in taken] + [-1] * (width - 1 - len(tree))
