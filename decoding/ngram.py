"""Prompt lookup (Saxena 2023): propose what followed the latest earlier occurrence of the last
``n`` tokens; as a tree, what followed *every* earlier occurrence, merged into a trie.

>>> NGramDrafter(n=2).propose(torch.tensor([5, 6, 7, 8, 5, 6]), 3, SpecConfig())[0].tolist()
[7, 8, 5]
>>> t = lookup_tree(torch.tensor([1, 2, 3, 9, 1, 2, 4, 5, 1, 2]), 3, TreeConfig(nodes=4, depth=2))
>>> t.tokens, t.parents
([4, 5, 3, 9], [-1, 0, -1, 2])
"""

from __future__ import annotations

import torch

from .config import SpecConfig, TreeConfig  # noqa: F401 (SpecConfig: the examples use it)
from .core import vocab_size
from .drafter import Drafter
from .tree import TokenTree, layout, one_hot, with_one_hot_q


class NGramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the last ``n`` (down to 1) tokens and
    propose what followed it. No model, no cache.

    >>> NGramDrafter(n=3).propose(torch.tensor([1, 2, 3, 4]), 2, SpecConfig())[0].tolist()
    []
    """

    def __init__(self, n: int = 3):
        if n < 1:
            raise ValueError(f"n-gram size {n} must be >= 1")
        self.n = n
        self.name = f"ngram:{n}"
        self.vocab = 0

    def start(self, target, ids, cache, cfg):
        self.vocab = vocab_size(target)

    def propose(self, ids, n, cfg):
        found = torch.empty(0, dtype=torch.long)
        for size in range(min(self.n, ids.numel() - 1), 0, -1):
            windows = ids[:-1].unfold(0, size, 1)  # [L - size, size]: every earlier n-gram
            hits = (windows == ids[-size:]).all(-1).nonzero().flatten()
            if hits.numel():
                s = int(hits[-1]) + size
                found = ids[s : s + n]
                break
        if cfg.temperature == 0:
            return found, None
        return found, one_hot(found.tolist(), self.vocab)  # a deterministic proposal is a one-hot q

    def propose_tree(self, ids, shape, cfg):
        """Every earlier occurrence of the suffix, merged into a trie (``lookup_tree``)."""
        return with_one_hot_q(lookup_tree(ids, self.n, shape), cfg, self.vocab)


def lookup_tree(ids: torch.Tensor, max_n: int, shape: TreeConfig) -> TokenTree:
    """Prompt lookup as a tree: continuations of every earlier occurrence of the longest suffix
    (<= max_n) seen, ranked by how many occurrences pass through a node (then recency), so a single
    occurrence gives exactly the chain drafter's draft."""
    toks = ids.tolist()
    L = len(toks)
    for size in range(min(max_n, L - 1), 0, -1):
        windows = ids[:-1].unfold(0, size, 1)  # [L - size, size]: every earlier n-gram
        hits = (windows == ids[-size:]).all(-1).nonzero().flatten().tolist()
        if hits:
            break
    else:
        return TokenTree([], [])
    trie: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    tokens, parents, count, latest, depth = [], [], [], [], []
    for h in reversed(hits):  # latest occurrence first
        node = -1
        for d, tok in enumerate(toks[h + size: h + size + shape.depth]):
            key = (node, tok)
            if key not in trie:
                trie[key] = len(tokens)
                tokens.append(tok)
                parents.append(node)
                count.append(0)
                latest.append(h)
                depth.append(d + 1)
            node = trie[key]
            count[node] += 1
    order = sorted(range(len(tokens)), key=lambda i: (-count[i], -latest[i], depth[i]))
    return _select(order, tokens, parents, shape)


def _select(order: list[int], tokens: list[int], parents: list[int], shape: TreeConfig) -> TokenTree:
    """Take nodes in ``order`` (ancestor-closed) up to ``shape.nodes``, at most ``shape.branch`` children each."""
    chosen: dict[int, int] = {}
    n_kids: dict[int, int] = {}
    out_t, out_p = [], []
    for i in order:
        p = parents[i]
        if len(out_t) >= shape.nodes or (p >= 0 and p not in chosen) or n_kids.get(p, 0) >= shape.branch:
            continue
        n_kids[p] = n_kids.get(p, 0) + 1
        chosen[i] = len(out_t)
        out_t.append(tokens[i])
        out_p.append(chosen[p] if p >= 0 else -1)
    return layout(out_t, out_p)
