"""A retrieval drafter: n-gram statistics of the target's own past generations plus prompt lookup.

The drafter looks up the longest suffix of the committed tokens in two tables and proposes the
most likely continuation, token after token, while the tables are confident:

- a *static* table built offline from the target's greedy outputs on training prompts
  (retrieval drafting as in REST, He et al. 2023, and llama.cpp's static lookup cache);
- a *context* table of the current request's own tokens (prompt lookup, Saxena 2023), updated
  with every committed token.

It runs no model, so its cost per drafted token is a few dict lookups (c ~ 0). Drafts stop when
the continuation is uncertain, so the verify window is only as wide as the confident guess
(use ``SpecConfig(fixed_window=False)`` to profit from that).

>>> store = NGramStore(max_n=2)
>>> store.add([5, 6, 7, 5, 6, 7, 5, 6, 8])
>>> store.continuation((9, 5, 6))  # after (5, 6): 7 twice, 8 once
(2, 7, 2, 3)
"""

from __future__ import annotations

import heapq
import json
import os
from dataclasses import dataclass

import torch

from beliefscope.base.files import atomic_write_bytes

from .config import TreeConfig
from .core import vocab_size
from .drafter import Drafter
from .lists import ListCounter
from .tree import TokenTree, layout, one_hot, with_one_hot_q

FORMAT = "beliefscope-ngram-store/1"


@dataclass
class StoreDraftConfig:
    """How the retrieval drafter turns table hits into drafts."""

    min_n: int = 1  # shortest suffix match that may propose a token
    min_count: int = 1  # a static continuation seen fewer times than this is not proposed
    min_share: float = 0.8  # ... nor one whose share of the suffix's continuations is below this
    use_context: bool = True  # also look up the request's own tokens (prompt lookup)
    prefer_context: bool = True  # at equal match length the request's own tokens win over the static store
    # (the store knows the output's structure; the context knows this request's names and phrasings)
    strict_first_only: bool = False  # True: thresholds gate only the first draft token, later ones need any match
    # (a verify window padded to a cheap width costs the same whether the tail is filled or not)
    list_counter: bool = True  # after a line opened with "k.", draft "k+1." to open the next one (decoding.lists;
    # needs the token ids the store records when built with a tokenizer)


class NGramStore:
    """Counts of next tokens after every n-gram (n = 1..max_n) of a set of token sequences."""

    def __init__(self, max_n: int = 4, meta: dict | None = None):
        if max_n < 1:
            raise ValueError(f"max_n={max_n} must be >= 1")
        self.max_n = max_n
        # [n] -> suffix -> {next: count}
        self.tables: list[dict[tuple, dict[int, int]]] = [{} for _ in range(max_n + 1)]
        self.meta = dict(meta or {})  # provenance: model, prompts, how built
        self.n_tokens = 0  # tokens added so far

    def add(self, tokens, start: int = 0) -> None:
        """Count the continuation of every n-gram ending before each position ``>= max(start, 1)``."""
        toks = [int(t) for t in tokens]
        self.n_tokens += len(toks) - start
        for i in range(max(start, 1), len(toks)):
            nxt = toks[i]
            for n in range(1, min(self.max_n, i) + 1):
                row = self.tables[n].setdefault(tuple(toks[i - n:i]), {})
                row[nxt] = row.get(nxt, 0) + 1

    def continuation(self, context: tuple) -> tuple[int, int, int, int] | None:
        """``(n, token, count, total)`` for the longest suffix of ``context`` seen, or None."""
        for n in range(min(self.max_n, len(context)), 0, -1):
            row = self.tables[n].get(tuple(context[-n:]))
            if row:
                tok = max(row, key=row.get)
                return n, tok, row[tok], sum(row.values())
        return None

    def save(self, path: str) -> None:
        """Write JSON atomically (temp file + rename)."""
        rows = [[n, list(k), [[t, c] for t, c in v.items()]] for n in range(1, self.max_n + 1)
                for k, v in self.tables[n].items()]
        doc = {"format": FORMAT, "max_n": self.max_n, "n_tokens": self.n_tokens, "meta": self.meta, "rows": rows}

        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        atomic_write_bytes(path, json.dumps(doc, separators=(",", ":")).encode())

    @classmethod
    def load(cls, path: str) -> NGramStore:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no n-gram store at {path!r}: build one with "
                                    f"`beliefscope datastore --model M --out {path}`")
        with open(path) as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT:
            raise ValueError(f"{path!r} is not a beliefscope n-gram store (format {doc.get('format')!r}, "
                             f"expected {FORMAT!r}); rebuild it with `beliefscope datastore`")
        store = cls(doc["max_n"], doc.get("meta"))
        store.n_tokens = doc["n_tokens"]
        for n, key, conts in doc["rows"]:
            store.tables[n][tuple(key)] = {int(t): int(c) for t, c in conts}
        return store


