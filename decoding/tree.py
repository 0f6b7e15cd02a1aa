"""Token trees: several draft continuations verified in one forward over the ``KVCache``.

A ``TokenTree`` holds draft tokens and, for every node, its parent: ``-1`` is the *root*, the
pending token (the first input of the verify forward). The verify forward feeds
``[pending, node 0, node 1, ...]`` with a 4D attention mask in which every node sees the
committed prefix, the root and its own ancestors only, and position ids by depth, so each node's
logits are those of its own root-to-node path. The longest accepted path is then committed: its
K/V entries are moved next to the prefix (``KVCache.overwrite``), everything else is rolled back,
with REJECTED provenance when the cache keeps rejected entries.

>>> t = TokenTree([7, 8, 9], [-1, 0, -1])      # 7 -> 8 is one branch, 9 a sibling of 7
>>> t.depths()
[1, 2, 1]
>>> t.children(-1), t.children(0)
([0, 2], [1])
>>> TokenTree([7, 8], [1, -1])  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
ValueError: tree node 0 has parent 1, which comes after it: a node's parent must be an earlier node (or -1 for
the root); order nodes parents-first (e.g. breadth- or depth-first)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..cache.masks import apply_windows, key_positions
from .config import TreeConfig  # noqa: F401 (re-exported)
from .core import context_limit, probs, sample, seeded_generator
from .engine import Keep


@dataclass
class TokenTree:
    """Draft tokens with their parents (``-1`` = the pending token), parents before children."""

    tokens: list[int]  # [n] draft token of every node
    parents: list[int]  # [n] parent node of every node: -1 = root (the pending token), else an earlier node
    q: torch.Tensor | None = None  # [n, vocab] draft distribution each node's token was sampled from (sampling)
    rank: list[int] = field(default_factory=list)  # [n] order in which the drafter chose the nodes (best first);
    # the first k ranks form a tree too, so truncate(k) is the tree the drafter would give with k nodes

    def __post_init__(self):
        self.tokens, self.parents = [int(t) for t in self.tokens], [int(p) for p in self.parents]
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"a tree needs one parent per token: got {len(self.tokens)} tokens and "
                             f"{len(self.parents)} parents")
        for i, p in enumerate(self.parents):
            if p >= i or p < -1:
                raise ValueError(f"tree node {i} has parent {p}, which "
                                 f"{'comes after it' if p >= i else 'is not a node'}: a node's parent must be an "
                                 "earlier node (or -1 for the root); order nodes parents-first (e.g. breadth- or "
                                 "depth-first)")
        if not self.rank:
            self.rank = list(range(len(self.tokens)))
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError(f"q has {self.q.shape[0]} rows for {len(self.tokens)} tree nodes: give one draft "
                             "distribution per node")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens, q: torch.Tensor | None = None) -> TokenTree:
        """A single branch: node i is the child of node i - 1.

        >>> TokenTree.chain([4, 5, 6]).parents
        [-1, 0, 1]
        """
        toks = [int(t) for t in tokens]
        return cls(toks, list(range(-1, len(toks) - 1)), q)

    def depths(self) -> list[int]:
        """Depth of every node (children of the root have depth 1)."""
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (-1 = root), in tree order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def path(self, node: int) -> list[int]:
        """Nodes from the root's child down to ``node`` (empty for the root)."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def truncate(self, k: int) -> TokenTree:
        """The nodes of rank < ``k`` (an ancestor-closed subtree), in the same order.

        >>> TokenTree([7, 8, 9], [-1, 0, -1], rank=[0, 2, 1]).truncate(2).tokens
        [7, 9]
        """
        keep = [i for i in range(len(self)) if self.rank[i] < k]
        new = {old: j for j, old in enumerate(keep)}
        for i in keep:
            if self.parents[i] >= 0 and self.parents[i] not in new:
                raise ValueError(f"rank of node {i} is below its parent's: ranks must be ancestor-closed")
        q = self.q[keep] if self.q is not None else None
        return TokenTree([self.tokens[i] for i in keep], [new.get(self.parents[i], -1) for i in keep], q,
                         [self.rank[i] for i in keep])


def ancestor_mask(parents: list[int], width: int) -> torch.Tensor:
    """Boolean ``[width, width]`` over the verify input ``[root, nodes..., padding]``: entry (i, j)
    is True when input j is input i or one of its ancestors. Padding rows see the root and themselves.

    >>> ancestor_mask([-1, 0, -1], 4).int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    """
    m = torch.eye(width, dtype=torch.bool)  # [width, width]
    m[:, 0] = True
    for i, p in enumerate(parents):
        if p >= 0:
            m[i + 1] |= m[p + 1]
    return m


