"""Speculative decoding: greedy exactness against the fixed-shape reference, edge cases, rollback
bookkeeping, bad input, and the Trace."""


import pytest
import torch

from beliefscope.cache import Provenance
from beliefscope.decoding import (
    Drafter,
    EarlyExitDrafter,
    LowPrecisionDrafter,
    ModelDrafter,
    NGramDrafter,
    SpecConfig,
    generate,
    speculative_generate,
)

from .helpers import tiny_gpt2_hf

pytestmark = pytest.mark.usefixtures("one_thread")


class Scripted(Drafter):
    """Test double: proposes the reference continuation, optionally corrupted at draft index `wrong`."""

    name = "scripted"

    def __init__(self, reference, wrong=None, extra=0):
        self.ref, self.wrong, self.extra = reference, wrong, extra

    def start(self, target, ids, cache, cfg):
        self.n_prompt = ids.numel()  # prompt + the prefill token (= ref[0])

    def propose(self, ids, n, cfg):
        done = ids.numel() - self.n_prompt
        out = (self.ref + [5] * (n + self.extra))[done:done + n]
        if self.wrong is not None and len(out) > self.wrong:
            out[self.wrong] = (out[self.wrong] + 1) % 32
        return torch.tensor(out, dtype=torch.long), None


@pytest.mark.slow
def test_greedy_exact_all_drafters_200_heldout(toy, heldout_prompts):
    """Token-exact vs the fixed-shape reference and vs plain single-token greedy, for every drafter."""
    target, draft, tok = toy
    cfg = SpecConfig(gamma=4, max_new_tokens=20)
    ref = [generate(target, p, cfg, window=cfg.window_size, tokenizer=tok).tokens for p in heldout_prompts]
    plain = [generate(target, p, cfg, tokenizer=tok).tokens for p in heldout_prompts]
    assert plain == ref  # single-token decoding and the fixed-shape verifier agree on every prompt
    drafters = [ModelDrafter(draft), EarlyExitDrafter(target, 2), NGramDrafter(3), LowPrecisionDrafter(target)]
    for d in drafters:
        outs = [speculative_generate(target, d, p, cfg, tokenizer=tok) for p in heldout_prompts]
        mismatches = [i for i, (o, r) in enumerate(zip(outs, ref)) if o.tokens != r]
        assert not mismatches, f"{d.name}: prompts {mismatches[:5]} differ from plain greedy"
        assert sum(o.steps for o in outs) <= sum(len(r) for r in ref)  # never more target steps than greedy


@pytest.mark.slow
def test_adaptive_gamma_exact_and_schedule(toy, heldout_prompts):
    target, draft, tok = toy
    cfg = SpecConfig(gamma="auto", gamma_start=2, gamma_max=6, max_new_tokens=20)
    for p in heldout_prompts[:30]:
        out = speculative_generate(target, ModelDrafter(draft), p, cfg, tokenizer=tok)
        assert out.tokens == generate(target, p, cfg, window=cfg.window_size, tokenizer=tok).tokens
        for g, a, g_next in zip(out.gammas, out.accepted_per_step, out.gammas[1:]):
            assert g_next == (min(6, g + 2) if a == g else max(1, g - 1))


@pytest.mark.parametrize("gamma", [1, 3])
def test_edge_first_draft_rejected(toy, heldout_prompts, gamma):
    target, _, tok = toy
    cfg = SpecConfig(gamma=gamma, max_new_tokens=12, stop_at_eos=False)
    p = heldout_prompts[0]
    ref = generate(target, p, cfg, window=cfg.window_size).tokens
    out = speculative_generate(target, Scripted(ref[1:], wrong=0), p, cfg)
    assert out.tokens == ref
    assert out.accepted == 0 and all(n == 1 for n in out.tokens_per_step)


def test_edge_all_accepted_and_provenance(toy, heldout_prompts):
    target, _, tok = toy
    cfg = SpecConfig(gamma=3, max_new_tokens=13, stop_at_eos=False, keep_rejected=True)
    p = heldout_prompts[1]
    ref = generate(target, p, cfg, window=cfg.window_size).tokens
    out = speculative_generate(target, Scripted(ref[1:]), p, cfg)
    assert out.tokens == ref and out.alpha == 1.0
    assert out.tokens_per_step == [4, 4, 4]  # every draft accepted + the extra token
    prov = out.cache.recorder.provenance_of(0)
    assert out.cache.seq_len == len(p) + len(ref) - 1  # everything but the pending token
    assert (prov[: len(p)] == Provenance.PREFILL).all()
    # per step: the verifier's own token (the pending one), then the 3 drafts it accepted
    assert prov[len(p):].tolist() == [int(Provenance.VERIFIED)] + [int(Provenance.ACCEPTED)] * 3 + \
        [int(Provenance.VERIFIED)] + [int(Provenance.ACCEPTED)] * 3 + [int(Provenance.VERIFIED)] + \
        [int(Provenance.ACCEPTED)] * 3
    assert out.cache.recorder.rejected == []  # every draft accepted: the padding-free windows leave nothing rejected


def test_draft_model_cache_after_full_accept(toy, heldout_prompts):
    """The target as its own draft model: every draft accepted, so the draft cache must catch up on
    its own last draft each step; exactness proves it did."""
    target, _, tok = toy
    from .helpers import copy_of

    cfg = SpecConfig(gamma=3, max_new_tokens=12, stop_at_eos=False)
    for p in heldout_prompts[:5]:
        d = ModelDrafter(copy_of(target))
        out = speculative_generate(target, d, p, cfg)
        assert out.tokens == generate(target, p, cfg, window=cfg.window_size).tokens
        assert out.alpha == 1.0
        assert d.cache.seq_len == len(p) + len(out.tokens) - 2  # has not seen its own last draft


