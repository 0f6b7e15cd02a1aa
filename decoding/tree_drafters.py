"""Tree proposals of the drafters: top-k continuations instead of one chain.

- ``lookup_tree``: prompt lookup over *every* earlier occurrence of the longest matching suffix;
  the continuations are merged into a trie, nodes ranked by how many occurrences pass through them
  (then recency), so a single occurrence gives exactly the chain drafter's draft.
- ``store_propose_tree``: best-first expansion over next-token counts (the ``store:`` drafter's static
  table and the request's own n-grams): a node's estimated probability is the product of the
  count shares along its path; the most probable frontier node is added next.
- ``model_propose_tree``: a draft model's (or early exit's) greedy chain with, at every depth, the
  model's next best tokens as extra leaves (when sampling: further independent samples of the same
  draft distribution, as SpecInfer's multi-candidate rule requires). No extra draft forwards.

In every tree the nodes are laid out depth-first, best child first, so the drafter's main chain
occupies the first slots (a fully accepted main chain needs no K/V move), and ``rank`` is the
order in which nodes were chosen: the first k ranks are the tree this drafter would build with k nodes.

>>> import torch
>>> from beliefscope.decoding.config import SpecConfig, TreeConfig
>>> t = lookup_tree(torch.tensor([1, 2, 3, 9, 1, 2, 4, 5, 1, 2]), 3, TreeConfig(nodes=4, depth=2))
>>> t.tokens, t.parents
([4, 5, 3, 9], [-1, 0, -1, 2])
"""

from __future__ import annotations

import heapq

import torch
from beliefscope.decoding.config import SpecConfig, TreeConfig
from beliefscope.decoding.core import probs, sample, seeded_generator
from beliefscope.decoding.tree import TokenTree


def layout(tokens: list[int], parents: list[int], q: list | None = None) -> TokenTree:
    """A tree from nodes given in rank order (parents first): re-laid out depth-first, best child
    first, with ``rank`` = the given order."""
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
    """``[n, vocab]`` float64 one-hot rows: the draft distribution of a deterministic proposal."""
    q = torch.zeros(len(tokens), vocab, dtype=torch.float64)
    q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
    return q


def _with_q(tree: TokenTree, cfg: SpecConfig, vocab: int) -> TokenTree:
    if cfg.temperature > 0 and len(tree):
        tree.q = one_hot(tree.tokens, vocab)
    return tree


def lookup_tree(ids: torch.Tensor, max_n: int, shape: TreeConfig) -> TokenTree:
    """Prompt lookup as a tree: continuations of every earlier occurrence of the longest suffix (<= max_n) seen."""
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


def ngram_propose_tree(drafter, ids: torch.Tensor, shape: TreeConfig, cfg: SpecConfig) -> TokenTree:
    return _with_q(lookup_tree(ids, drafter.n, shape), cfg, drafter.vocab)


def _shares(table_hit) -> list[tuple[int, float]]:
    if not table_hit:
        return []
    total = sum(table_hit.values())
    return sorted(((t, c / total) for t, c in table_hit.items()), key=lambda x: -x[1])


def _row(store, context: tuple, min_n: int):
    """``(n, {token: count})`` of the longest suffix of ``context`` in ``store`` (n >= min_n), or (0, {})."""
    for n in range(min(store.max_n, len(context)), min_n - 1, -1):
        row = store.tables[n].get(tuple(context[-n:]))
        if row:
            return n, row
    return 0, {}


def store_candidates(drafter, context: tuple) -> list[tuple[int, float]]:
    """Next-token candidates with estimated probabilities: the longer match of the static store and the
    request's own n-grams leads (ties go to the request when ``prefer_context``), the other adds its
    tokens at half weight; shares of the counts of the matched row."""
    c = drafter.config
    sn, srow = _row(drafter.store, context, c.min_n)
    ln, lrow = _row(drafter.context, context, c.min_n) if c.use_context else (0, {})
    local_leads = ln > sn or (ln == sn and c.prefer_context)
    lead, other = (lrow, srow) if local_leads else (srow, lrow)
    out: dict[int, float] = {}
    for t, s in _shares(lead):
        out[t] = s
    for t, s in _shares(other):
        out[t] = max(out.get(t, 0.0), 0.5 * s)
    return sorted(out.items(), key=lambda x: -x[1])