def tree_forward_kwargs(cache, tree: TokenTree, width: int, model=None) -> dict:
    """``past_key_values``, a 4D ``attention_mask`` ``[1, 1, width, past + width]`` and
    ``position_ids`` ``[1, width]`` for a verify forward of ``[pending, tree nodes, padding]``.

    It extends ``cache.forward_kwargs``: the cache's own 2D mask (holes and ragged rows hidden)
    gives the columns of the prefix, the tree's ancestor mask the last ``width`` columns, and the
    positions are the pending token's plus each node's depth. Refuses a tree wider than the
    cache's free room or the model's context, before any forward.
    """
    if cache.batch_size != 1:
        raise ValueError(f"token trees are verified one request at a time: this cache has {cache.batch_size} rows")
    check_tree_fits(cache, tree, width, model)
    base = cache.live_mask(width).bool()  # [1, past + width]: plans where the forward writes
    past = base.shape[1] - width
    mask = base[:, None, None, :].expand(1, 1, width, past + width).clone()  # [1, 1, width, past + width]
    mask[0, 0, :, past:] = ancestor_mask(tree.parents, width)
    depth = torch.tensor([0, *tree.depths()] + [1] * (width - len(tree) - 1), dtype=torch.long)  # [width]
    pos = cache.position_ids(1)[:, :1] + depth.to(base.device)  # [1, width]
    mask = apply_windows(mask, pos, key_positions(base, pos), cache.config.windows)
    return {"past_key_values": cache, "attention_mask": mask, "position_ids": pos}


def check_tree_fits(cache, tree: TokenTree, width: int, model=None) -> None:
    """Raise a ValueError naming the limit when ``width`` inputs (pending + tree + padding) cannot be verified."""
    if width < len(tree) + 1:
        raise ValueError(f"verify width {width} cannot hold the pending token and {len(tree)} tree nodes: "
                         f"use a width >= {len(tree) + 1}")
    free = cache.capacity - cache.seq_len if cache.capacity else None
    if free is not None and width > free:
        raise ValueError(f"a tree verify of {width} tokens ({len(tree)} nodes + pending + padding) exceeds the "
                         f"cache's free room of {free} positions (capacity {cache.capacity}, {cache.seq_len} used): "
                         f"draft at most {free - 1} nodes, or build the cache with more capacity")
    if model is not None:
        limit = context_limit(model)
        deepest = cache.seq_len + 1 + max(tree.depths(), default=0)
        if cache.seq_len + width > limit or deepest > limit:
            raise ValueError(f"a tree verify of {width} tokens after {cache.seq_len} cached positions exceeds the "
                             f"model's context of {limit} tokens: draft at most {max(0, limit - cache.seq_len - 1)} "
                             "nodes")


def accept_tree_greedy(logits: torch.Tensor, tree: TokenTree) -> tuple[list[int], int]:
    """Greedy tree verification. ``logits`` ``[1 + n, vocab]``: row 0 is the root's, row i + 1 node i's.

    From the root, follow the child whose token is the target's argmax while there is one; commit
    the argmax at the first node without a matching child. Returns ``(path nodes, next token)``.

    >>> accept_tree_greedy(torch.eye(5)[[1, 3, 4, 0]], TokenTree([2, 1, 4], [-1, -1, 1]))
    ([1, 2], 0)
    """
    ref = logits.argmax(-1).tolist()  # [1 + n]
    kids: dict[int, dict[int, int]] = {}
    for i, p in enumerate(tree.parents):
        kids.setdefault(p, {}).setdefault(tree.tokens[i], i)  # first child with that token wins
    path, node = [], -1
    while (child := kids.get(node, {}).get(ref[node + 1])) is not None:
        path.append(child)
        node = child
    return path, ref[node + 1]


