"""Speculative decoding with token trees: draft a tree, verify it in one forward, commit the longest
accepted path (``SpecConfig(tree=TreeConfig(...))``; ``speculative_generate`` dispatches here, and
both run the loop of ``decoding.loop``).

>>> from beliefscope.models.testing import tiny_gpt2
>>> from beliefscope.decoding.config import SpecConfig, TreeConfig
>>> from beliefscope.decoding.loop import generate
>>> from beliefscope.decoding.ngram import NGramDrafter
>>> model = tiny_gpt2()
>>> cfg = SpecConfig(max_new_tokens=6, stop_at_eos=False, tree=TreeConfig(nodes=4, depth=3))
>>> out = tree_generate(model, NGramDrafter(2), [4, 5, 4, 6, 4, 5, 4], cfg)
>>> out.tokens == generate(model, [4, 5, 4, 6, 4, 5, 4], cfg, window=cfg.window_size).tokens
True
"""

from __future__ import annotations

import dataclasses

import torch

from ..cache import Provenance
from .config import SpecConfig
from .core import Generation, hf_logits
from .engine import Keep
from .loop import Proposal, speculative_loop
from .tree import (
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


class TreeStep:
    """A tree of drafts within ``cfg.tree`` (``drafter.propose_tree``), verified under its ancestor mask;
    the longest accepted path is moved next to the prefix (``decoding.tree.commit_path``)."""

    provenance = Provenance.VERIFIED  # what a verify forward writes

    def __init__(self, cfg: SpecConfig):
        if cfg.capture:
            raise ValueError("activation capture (SpecConfig.capture) is not supported with token trees yet: "
                             "drop capture, or set tree=None for chains")
        self.cfg = cfg
        self.room = cfg.max_verify_width  # the widest verify forward

    def width(self, n: int) -> int:
        return self.cfg.verify_width(n)

    def propose(self, drafter, ids: torch.Tensor, left: int) -> Proposal:
        tree = TokenTree([], [])
        if left > 0:
            shape = self.cfg.tree
            tree = drafter.propose_tree(ids, dataclasses.replace(shape, depth=min(shape.depth, left)), self.cfg)
        return Proposal(list(tree.tokens), max(tree.depths(), default=0), tree=tree)

    def verify(self, model, cache, pending: torch.Tensor, prop: Proposal, width: int) -> torch.Tensor:
        return tree_forward(model, cache, int(pending[0]), prop.tree, width)  # [1 + n, vocab]

    def accept(self, logits: torch.Tensor, prop: Proposal, position: int) -> tuple[list[int], int]:
        if self.cfg.temperature == 0:
            return accept_tree_greedy(logits, prop.tree)
        return accept_tree_sampled(logits, prop.tree, self.cfg.temperature, self.cfg.seed, position)

    def keep(self, cache, position: int, prop: Proposal, path: list[int], keep: int) -> Keep:
        return commit_path(cache, position, prop.tree, path, keep, self.cfg.keep_rejected)

    def after(self, res: Generation, prop: Proposal, path: list[int], n_kept: int, width: int) -> dict:
        tree = prop.tree
        res.tree_nodes.append(len(tree))
        res.path_ranks.append([tree.rank[i] for i in path])
        on_path = set(path)  # accepted, even where eos or the budget cut the output before the path's end
        return {"rejected": [tree.tokens[i] for i in range(len(tree)) if i not in on_path],
                "tree_parents": list(tree.parents), "path": list(path),
                "rejected_order": _rejected_order(tree, path, width) if self.cfg.keep_rejected else None}


@torch.no_grad()
def tree_generate(model, drafter, prompt_ids, cfg: SpecConfig, *, tokenizer=None) -> Generation:
    """Draft a tree per step (``drafter.propose_tree``), verify it in one forward, commit the longest
    accepted path. Greedy output equals the fixed-shape reference ``generate(window=cfg.window_size)``
    with ``fixed_window=True`` (each node's logits come from its own path, in a forward of the same
    width); sampling uses SpecInfer's multi-candidate rule (``decoding.tree.accept_tree_sampled``).
    """
    return speculative_loop(model, drafter, prompt_ids, cfg, TreeStep(cfg), tokenizer=tokenizer)


def _rejected_order(tree: TokenTree, path: list[int], width: int) -> list[int]:
    """Proposal index of each slot of the step's rejected span, as ``commit_path`` lays it out (the
    forward's padding is not in the span)."""
    taken = set(path)
    return [i for i in range(len(tree)) if i not in taken]
