"""Speculative sampling preserves the target distribution and is reproducible per seed."""

import numpy as np
import pytest
from beliefscope.decoding import ModelDrafter, NGramDrafter, SpecConfig, generate, speculative_generate
from scipy.stats import chisquare

from .helpers import VOCAB, exact_joint, sharp_model, tiny_gpt2_hf


def chi2_p(samples, seqs, p):
    index = {s: i for i, s in enumerate(seqs)}
    counts = np.bincount([index[tuple(s)] for s in samples], minlength=len(seqs))
    exp = p * len(samples)
    big = exp >= 5  # pool the rare cells into one
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(exp[big], exp[~big].sum())
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.mark.slow
def test_speculative_sampling_matches_target_distribution():
    target, draft = sharp_model(1), sharp_model(2)
    prompt, T = [1, 3, 2], 1.0
    seqs, p = exact_joint(target, prompt, T)
    n = 20_000
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
