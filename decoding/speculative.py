"""Speculative decoding: draft, verify in one forward of the target, roll the cache back.

>>> from beliefscope.cache.testing import tiny_gpt2
>>> from beliefscope.decoding.drafters import NGramDrafter
>>> model = tiny_gpt2()
>>> cfg = SpecConfig(gamma=3, max_new_tokens=6, stop_at_eos=False)
>>> spec = speculative_generate(model, NGramDrafter(2), [4, 5, 4, 5, 4], cfg)
>>> spec.tokens == generate(model, [4, 5, 4, 5, 4], cfg, window=cfg.window_size).tokens
True
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager

import torch
from beliefscope.cache import Provenance
from beliefscope.decoding.config import SpecConfig
from beliefscope.decoding.core import (
    Generation,
    check_prompt,
    clip_new,
    eos_id,
    forward,
    generate,
    hf_model,
    new_cache,
    pad_window,
    pick,
    probs,
    sample,
    seeded_generator,
    token_budget,
)
from beliefscope.decoding.drafters import Drafter
from beliefscope.decoding.trace import Step, Trace, close_step, record_counts


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


@torch.no_grad()
def speculative_generate(model, drafter: Drafter | None, prompt_ids, cfg: SpecConfig | None = None, *,
                         tokenizer=None) -> Generation:
    """Generate with draft -> verify -> rollback. ``drafter=None`` is plain cached decoding.

    Every verify forward is ``[pending token, drafts...]`` padded to ``cfg.window_size`` when
    ``cfg.fixed_window`` (the default): a fixed shape, so greedy output equals the fixed-shape
    reference ``generate(..., window=cfg.window_size)`` token for token, whatever the drafter.
    With ``fixed_window=False`` the forward is only as wide as the draft (or padded up to one of
    ``cfg.verify_widths``): faster when drafts are often short or empty, and equal to plain greedy
    up to the ~1e-7 shape-dependent rounding of HF issue #39421.
    The returned ``Generation`` has alpha, gammas, tokens per step, forward counts and draft vs
    target seconds (enough for c and Leviathan's bound); ``.trace`` when ``cfg.trace``.
    """
    cfg = cfg or SpecConfig()
    if drafter is None:
        return generate(model, prompt_ids, cfg, tokenizer=tokenizer)
    if cfg.tree is not None:  # token trees: decoding.tree_generate
        from beliefscope.decoding.tree_generate import tree_generate
        return tree_generate(model, drafter, prompt_ids, cfg, tokenizer=tokenizer)
    t_start = time.perf_counter()
    ids0 = check_prompt(model, prompt_ids)
    n_prompt, W = ids0.numel(), cfg.window_size
    eos = eos_id(model, cfg, tokenizer)
    room = cfg.max_verify_width  # the widest verify forward (padding included)
    budget = token_budget(model, n_prompt, cfg.max_new_tokens, room)
    buf = torch.zeros(n_prompt + budget + room, dtype=torch.long)  # committed tokens, prompt first
    buf[:n_prompt] = ids0
    cache = new_cache(model, n_prompt + budget + room, cfg.keep_rejected)
    trace = Trace(n_prompt) if cfg.trace else None
    res = Generation([], n_prompt, 0, 0, 0.0, trace=trace, cache=cache)
    with ExitStack() as stack:
        caps = []
        if cfg.capture:
            from beliefscope import hooks
            caps.append(stack.enter_context(hooks.capture(model, list(cfg.capture), cache=cache)))
            stack.enter_context(_positions_from_cache(model, caps[-1]))
            trace.captures = caps
        _set_pass(caps, "verify")
        t = time.perf_counter()
        logits = forward(model, ids0, cache)[-1]  # prefill: cache = prompt (PREFILL)
        res.target_seconds += time.perf_counter() - t
        res.target_forwards = 1
        buf[n_prompt] = pick(logits, cfg, n_prompt)
        length = n_prompt + 1  # committed tokens; buf[length - 1] is pending, the cache holds length - 1
        t = time.perf_counter()
        drafter.start(model, buf[:length], cache, cfg)
        res.draft_seconds += time.perf_counter() - t
        _capture_draft_model(stack, caps, drafter, cfg)
        gamma = cfg.gamma_start if cfg.adaptive else int(cfg.gamma)
        gamma = min(gamma, W - 1)
        while length - n_prompt < budget and int(buf[length - 1]) != eos:
            counts = record_counts(caps)
            n_events = len(cache.events)
            pos = length - 1  # absolute position of the pending token
            want = min(gamma, budget - (length - n_prompt) - 1)  # drafts past the budget are wasted
            _set_pass(caps, "draft")
            t = time.perf_counter()
            drafts, q = drafter.propose(buf[:length], want, cfg) if want > 0 else (buf[:0], None)
            drafts = drafts[:want]
            t_draft = time.perf_counter() - t
            _set_pass(caps, "verify")
            t = time.perf_counter()
            x = torch.cat([buf[pos:length], drafts])  # [1 + k]: pending token, then drafts
            x = pad_window(x, cfg.verify_width(x.numel()))  # [W] when fixed; padding is causally invisible
            cache.next_provenance = Provenance.VERIFIED
            logits = forward(model, x, cache)[: drafts.numel() + 1]  # [k+1, vocab]; row j -> position pos+1+j
            if cfg.temperature == 0:
                accepted, nxt = accept_greedy(logits, drafts)
            else:
                accepted, nxt = accept_sampled(logits, drafts, q, cfg, pos + 1)
            new = [*drafts[:accepted].tolist(), nxt]
            new = clip_new(new, budget - (length - n_prompt), eos)
            # Rollback: keep the pending token and the accepted drafts (the last new token is pending).
            keep = pos + len(new)
            if cfg.keep_rejected and keep < cache.seq_len:
                cache.mark(keep, cache.seq_len, Provenance.REJECTED)
            cache.rollback(keep)
            buf[length:length + len(new)] = torch.tensor(new)
            length += len(new)
            t_verify = time.perf_counter() - t
            t = time.perf_counter()
            drafter.sync(length)
            t_draft += time.perf_counter() - t
            res.record_step(drafted=drafts.numel(), accepted=accepted, gamma=gamma, n_new=len(new),
                            draft_s=t_draft, verify_s=t_verify)
            if trace is not None:
                trace.steps.append(Step(res.steps - 1, pos, drafts.tolist(), accepted, new,
                                        drafts[accepted:].tolist(), gamma, t_draft, t_verify,
                                        [tuple(e) for e in cache.events[n_events:]]))
                close_step(caps, counts, res.steps - 1, keep)
            gamma = min(cfg.next_gamma(gamma, accepted), W - 1)
    res.tokens = buf[n_prompt:length].tolist()
    res.draft_forwards = getattr(drafter, "forwards", 0)
    res.seconds = time.perf_counter() - t_start
    return res


def _set_pass(caps, name: str) -> None:
    for cap in caps:
        cap.tags["pass"] = name


def _capture_draft_model(stack: ExitStack, caps: list, drafter, cfg: SpecConfig) -> None:
    """Also capture the draft model's activations (names it has), tagged pass=draft."""
    model = getattr(drafter, "model", None)
    if not cfg.capture or model is None or not hasattr(model, "hook_dict"):
        return
    from beliefscope import hooks
    names = [n for n in cfg.capture if n in model.hook_dict]
    if names:
        cap = stack.enter_context(hooks.capture(model, names, cache=drafter.cache))
        stack.enter_context(_positions_from_cache(model, cap))
        cap.tags["pass"] = "draft"
        caps.append(cap)


@contextmanager
def _positions_from_cache(model, cap):
    """We call the HF model under the bridge directly (faster); the bridge's own pre-hook that tells
    the capture where a forward starts does not fire then, so do it on the HF model."""
    def pre(module, args, kwargs):
        tokens = args[0] if args else kwargs.get("input_ids")
        cap.begin_forward(int(tokens.shape[-1]))

    handle = hf_model(model).register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
