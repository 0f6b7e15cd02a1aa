"""Speculative decoding: draft, verify in one forward of the target, roll the cache back.

A chain is a token tree with one branch; it keeps its own step (``ChainStep``) because its verify
needs no tree mask and its sampling rule is the two-model one, but it runs in the same loop as a
tree (``decoding.loop``).

>>> from beliefscope.models.testing import tiny_gpt2
>>> from beliefscope.decoding.ngram import NGramDrafter
>>> model = tiny_gpt2()
>>> cfg = SpecConfig(gamma=3, max_new_tokens=6, stop_at_eos=False)
>>> spec = speculative_generate(model, NGramDrafter(2), [4, 5, 4, 5, 4], cfg)
>>> spec.tokens == generate(model, [4, 5, 4, 5, 4], cfg, window=cfg.window_size).tokens
True
"""

from __future__ import annotations

import torch

from ..cache import KVCache, Provenance
from ..models.devices import HOST
from .config import SpecConfig, with_overrides
from .core import (
    Generation,
    forward,
    hf_model,
    pad_window,
    probs,
    sample,
    seeded_generator,
)
from .drafter import Drafter
from .engine import Keep
from .loop import Proposal, generate, speculative_loop
from .tree_generate import TreeStep


def accept_greedy(logits: torch.Tensor, drafts: torch.Tensor) -> tuple[int, int]:
    """Greedy verification. ``logits`` ``[k+1, vocab]`` (row j predicts the token after draft j-1).

    Rule: accept the longest prefix of drafts equal to the reference argmax; then commit the
    reference's token at the first mismatch, or its extra token if every draft was accepted.
    Returns ``(accepted, next_token)``.

    >>> accept_greedy(torch.eye(4)[[1, 2, 3]], torch.tensor([1, 0]))
    (1, 2)
    """
    ref = logits.argmax(-1)  # [k+1]
    k = drafts.numel()
    accepted = int((drafts == ref[:k]).cumprod(0).sum()) if k else 0
    return accepted, int(ref[accepted])


def accept_sampled(logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor, cfg: SpecConfig,
                   position: int) -> tuple[int, int]:
    """Sampling verification (Leviathan et al. 2023, Chen et al. 2023). Draft j sits at absolute
    ``position + j``; ``q`` ``[k, vocab]`` is the draft distribution it was sampled from.

    Rule: for j = 0..k-1, with u ~ U(0, 1) seeded by (seed, position + j):
      accept d_j if u < min(1, p_j(d_j) / q_j(d_j));
      otherwise commit a sample from norm(max(0, p_j - q_j)) and stop.
    If every draft is accepted, commit a sample from p_k (the extra token).
    Returns ``(accepted, next_token)``.
    """
    p = probs(logits, cfg.temperature)  # [k+1, vocab] float64
    for j in range(drafts.numel()):
        d = int(drafts[j])
        gen = seeded_generator(cfg.seed, position + j, "accept")
        u = float(torch.rand((), generator=gen, dtype=torch.float64))
        if u < min(1.0, float(p[j, d] / q[j, d])):
            continue
        residual = (p[j] - q[j]).clamp(min=0)
        return j, sample(residual / residual.sum(), gen)
    k = drafts.numel()
    return k, sample(p[k], seeded_generator(cfg.seed, position + k, "target"))