def accept_tree_sampled(logits: torch.Tensor, tree: TokenTree, temperature: float, seed: int,
                        position: int) -> tuple[list[int], int]:
    """Sampling tree verification: SpecInfer's multi-step speculative sampling (Miao et al. 2023, §4.2).

    At node u (depth d, absolute position ``position + d``) with children c_1..c_k in tree order,
    each drawn from its own draft distribution q_i (``tree.q``; one-hot for deterministic drafts):
    start with p = target distribution at u; for i = 1..k, with r ~ U(0, 1) seeded by
    (seed, position + d, i): accept c_i and descend if r < min(1, p(c_i) / q_i(c_i)); otherwise
    p <- norm(max(0, p - q_i)). If no child is accepted, commit a sample of p. Each stage is a
    standard speculative-sampling step with target p and an independent draft from q_i, so its
    output is distributed as p; by induction the committed token at every position is distributed
    as the target's. Returns ``(path nodes, next token)``.
    """
    if tree.q is None and len(tree):
        raise ValueError("sampling verification needs the draft distributions of the tree's nodes (tree.q)")
    p_all = probs(logits, temperature)  # [1 + n, vocab] float64
    path, node, depth = [], -1, 0
    while True:
        p = p_all[node + 1]  # [vocab]
        pos = position + depth  # absolute position of node's children
        chosen = None
        for i, child in enumerate(tree.children(node)):
            tok, q = tree.tokens[child], tree.q[child]  # q: [vocab]
            gen = seeded_generator(seed, pos, f"tree-accept/{i}")
            r = float(torch.rand((), generator=gen, dtype=torch.float64))
            if r < min(1.0, float(p[tok] / q[tok])):
                chosen = child
                break
            residual = (p - q).clamp(min=0)  # > 0 somewhere: p == q would have accepted (r < 1)
            p = residual / residual.sum()
        if chosen is None:  # no child accepted (or a leaf): commit a sample of what is left of p
            return path, sample(p, seeded_generator(seed, pos, "target"))
        path.append(chosen)
        node, depth = chosen, depth + 1


def commit_path(cache, position: int, tree: TokenTree, path: list[int], keep: int, keep_rejected: bool) -> Keep:
    """After a tree verify at ``position`` (the pending token's), lay the cache out so that it can hold the
    prefix, the pending token and the first ``keep - position - 1`` nodes of ``path`` contiguously; returns the
    `engine.Keep` that drops the rest (`engine.settle`: accepted nodes that eos or the budget cut are dropped,
    never REJECTED).

    Accepted entries computed at tree slots are moved next to the prefix with ``KVCache.overwrite``
    (their keys already carry the right positions: a node's position is the pending token's plus
    its depth); they are labelled ACCEPTED. With ``keep_rejected`` every other node is moved after them
    and kept by the rollback with REJECTED provenance, so ``cache.recorder.rejected`` holds the whole discarded
    tree, and nothing else (the forward's padding is dropped, never kept).
    """
    order = list(path)  # every accepted node, the ones eos or the budget cut included
    if keep_rejected:
        taken = set(path)
        order += [i for i in range(len(tree)) if i not in taken]
    if order != list(range(len(order))):  # slots position+1+i already hold node i: move only when needed
        src = torch.tensor(order) + position + 1  # [m] slots of the nodes to move
        dst = list(range(position + 1, position + 1 + len(order)))
        for layer in range(cache.config.n_layers):
            k, v = cache.keys(layer, src), cache.values(layer, src)  # [kv_heads, m, d_head] copies
            cache.overwrite(layer, dst, k, v)
    nodes_end = position + 1 + len(tree)  # past the last node; the padding of the forward lies beyond
    return Keep(keep, (position, len(path), nodes_end), keep_rejected)


def layout(tokens: list[int], parents: list[int], q: list | None = None) -> TokenTree:
    """A tree from nodes given in rank order (parents first), re-laid out depth-first, best child
    first, with ``rank`` = the given order: a drafter's main chain then takes the first slots, so a
    fully accepted main chain needs no K/V move.

    >>> t = layout([7, 9, 8], [-1, -1, 0])
    >>> t.tokens, t.parents, t.rank
    ([7, 8, 9], [-1, 0, -1], [0, 2, 1])
    """
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    order: list[int] = []
    stack = list(reversed(kids.get(-1, [])))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(kids.get(i, [])))
    new = {old: j for j, old in enumerate(order)}
    qt = torch.stack([q[i] for i in order]) if q else None  # [n, vocab]
    return TokenTree([tokens[i] for i in order], [new[parents[i]] if parents[i] >= 0 else -1 for i in order], qt,
                     order)


def one_hot(tokens: list[int], vocab: int) -> torch.Tensor:
    """``[n, vocab]`` float64 one-hot rows: the draft distribution of a deterministic proposal.

    >>> one_hot([2, 0], 3).tolist()
    [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    """
    q = torch.zeros(len(tokens), vocab, dtype=torch.float64)
    q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
    return q


def with_one_hot_q(tree: TokenTree, cfg, vocab: int) -> TokenTree:
    """When sampling, give a deterministic drafter's tree its one-hot draft distributions (``tree.q``)."""
    if cfg.temperature > 0 and len(tree):
        tree.q = one_hot(tree.tokens, vocab)
    return tree