def test_rejected_entries_kept(toy, heldout_prompts):
    target, _, tok = toy
    cfg = SpecConfig(gamma=3, max_new_tokens=8, stop_at_eos=False, keep_rejected=True)
    p = heldout_prompts[2]
    ref = generate(target, p, cfg, window=cfg.window_size).tokens
    out = speculative_generate(target, Scripted(ref[1:], wrong=1), p, cfg)
    assert out.tokens == ref
    rejected = out.cache.recorder.rejected
    assert rejected and all((s.provenance == Provenance.REJECTED).all() for s in rejected)
    first = out.cache.recorder.rejected[0]
    assert first.start == len(p) + 2  # pending + 1 accepted draft kept, the other 2 drafts rejected
    assert first.end == len(p) + 4  # the rejected drafts only


def test_edge_eos_inside_window(toy, heldout_prompts):
    target, _, tok = toy
    cfg = SpecConfig(gamma=4, max_new_tokens=40)
    p = heldout_prompts[3]
    ref = generate(target, p, cfg, window=cfg.window_size, tokenizer=tok).tokens
    assert ref[-1] == tok.eos_token_id or len(ref) == 40
    out = speculative_generate(target, Scripted(ref[1:], extra=6), p, cfg, tokenizer=tok)
    assert out.tokens == ref  # drafts after eos are dropped


def test_edge_max_new_tokens_mid_window(toy, heldout_prompts):
    target, _, tok = toy
    for n in (1, 2, 6, 7):
        cfg = SpecConfig(gamma=4, max_new_tokens=n, stop_at_eos=False)
        p = heldout_prompts[4]
        ref = generate(target, p, cfg, window=cfg.window_size).tokens
        out = speculative_generate(target, Scripted(ref[1:], extra=10), p, cfg)
        assert out.tokens == ref and len(out.tokens) == n


def test_edge_prompt_at_context_limit():
    model = tiny_gpt2_hf()  # n_positions = 256
    cfg = SpecConfig(gamma=3, max_new_tokens=8, stop_at_eos=False)
    for n in (256 - 6, 256 - 4, 256):
        p = torch.arange(n) % 60 + 2
        out = speculative_generate(model, NGramDrafter(2), p, cfg)
        ref = generate(model, p, cfg, window=cfg.window_size).tokens
        assert out.tokens == ref and 1 <= len(out.tokens) <= 256 - n + 1
    with pytest.raises(ValueError, match="context is 256"):
        speculative_generate(model, NGramDrafter(2), torch.arange(257) % 60, cfg)


def test_bad_inputs():
    model = tiny_gpt2_hf(vocab=64)
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(model, ModelDrafter(tiny_gpt2_hf(vocab=50)), [1, 2], SpecConfig())
    for g in (0, -1):
        with pytest.raises(ValueError, match="gamma"):
            SpecConfig(gamma=g)
    with pytest.raises(ValueError, match="empty"):
        speculative_generate(model, NGramDrafter(2), [], SpecConfig())
    with pytest.raises(ValueError, match="out of range"):
        EarlyExitDrafter(model, 2)
    with pytest.raises(ValueError, match="out of range"):
        EarlyExitDrafter(model, 0)


def test_early_exit_shared_vs_own_cache(toy, heldout_prompts):
    target, _, tok = toy
    cfg = SpecConfig(gamma=3, max_new_tokens=16)
    for p in heldout_prompts[:10]:
        a = speculative_generate(target, EarlyExitDrafter(target, 1, share_cache=True), p, cfg, tokenizer=tok)
        b = speculative_generate(target, EarlyExitDrafter(target, 1, share_cache=False), p, cfg, tokenizer=tok)
        assert a.tokens == b.tokens and a.accepted_per_step == b.accepted_per_step


def test_trace_steps_and_tagged_activations():
    """Committed verify activations equal an uncached forward over the final text; the early-exit
    draft pass is captured at layer 0 only (it never reaches block 1)."""
    from beliefscope.hooks import capture
    from beliefscope.models.load import bridge_from_hf

    bridge = bridge_from_hf(tiny_gpt2_hf(seed=3))
    names = ("blocks.0.hook_resid_post", "blocks.1.hook_resid_post")
    cfg = SpecConfig(gamma=3, max_new_tokens=10, stop_at_eos=False, trace=True, capture=names)
    prompt = [5, 6, 7, 5, 6, 7, 5]
    out = speculative_generate(bridge, EarlyExitDrafter(bridge, 1), prompt, cfg)
    tr = out.trace
    assert sum(len(s.committed) for s in tr.steps) == len(out.tokens) - 1  # + the prefill's token
    assert all(s.committed[:-1] == s.proposals[: s.accepted] for s in tr.steps)
    assert all(s.rejected == s.proposals[s.accepted:] for s in tr.steps)
    assert any(e[0] == "verify" for s in tr.steps for e in s.events)
    full = torch.tensor([prompt + out.tokens[:-1]])  # [1, n]: what the cache holds at the end
    with torch.no_grad(), capture(bridge, list(names)) as cap:
        bridge(full, return_type="logits")
    for name in names:
        pos, acts = tr.activations(name, "verify", "committed")
        assert sorted(pos.tolist()) == list(range(len(prompt), full.shape[1]))  # each decoded position once
        torch.testing.assert_close(acts, cap.stacked(name)[0][pos], atol=1e-4, rtol=1e-4)
    assert tr.activations(names[0], "draft", None)[0].numel() == sum(len(s.proposals) for s in tr.steps)
    assert tr.activations(names[1], "draft", None)[0].numel() == 0