class StoreDrafter(Drafter):
    """Drafts from a static ``NGramStore`` of the target's past outputs and the request's own tokens.

    >>> from beliefscope.decoding.config import SpecConfig
    >>> store = NGramStore(max_n=3); store.add([1, 2, 3, 4, 1, 2, 3, 4])
    >>> d = StoreDrafter(store, StoreDraftConfig(min_count=1))
    >>> d.start(None, torch.tensor([9, 1, 2]), None, SpecConfig())
    >>> d.propose(torch.tensor([9, 1, 2]), 4, SpecConfig())[0].tolist()
    [3, 4, 1, 2]
    """

    name = "store"

    def __init__(self, store: NGramStore, config: StoreDraftConfig | None = None, name: str | None = None):
        self.store = store
        self.config = config or StoreDraftConfig()
        self.name = name or self.name
        self.context: NGramStore | None = None  # the current request's own n-grams
        self.seen = 0  # committed tokens already added to the context table

        self.counter = ListCounter.from_meta(store.meta.get("list_counter")) if self.config.list_counter else None

    def start(self, target, ids, cache, cfg):
        vocab = self.store.meta.get("vocab_size")
        if target is not None and vocab is not None and vocab != vocab_size(target):
            raise ValueError(f"this n-gram store was built for a vocabulary of {vocab} tokens but the target has "
                             f"{vocab_size(target)}: build a store for this model with `beliefscope datastore`")
        self.context = NGramStore(self.store.max_n)
        self.seen = 0
        self._grow(ids)

    def _grow(self, ids) -> None:
        toks = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        self.context.add(toks, start=self.seen)  # only the continuations not counted yet
        self.seen = len(toks)

    def next_token(self, context: tuple, strict: bool = True) -> int | None:
        """The confident continuation of ``context``, or None: the longer match wins, ties go to the
        static store when it is confident, else to the request's latest occurrence."""
        c = self.config
        hit = self.store.continuation(context)
        static = None
        if hit and hit[0] >= c.min_n and (not strict or (hit[2] >= c.min_count and hit[2] >= c.min_share * hit[3])):
            static = hit
        local = self.context.continuation(context) if c.use_context else None
        if local and local[0] < c.min_n:
            local = None
        if static and (local is None or static[0] > local[0] or (static[0] == local[0] and not c.prefer_context)):
            return static[1]
        return local[1] if local else None

    def propose(self, ids, n, cfg):
        if self.context is None:
            self.start(None, ids, None, cfg)
        self._grow(ids)
        ctx = ids[-self.store.max_n:].tolist()
        seq = ids[-256:].tolist() if self.counter is not None else None  # what the list counter reads
        out = []
        while len(out) < n:
            tok = self.counter.next_token(seq + out) if seq is not None else None
            if tok is None:
                tok = self.next_token(tuple(ctx), strict=not out or not self.config.strict_first_only)
            if tok is None:
                break
            out.append(tok)
            ctx = (ctx + [tok])[-self.store.max_n:]
        drafts = torch.tensor(out, dtype=torch.long)
        if cfg.temperature == 0:
            return drafts, None
        return drafts, one_hot(out, vocab_size_of(self.store, ids))  # a deterministic proposal is a one-hot q

    def propose_tree(self, ids, shape: TreeConfig, cfg) -> TokenTree:
        """Best-first tree over the store's and the request's next-token counts: a node's estimated
        probability is the product of the count shares along its path (``store_candidates``); the most
        probable frontier node is added next."""
        if self.context is None:
            self.start(None, ids, None, cfg)
        self._grow(ids)
        base = ids[-max(self.store.max_n, 256):].tolist()  # the n-gram tables read its tail, the list counter more
        tokens, parents, ctxs = [], [], []
        frontier: list = []  # heap of (-probability, tie, parent node, token, depth)
        tie = 0

        def expand(node: int, ctx: list, prob: float, depth: int):
            nonlocal tie
            if depth >= shape.depth:
                return
            cands = store_candidates(self, tuple(ctx))
            counted = self.counter.next_token(ctx) if self.counter is not None else None
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
        return with_one_hot_q(tree, cfg, vocab_size_of(self.store, ids)) if cfg.temperature > 0 else tree


def vocab_size_of(store: NGramStore, ids) -> int:
    v = store.meta.get("vocab_size")
    if v is None:
        raise ValueError("sampling with a store drafter needs the store's vocab_size in its meta; rebuild the store")
    return int(v)


def _shares(row: dict[int, int]) -> list[tuple[int, float]]:
    """``[(token, share of the row's counts)]``, largest share first."""
    if not row:
        return []
    total = sum(row.values())
    return sorted(((t, c / total) for t, c in row.items()), key=lambda x: -x[1])


def _row(store: NGramStore, context: tuple, min_n: int):
    """``(n, {token: count})`` of the longest suffix of ``context`` in ``store`` (n >= min_n), or (0, {})."""
    for n in range(min(store.max_n, len(context)), min_n - 1, -1):
        row = store.tables[n].get(tuple(context[-n:]))
        if row:
            return n, row
    return 0, {}


def store_candidates(drafter: StoreDrafter, context: tuple) -> list[tuple[int, float]]:
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