def store_propose_tree(drafter, ids: torch.Tensor, shape: TreeConfig, cfg: SpecConfig) -> TokenTree:
    """Best-first tree over the store's and the request's next-token counts."""
    from beliefscope.decoding.datastore import vocab_size_of

    if drafter.context is None:
        drafter.start(None, ids, None, cfg)
    drafter._grow(ids)
    base = ids[-max(drafter.store.max_n, 256):].tolist()  # the n-gram tables read its tail, the list counter more
    tokens, parents, ctxs = [], [], []
    frontier: list = []  # heap of (-probability, tie, parent node, token, depth)
    tie = 0

    def expand(node: int, ctx: list, prob: float, depth: int):
        nonlocal tie
        if depth >= shape.depth:
            return
        cands = store_candidates(drafter, tuple(ctx))
        counted = drafter.counter.next_token(ctx) if drafter.counter is not None else None
        if counted is not None:  # the next list item's number leads; the tables' guesses follow at half weight
            cands = [(counted, 1.0)] + [(t, 0.5 * s) for t, s in cands if t != counted]
        for tok, share in cands[: shape.branch]:
            if prob * share >= shape.min_share:
                heapq.heappush(frontier, (-prob * share, tie, node, tok, depth + 1))
                tie += 1

    expand(-1, base, 1.0, 0)
    while frontier and len(tokens) < shape.nodes:
        negp, _, parent, tok, depth = heapq.heappop(frontier)
        ctx = (ctxs[parent] if parent >= 0 else base) + [tok]
        tokens.append(tok)
        parents.append(parent)
        ctxs.append(ctx)
        expand(len(tokens) - 1, ctx, -negp, depth)
    tree = layout(tokens, parents)
    return _with_q(tree, cfg, vocab_size_of(drafter.store, ids)) if cfg.temperature > 0 else tree


def model_propose_tree(drafter, ids: torch.Tensor, shape: TreeConfig, cfg: SpecConfig, step,
                       first: torch.Tensor) -> TokenTree:
    """A draft model's chain plus its next-best tokens as leaves at every depth.

    ``step(x) -> logits [vocab]`` runs the draft model on new tokens ``x`` (its cache advancing);
    ``first`` ``[m]`` are the committed tokens its cache lacks (the pending token at least).
    Greedy: the chain follows the argmax, the leaves are the next ``branch - 1`` tokens by logit.
    Sampling: the chain token and the leaves are independent samples of the same draft distribution
    (SpecInfer's rule needs i.i.d. candidates), so leaves may repeat a token.
    """
    x = first
    tokens, parents, prob, qs = [], [], [], []
    depth = min(shape.depth, shape.nodes)
    parent, p_parent = -1, 1.0
    for d in range(depth):
        logits = step(x).float()  # [vocab]
        position = ids.numel() + d  # absolute position of the drafts at this depth
        if cfg.temperature == 0:
            q = torch.softmax(logits, -1)
            top = torch.topk(q, shape.branch)
            cands = list(zip(top.indices.tolist(), top.values.tolist()))
            q_rows = [None] * len(cands)
        else:
            q = probs(logits, cfg.temperature)
            picks = [sample(q, seeded_generator(cfg.seed, position, "draft"))]
            picks += [sample(q, seeded_generator(cfg.seed, position, f"draft/{i}")) for i in range(1, shape.branch)]
            cands = [(t, float(q[t])) for t in picks]
            q_rows = [q] * len(cands)
        chain_node = len(tokens)
        for (tok, pt), qr in zip(cands, q_rows):
            tokens.append(tok)
            parents.append(parent)
            prob.append(p_parent * pt)
            qs.append(qr)
        parent, p_parent = chain_node, prob[chain_node]
        x = torch.tensor([tokens[chain_node]])
    if cfg.temperature == 0:  # best first; a parent precedes its children on ties
        order = sorted(range(len(tokens)), key=lambda i: (-prob[i], i))
        order = [i for i in order if prob[i] >= shape.min_share or i == 0]
    else:  # depth by depth, whatever was sampled: a choice that looked at the samples would bias them
        order = list(range(len(tokens)))
    chosen: dict[int, int] = {}
    out_t, out_p, out_q = [], [], []
    for i in order:
        if len(out_t) >= shape.nodes:
            break
        p = parents[i]
        if p >= 0 and p not in chosen:
            continue
        chosen[i] = len(out_t)
        out_t.append(tokens[i])
        out_p.append(chosen[p] if p >= 0 else -1)
        out_q.append(qs[i])
    return layout(out_t, out_p, out_q if cfg.temperature > 0 else None)