class ChainStep:
    """One branch of up to gamma drafts (adaptive with ``gamma="auto"``), verified under the cache's
    causal mask: ``[pending, drafts..., padding]``, the padding causally invisible. The cache then labels
    the pending token VERIFIED and the accepted drafts ACCEPTED; rejected drafts go to ``cache.recorder.rejected``
    (REJECTED, with ``keep_rejected``), the padding nowhere."""

    provenance = Provenance.VERIFIED  # what a verify forward writes
    replayable = True  # its verify is `forward` of one width per gamma: `SpecConfig(compile=True)` replays it

    def __init__(self, cfg: SpecConfig):
        self.cfg = cfg
        self.room = cfg.max_verify_width  # the widest verify forward
        self.gamma = min(cfg.gamma_start if cfg.adaptive else int(cfg.gamma), cfg.window_size - 1)

    def width(self, n: int) -> int:
        return self.cfg.verify_width(n)

    def propose(self, drafter: Drafter, ids: torch.Tensor, left: int) -> Proposal:
        want = min(self.gamma, left)
        drafts, q = drafter.propose(ids, want, self.cfg) if want > 0 else (ids[:0], None)
        drafts = drafts[:want]  # [k]
        return Proposal(drafts.tolist(), self.gamma, drafts, q)

    def verify(self, model, cache, pending: torch.Tensor, prop: Proposal, width: int) -> torch.Tensor:
        x = pad_window(torch.cat([pending, prop.drafts]), width)  # [width]: pending token, drafts, padding
        return forward(model, x, cache)[: len(prop.tokens) + 1]  # [k+1, vocab]

    def accept(self, logits: torch.Tensor, prop: Proposal, position: int) -> tuple[list[int], int]:
        if self.cfg.temperature == 0:
            accepted, nxt = accept_greedy(logits, prop.drafts)
        else:
            accepted, nxt = accept_sampled(logits, prop.drafts, prop.q, self.cfg, position)
        return list(range(accepted)), nxt

    def keep(self, cache, position: int, prop: Proposal, path: list[int], keep: int) -> Keep:
        # the window [pending, drafts..., padding] sits at position..: the pending token is the verifier's own
        # (VERIFIED, as written), the drafts on `path` were accepted, those after it were not (REJECTED, kept
        # with keep_rejected), and the padding is dropped with no label, never kept
        drafts_end = position + 1 + len(prop.tokens)
        return Keep(keep, (position, len(path), drafts_end), self.cfg.keep_rejected)

    def after(self, res: Generation, prop: Proposal, path: list[int], n_kept: int, width: int) -> dict:
        self.gamma = min(self.cfg.next_gamma(self.gamma, len(path)), self.cfg.window_size - 1)
        return {"rejected": prop.tokens[len(path):]}


@torch.no_grad()
def speculative_generate(model, drafter: Drafter | None, prompt_ids, cfg: SpecConfig | None = None, *,
                         tokenizer=None, cache: KVCache | None = None, **settings) -> Generation:
    """Generate with draft -> verify -> rollback. ``drafter=None`` is plain cached decoding;
    ``cfg.tree`` drafts a token tree per step (``decoding.tree_generate``).

    Every verify forward is ``[pending token, drafts...]`` padded to ``cfg.window_size`` when
    ``cfg.fixed_window`` (the default): a fixed shape, so greedy output equals the fixed-shape
    reference ``generate(..., window=cfg.window_size)`` token for token, whatever the drafter.
    With ``fixed_window=False`` the forward is only as wide as the draft (or padded up to one of
    ``cfg.verify_widths``): faster when drafts are often short or empty, and equal to plain greedy
    up to the ~1e-7 shape-dependent rounding of HF issue #39421.
    The returned ``Generation`` has alpha, gammas, tokens per step, forward counts and draft vs
    target seconds (enough for c and Leviathan's bound); ``.trace`` when ``cfg.trace``.
    ``cfg`` fields may be given as keywords, and ``cache`` continues a `KVCache`, as `generate` says.
    """
    cfg = with_overrides(cfg, settings)
    if drafter is None:
        return generate(model, prompt_ids, cfg, tokenizer=tokenizer, cache=cache)
    kind = TreeStep(cfg) if cfg.tree is not None else ChainStep(cfg)
    return speculative_loop(model, drafter, prompt_ids, cfg, kind, tokenizer=tokenizer, cache=cache)


def equals(model, drafter: Drafter | None, cfg: SpecConfig) -> str:
    """Which decoding a run's tokens equal, in words (``generate --json``'s ``"equals"``).

    A greedy speculative run equals the fixed-shape reference at its verify width: every verify forward
    has that shape. It equals plain one-token greedy where the kernels do not depend on the width, which
    holds (and is tested) in float32 on the CPU; in bfloat16 on a GPU the two may differ.

    >>> from beliefscope.models.testing import tiny_llama
    >>> equals(tiny_llama(), None, SpecConfig())
    'plain greedy (one token per forward)'
    """
    if cfg.temperature > 0:
        return ("a sample of the model's own distribution (the same again for the same seed and drafter; another "
                "drafter draws another sample of it)")
    if drafter is None:
        return "plain greedy (one token per forward)"
    p = next(hf_model(model).parameters())
    width_free = p.device.type == HOST.type and p.dtype == torch.float32
    ref = f"fixed-shape reference (W={cfg.window_size})" if cfg.fixed_window else "plain greedy up to rounding " \
        "(verify widths vary)"
    return ref + ("; and plain greedy (float32 on the CPU: kernels do not depend on the width)" if width_free else
                  f"; plain greedy may differ ({str(p.dtype).replace('torch.', '')} on {p.device.type}: kernels "
                  "depend on the verify width)")
