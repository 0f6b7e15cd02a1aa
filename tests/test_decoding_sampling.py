"""Speculative sampling preserves the target distribution and is reproducible per seed."""

import pytest

from beliefscope.decoding import ModelDrafter, NGramDrafter, SpecConfig, generate, speculative_generate

from .helpers import VOCAB, chi2_p, exact_joint, logit_table, sharp_model, tiny_gpt2_hf


@pytest.mark.slow
def test_speculative_sampling_matches_target_distribution():
    target, draft = sharp_model(1), sharp_model(2)
    prompt, T = [1, 3, 2], 1.0
    seqs, p = exact_joint(target, prompt, T)
    n = 8_000  # detects an effect size w of about 0.07 (chi-square, p < 0.01): the wiring's bugs move the joint grossly
    spec, plain = [], []
    accepted = drafted = 0
    for seed in range(n):
        cfg = SpecConfig(gamma=2, max_new_tokens=3, temperature=T, seed=seed, stop_at_eos=False)
        out = speculative_generate(target, ModelDrafter(draft), prompt, cfg)
        spec.append(out.tokens)
        accepted, drafted = accepted + out.accepted, drafted + out.drafted
        if seed < 2000:
            plain.append(generate(target, prompt, cfg).tokens)
    assert 0.05 < accepted / drafted < 0.95  # the rejection branch is really exercised
    assert chi2_p(spec, seqs, p) > 0.01
    assert chi2_p(plain, seqs, p) > 0.01


def test_chain_rule_matches_target_distribution():
    """accept_sampled on two drafts sampled from the draft's exact distribution per seed, fed the target's
    exact logits (no cache, no engine): the first two committed tokens follow the target's joint, at
    20,000 seeds (the end-to-end test above checks the wiring at fewer)."""
    import torch

    from beliefscope.decoding.core import probs
    from beliefscope.decoding.speculative import accept_sampled

    target, draft = sharp_model(1), sharp_model(2)
    prompt, T = [1, 3, 2], 1.0
    seqs, p = exact_joint(target, prompt, T, n=2)
    tgt, drf = logit_table(target, prompt, 3), logit_table(draft, prompt, 2)
    samples, accepted = [], 0
    for seed in range(20_000):
        cfg = SpecConfig(temperature=T, seed=seed)
        g = torch.Generator().manual_seed(10**6 + seed)  # the draft's own draws, apart from the rule's
        q0 = probs(drf[()], T)
        d0 = int(torch.multinomial(q0, 1, generator=g))
        q1 = probs(drf[(d0,)], T)
        d1 = int(torch.multinomial(q1, 1, generator=g))
        logits = torch.stack([tgt[()], tgt[(d0,)], tgt[(d0, d1)]])  # [k + 1, vocab]: after each draft prefix
        n_acc, nxt = accept_sampled(logits, torch.tensor([d0, d1]), torch.stack([q0, q1]), cfg, len(prompt))
        out = [d0, d1][:n_acc] + [nxt]
        if len(out) < 2:  # the second token, sampled from the target after the first (plain sampling)
            out.append(int(torch.multinomial(probs(tgt[tuple(out)], T), 1, generator=g)))
        samples.append(out[:2])
        accepted += n_acc
    assert 0.05 < accepted / 40_000 < 0.95  # rejections and acceptances both exercised
    assert chi2_p(samples, seqs, p) > 0.01


def test_sampling_reproducible_and_seed_dependent():
    target = tiny_gpt2_hf(seed=1, vocab=VOCAB)
    draft = tiny_gpt2_hf(seed=2, vocab=VOCAB)
    runs = {}
    for seed in (0, 1, 2, 3):
        cfg = SpecConfig(gamma=3, max_new_tokens=20, temperature=1.0, seed=seed, stop_at_eos=False)
        a = speculative_generate(target, ModelDrafter(draft), [1, 2], cfg).tokens
        assert a == speculative_generate(target, ModelDrafter(draft), [1, 2], cfg).tokens
        runs[seed] = a
        ng = speculative_generate(target, NGramDrafter(2), [1, 2], cfg).tokens
        assert ng == speculative_generate(target, NGramDrafter(2), [1, 2], cfg).tokens
    assert len({tuple(v) for v in runs.values()}) > 1


pytestmark = pytest.mark.usefixtures("one_thread")
