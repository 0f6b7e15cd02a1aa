"""Drafters: cheap paths that propose tokens for the target to verify.

One small interface (``start`` / ``propose`` / ``sync``) and four implementations:

- ``ModelDrafter``: a separate draft model sharing the tokenizer (its own KVCache);
- ``EarlyExitDrafter``: the target's first k layers + final norm + unembedding (LayerSkip style),
  writing into the *target's* cache for those layers, so it needs no cache or prefill of its own;
- ``NGramDrafter``: prompt lookup, no model;
- ``LowPrecisionDrafter``: the target itself in bfloat16 (LLM-42's fast path).

>>> d = NGramDrafter(n=2)
>>> d.propose(torch.tensor([5, 6, 7, 8, 5, 6]), 3, SpecConfig())[0].tolist()
[7, 8, 5]
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch
from beliefscope.cache import Provenance
from beliefscope.decoding.config import SpecConfig
from beliefscope.decoding.core import (
    forward,
    hf_model,
    new_cache,
    probs,
    sample,
    seeded_generator,
    vocab_size,
)
from torch import nn


class Drafter:
    """Interface. ``ids`` are all committed tokens (prompt included); the last one is pending."""

    name = "drafter"
    forwards = 0  # model forwards run so far (for the cost ratio c)

    def start(self, target, ids: torch.Tensor, cache, cfg: SpecConfig) -> None:
        """Called once after the target's prefill (``cache`` holds ``ids[:-1]``)."""

    def propose(self, ids: torch.Tensor, n: int, cfg: SpecConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to ``n`` draft tokens ``[k]`` and, when sampling, their draft distributions ``[k, vocab]``."""
        raise NotImplementedError

    def sync(self, n_committed: int) -> None:
        """Called after each verify: ``n_committed`` tokens are now committed (prompt included)."""

    def propose_tree(self, ids: torch.Tensor, shape, cfg: SpecConfig):
        """A ``decoding.tree.TokenTree`` of drafts within ``shape`` (a ``TreeConfig``). Drafters that
        cannot branch give their chain, ``min(shape.depth, shape.nodes)`` long."""
        from beliefscope.decoding.tree import TokenTree

        drafts, q = self.propose(ids, min(shape.depth, shape.nodes), cfg)
        return TokenTree.chain(drafts.tolist(), q)


def _pick_draft(logits: torch.Tensor, cfg: SpecConfig, position: int):
    """Greedy argmax (q=None) or a seeded sample with its distribution q ``[vocab]``."""
    if cfg.temperature == 0:
        return int(logits.argmax()), None
    q = probs(logits, cfg.temperature)
    return sample(q, seeded_generator(cfg.seed, position, "draft")), q


class ModelDrafter(Drafter):
    """A separate draft model with its own cache, kept equal to the committed tokens minus one.

    >>> from beliefscope.cache.testing import tiny_gpt2
    >>> ModelDrafter(tiny_gpt2(seed=1)).name
    'draft'
    """

    name = "draft"

    def __init__(self, draft_model, name: str | None = None):
        self.model = draft_model
        self.name = name or self.name
        self.cache = None
        self._fed: list[int] | None = None  # tokens in the draft cache (tree drafting only; None = not tracked)

    def start(self, target, ids, cache, cfg):
        tv, dv = vocab_size(target), vocab_size(self.model)
        if tv != dv:
            raise ValueError(f"the draft model's vocabulary has {dv} tokens but the target's has {tv}: a draft "
                             "model must share the target's tokenizer (use e.g. checkpoints/coinflip-draft)")
        self.forwards = 0
        self.cache = new_cache(self.model, ids.numel() + cfg.max_new_tokens + cfg.window_size + 1)
        self._fed = ids[:-1].tolist()
        if ids.numel() > 1:
            forward(self.model, ids[:-1], self.cache)
            self.forwards += 1

    def propose(self, ids, n, cfg):
        seen = self.cache.seq_len
        x = ids[seen:]  # [1 or 2]: the pending token, plus our own last draft after a full accept
        out, qs = [], []
        for i in range(n):
            logits = forward(self.model, x, self.cache)[-1]
            self.forwards += 1
            tok, q = _pick_draft(logits, cfg, ids.numel() + i)
            out.append(tok)
            qs.append(q)
            x = torch.tensor([tok])
        return torch.tensor(out, dtype=torch.long), (torch.stack(qs) if cfg.temperature > 0 else None)

    def propose_tree(self, ids, shape, cfg):
        """Chain + next-best leaves (``decoding.tree_drafters.model_propose_tree``). The accepted path may leave
        the chain, so the draft cache is first cut back to its longest prefix equal to ``ids``."""
        from beliefscope.decoding.tree_drafters import model_propose_tree

        fed = self._fed if self._fed is not None else ids[:self.cache.seq_len].tolist()
        ref = ids[:len(fed)].tolist()
        common = next((i for i, (a, b) in enumerate(zip(fed, ref)) if a != b), min(len(fed), len(ref)))
        common = min(common, ids.numel() - 1, self.cache.seq_len)
        self.cache.rollback(common)
        self._fed = ids[:common].tolist()

        def step(x):
            self.forwards += 1
            self._fed += x.tolist()
            return forward(self.model, x, self.cache)[-1]
        return model_propose_tree(self, ids, shape, cfg, step, ids[common:])

    def sync(self, n_committed):
        # The draft cache holds committed tokens and unverified drafts; keep only what was committed
        # (all but the pending token). After a full accept it holds one token less: caught up next time.
        self.cache.rollback(min(self.cache.seq_len, n_committed - 1))
        if self._fed is not None:
            self._fed = self._fed[:self.cache.seq_len]


class LowPrecisionDrafter(ModelDrafter):
    """The target itself in bfloat16 (a copy): LLM-42's low-precision fast path.

    >>> from beliefscope.cache.testing import tiny_gpt2
    >>> LowPrecisionDrafter(tiny_gpt2()).name
    'bf16'
    """

    name = "bf16"

    def __init__(self, target, dtype=torch.bfloat16):
        super().__init__(copy.deepcopy(hf_model(target)).to(dtype).eval(), name=self.name)
        self._check_runs(dtype)

    def _check_runs(self, dtype) -> None:
        """Refuse, with the architecture's name, a model that does not run end to end in ``dtype``
        (some bridged architectures keep float32 paths: TransformerLens's Falcon, OLMo2's norms)."""
        arch = type(self.model).__name__
        cache = new_cache(self.model, 2)
        try:
            with torch.no_grad():
                self.model(torch.zeros(1, 2, dtype=torch.long, device=next(self.model.parameters()).device),
                           past_key_values=cache, use_cache=True)
        except (RuntimeError, TypeError) as e:
            if "dtype" not in str(e) and "same dtype" not in str(e):
                raise
            raise ValueError(f"--drafter bf16: {arch} does not run in {dtype} through the bridge "
                             f"({str(e).splitlines()[0][:160]}); use ngram:N, early-exit:K or draft:PATH") from None


def _layer_list(hf) -> tuple[nn.Module, str]:
    """(parent, attribute) of the ModuleList of decoder blocks (GPT-2 ``transformer.h``, Llama ``model.layers``)."""
    n = hf.config.num_hidden_layers
    for parent in hf.modules():
        for attr, child in parent.named_children():
            if isinstance(child, nn.ModuleList) and len(child) == n and attr in ("h", "layers", "blocks"):
                return parent, attr
    raise ValueError(f"cannot find the decoder blocks of {type(hf).__name__} for early exit")


@contextmanager
def first_layers(hf, k: int):
    """Run the HF model with only its first ``k`` blocks (then its final norm and unembedding)."""
    parent, attr = _layer_list(hf)
    full = getattr(parent, attr)
    parent._modules[attr] = nn.ModuleList(list(full)[:k])
    try:
        yield
    finally:
        parent._modules[attr] = full


class EarlyExitDrafter(Drafter):
    """The target's first ``k`` layers as the draft (LayerSkip style, no extra weights).

    With ``share_cache=True`` the draft forwards write layers 0..k-1 of the *target's* cache past
    the committed length and roll them back afterwards: the draft reuses the target's K/V of the
    committed prefix and needs no prefill. With ``share_cache=False`` it keeps its own cache.

    >>> from beliefscope.cache.testing import tiny_gpt2
    >>> EarlyExitDrafter(tiny_gpt2(n_layer=2), 1).name
    'early-exit:1'
    """

    def __init__(self, target, k: int, share_cache: bool = True):
        n = hf_model(target).config.num_hidden_layers
        if not isinstance(k, int) or not 1 <= k < n:
            raise ValueError(f"early-exit layer {k!r} is out of range: this target has {n} layers, use 1..{n - 1}")
        self.target, self.k, self.share_cache = target, k, share_cache
        self.name = f"early-exit:{k}"
        self.cache = None

    def start(self, target, ids, cache, cfg):
        self.forwards = 0
        if self.share_cache:
            self.cache = cache
        else:
            self.cache = new_cache(target, ids.numel() + cfg.max_new_tokens + cfg.window_size + 1)
            if ids.numel() > 1:
                self._forward(ids[:-1])

    def _forward(self, x):
        self.forwards += 1
        self.cache.next_provenance = Provenance.DRAFT
        with first_layers(hf_model(self.target), self.k):
            return forward(self.target, x, self.cache)[-1]

    def propose(self, ids, n, cfg):
        start = self.cache.seq_len
        x = ids[start:]
        out, qs = [], []
        for i in range(n):
            logits = self._forward(x)
            tok, q = _pick_draft(logits, cfg, ids.numel() + i)
            out.append(tok)
            qs.append(q)
            x = torch.tensor([tok])
        if self.share_cache:  # give the target its cache back as it was (layers >= k were never written)
            keep = self.cache.config.keep_rejected
            self.cache.config.keep_rejected = False
            self.cache.rollback(start)
            self.cache.config.keep_rejected = keep
        return torch.tensor(out, dtype=torch.long), (torch.stack(qs) if cfg.temperature > 0 else None)

    def propose_tree(self, ids, shape, cfg):
        """Chain + next-best leaves of the first k layers (``decoding.tree_drafters.model_propose_tree``)."""
        from beliefscope.decoding.tree_drafters import model_propose_tree

        if not self.share_cache:
            return super().propose_tree(ids, shape, cfg)
        start = self.cache.seq_len
        tree = model_propose_tree(self, ids, shape, cfg, self._forward, ids[start:])
        keep = self.cache.config.keep_rejected
        self.cache.config.keep_rejected = False  # the target's cache, as it was (layers >= k never written)
        self.cache.rollback(start)
        self.cache.config.keep_rejected = keep
        return tree

    def sync(self, n_committed):
        if not self.share_cache:
            self.cache.rollback(min(self.cache.seq_len, n_committed - 1))


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
        q = torch.zeros(found.numel(), self.vocab, dtype=torch.float64)
        q[torch.arange(found.numel()), found] = 1.0  # a deterministic proposal is a one-hot q
        return found, q

    def propose_tree(self, ids, shape, cfg):
        """Every earlier occurrence of the suffix, merged into a trie (``decoding.tree_drafters.lookup_tree``)."""
        from beliefscope.decoding.tree_drafters import ngram_propose_tree

        return ngram_propose_tree(self, ids, shape, cfg)


def make_drafter(spec: str, target, load=None) -> Drafter | None:
    """Parse ``none``, ``draft:PATH``, ``early-exit:K``, ``ngram:N``, ``store:PATH`` or ``bf16`` into a drafter.

    >>> make_drafter("ngram:3", None).name
    'ngram:3'
    """
    kind, _, arg = spec.partition(":")
    if kind == "none":
        return None
    if kind == "ngram":
        return NGramDrafter(int(arg or 3))
    if kind == "bf16":
        return LowPrecisionDrafter(target)
    if kind == "store":
        from beliefscope.decoding.datastore import NGramStore, StoreDrafter
        from beliefscope.models.load import resolve_store

        path = resolve_store(arg)
        return StoreDrafter(NGramStore.load(path), name=spec)
    if kind in ("early-exit", "early_exit"):
        if not arg.lstrip("-").isdigit():
            raise ValueError(f"--drafter {spec!r}: give the exit layer, e.g. early-exit:2")
        return EarlyExitDrafter(target, int(arg))
    if kind == "draft":
        if load is None:
            from beliefscope.models.load import load_model
            load = load_model
        return ModelDrafter(load(arg or "draft")[0])
    raise ValueError(f"unknown drafter {spec!r}: use none, draft:PATH, early-exit:K, ngram:N, store:PATH or bf16")
