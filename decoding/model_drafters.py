"""Drafters that run a model: a separate draft model, the target in bfloat16, the target's first
layers. As a tree, each gives its greedy chain with the model's next best tokens as extra leaves
at every depth (``model_propose_tree``), at no extra draft forward.

>>> from beliefscope.models.testing import tiny_gpt2
>>> model = tiny_gpt2(n_layer=2)
>>> d = EarlyExitDrafter(model, 1)
>>> cache = new_cache(model, 16)
>>> _ = forward(model, torch.tensor([3, 4]), cache)
>>> d.start(model, torch.tensor([3, 4, 5]), cache, SpecConfig())
>>> d.propose(torch.tensor([3, 4, 5]), 2, SpecConfig())[0].numel(), cache.seq_len
(2, 2)
"""

from __future__ import annotations

import contextlib
import copy
from contextlib import contextmanager

import torch
from torch import nn

from ..cache import Provenance
from ..cache.keep import Keep
from ..models.forward import forward_module
from .config import SpecConfig, TreeConfig
from .core import (
    forward,
    hf_model,
    new_cache,
    probs,
    sample,
    seeded_generator,
    vocab_size,
)
from .drafter import Drafter
from .tree import TokenTree, layout


def _pick_draft(logits: torch.Tensor, cfg: SpecConfig, position: int):
    """Greedy argmax (q=None) or a seeded sample with its distribution q ``[vocab]``."""
    if cfg.temperature == 0:
        return int(logits.argmax()), None
    q = probs(logits, cfg.temperature)
    return sample(q, seeded_generator(cfg.seed, position, "draft")), q


def _draft_chain(step, x: torch.Tensor, ids: torch.Tensor, n: int, cfg: SpecConfig):
    """Up to ``n`` drafts ``[k]`` (and ``[k, vocab]`` q when sampling) from ``step(x) -> logits [vocab]``,
    fed first the committed tokens its cache lacks, then each draft."""
    out, qs = [], []
    for i in range(n):
        tok, q = _pick_draft(step(x), cfg, ids.numel() + i)
        out.append(tok)
        qs.append(q)
        x = torch.tensor([tok])
    return torch.tensor(out, dtype=torch.long), (torch.stack(qs) if cfg.temperature > 0 else None)


class ModelDrafter(Drafter):
    """A separate draft model with its own cache, kept equal to the committed tokens minus one.

    >>> from beliefscope.models.testing import tiny_gpt2
    >>> ModelDrafter(tiny_gpt2(seed=1)).name
    'draft'
    """

    name = "draft"

    def __init__(self, draft_model, name: str | None = None):
        self.model = draft_model
        self.name = name or self.name
        self.cache = None
        self._fed: list[int] = []  # the tokens in the draft cache, in order

    def start(self, target, ids, cache, cfg):
        tv, dv = vocab_size(target), vocab_size(self.model)
        if tv != dv:
            raise ValueError(f"the draft model's vocabulary has {dv} tokens but the target's has {tv}: a draft "
                             "model must share the target's tokenizer (use e.g. checkpoints/coinflip-draft)")
        self.forwards = 0
        self.cache = new_cache(self.model, ids.numel() + cfg.max_new_tokens + cfg.window_size + 1)
        self._fed = ids[:-1].tolist()
        if ids.numel() > 1:
            forward(self.model, ids[:-1], self.cache, last_only=True)  # K/V only: its logits are not read
            self.forwards += 1

    def _step(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        self._fed += x.tolist()  # the draft cache's tokens, kept beside it
        return forward(self.model, x, self.cache, last_only=True)[-1]

    def propose(self, ids, n, cfg):
        # ids[seen:] is the pending token, plus our own last draft after a full accept
        return _draft_chain(self._step, ids[self.cache.seq_len:], ids, n, cfg)

    def propose_tree(self, ids, shape, cfg):
        """Chain + next-best leaves (``model_propose_tree``). The draft cache holds a prefix of ``ids`` (`keep`
        cut it back where the accepted path left the drafted chain)."""
        held = self.cache.seq_len
        if self._fed != ids[:held].tolist():
            raise RuntimeError("the draft model's cache holds tokens the committed ones do not: a drafter's cache is "
                               "kept in step by the decoding engine (decoding.engine.run settles its keep())")
        return model_propose_tree(self, ids, shape, cfg, self._step, ids[held:])

    def keep(self, committed):
        """The draft cache keeps what was committed of it, all but the pending token (after a full accept it
        holds one token less: caught up next time). After tree drafting the accepted path may leave the chain
        the cache was fed, so it keeps only its longest prefix equal to ``committed``."""
        ref = committed.tolist()
        held = next((i for i, (a, b) in enumerate(zip(self._fed, ref)) if a != b), min(len(self._fed), len(ref)))
        return Keep(min(held, committed.numel() - 1), cache=self.cache)

    def sync(self, n_committed):
        self._fed = self._fed[:self.cache.seq_len]


class LowPrecisionDrafter(ModelDrafter):
    """The target itself in bfloat16 (a copy): LLM-42's low-precision fast path.

    >>> from beliefscope.models.testing import tiny_gpt2
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
    setattr(parent, attr, nn.ModuleList(list(full)[:k]))  # torch's public way to swap a submodule
    try:
        yield
    finally:
        setattr(parent, attr, full)


class EarlyExitDrafter(Drafter):
    """The target's first ``k`` layers as the draft (LayerSkip style, no extra weights).

    With ``share_cache=True`` the draft forwards write layers 0..k-1 of the *target's* cache past
    the committed length and roll them back afterwards: the draft reuses the target's K/V of the
    committed prefix and needs no prefill. With ``share_cache=False`` it keeps its own cache.

    >>> from beliefscope.models.testing import tiny_gpt2
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
        self.cache.recorder.next_provenance = Provenance.DRAFT
        run = forward_module(self.target)  # the module this forward calls: its block list is shortened
        with first_layers(run, self.k):
            return forward(run, x, self.cache, last_only=True)[-1]

    def _look_ahead(self):
        """With a shared cache, the target's cache as it was before drafting once the drafts are made (layers >= k
        were never written; `KVCache.tentative`). The drafts are not the verifier's rejections, so none is kept,
        whatever the cache's config says: the drafter never touches the target's configuration."""
        return self.cache.tentative() if self.share_cache else contextlib.nullcontext()

    def propose(self, ids, n, cfg):
        with self._look_ahead():
            return _draft_chain(self._forward, ids[self.cache.seq_len:], ids, n, cfg)

    def propose_tree(self, ids, shape, cfg):
        """Chain + next-best leaves of the first k layers (``model_propose_tree``)."""
        if not self.share_cache:
            return super().propose_tree(ids, shape, cfg)
        with self._look_ahead():
            return model_propose_tree(self, ids, shape, cfg, self._forward, ids[self.cache.seq_len:])

    def keep(self, committed):
        """With a cache of its own, it keeps all but the pending token (``ModelDrafter.keep``); a shared cache is
        the target's, left as it was after drafting (`_look_ahead`)."""
        return None if self.share_cache else Keep(min(self.cache.seq_len, committed.numel() - 1), cache=self.cache)


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
