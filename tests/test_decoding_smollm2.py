"""SmolLM2-135M: greedy speculative decoding is token-exact against the fixed-shape reference, and
plain single-token greedy matches that reference too (natural coin-flip prompts)."""

import pytest

from decoding import EarlyExitDrafter, NGramDrafter, SpecConfig, generate, speculative_generate


@pytest.mark.slow
def test_smollm2_greedy_exact(smollm2):
    from tasks.coinflip import sample_prompts

    model, tok = smollm2
    prompts = [tok(p)["input_ids"] for p in sample_prompts(20, seed=11, rendering="natural")]
    cfg = SpecConfig(gamma=3, max_new_tokens=10, stop_at_eos=False)
    ref = [generate(model, p, cfg, window=cfg.window_size).tokens for p in prompts]
    plain = [generate(model, p, cfg).tokens for p in prompts]
    assert plain == ref
    for drafter in (NGramDrafter(3), EarlyExitDrafter(model, 8)):
        outs = [speculative_generate(model, drafter, p, cfg).tokens for p in prompts]
        bad = [i for i, (o, r) in enumerate(zip(outs, ref)) if o != r]
        assert not bad, f"{drafter.name}: prompts {bad} differ from the reference"
