"""Steering positions are sequence positions (issue 60, silent case 2): the same steer gives the same tokens
under plain greedy and speculative decoding as a plain PyTorch forward hook with full recompute, and a position
counted from the end of a forward that extends a cache is refused by name."""

import pytest
import torch

from beliefscope.decoding import ModelDrafter, NGramDrafter, SpecConfig, generate, speculative_generate
from beliefscope.decoding.core import hf_model
from beliefscope.hooks import steer
from beliefscope.models.load import load_model

from .helpers import DRAFT, TARGET, toy_hf

pytestmark = pytest.mark.usefixtures("one_thread")

LAYER, ALPHA, N = 1, 25.0, 20  # ALPHA * |direction| = 100 against residual norms of 4-12: it flips tokens


def recompute_greedy(hf, prompt, direction, positions, n_new):
    """Greedy decoding by full recompute (no cache): a forward hook on HF's decoder layer ``LAYER`` adds
    ``ALPHA * direction`` to its output at the absolute ``positions``."""
    where = sorted(positions)

    def hook(module, args, output):
        h = output[0] if isinstance(output, tuple) else output
        idx = [p for p in where if p < h.shape[1]]
        h = h.clone()
        h[:, idx] += ALPHA * direction
        return (h, *output[1:]) if isinstance(output, tuple) else h

    handle = hf.transformer.h[LAYER].register_forward_hook(hook)
    try:
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(n_new):
                ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    finally:
        handle.remove()
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def setup(heldout_prompts):
    target, _ = load_model(TARGET)
    direction = torch.randn(hf_model(target).config.n_embd, generator=torch.Generator().manual_seed(0))
    return target, direction / direction.norm() * 4, heldout_prompts[0]


def test_absolute_positions_equal_recompute_plain_and_speculative(setup):
    target, direction, p = setup
    n = len(p)
    cfg = SpecConfig(gamma=4, max_new_tokens=N, stop_at_eos=False)
    plain = generate(target, p, cfg).tokens
    for positions in ([n - 1, n + 3, n + 7], range(n - 1, n + N)):
        ref = recompute_greedy(hf_model(target), p, direction, positions, N)
        assert ref != plain  # the steer changes the output: the comparison below has teeth
        with torch.no_grad(), steer(target, LAYER, direction, ALPHA, positions=positions):
            assert generate(target, p, cfg).tokens == ref, f"plain greedy, positions={positions}"
            for drafter in (ModelDrafter(toy_hf("draft", DRAFT)), NGramDrafter(2)):
                out = speculative_generate(target, drafter, p, cfg)
                assert out.tokens == ref, f"{drafter.name}, positions={positions}"


def test_negative_positions_refused_where_ambiguous(setup):
    target, direction, p = setup
    cfg = SpecConfig(gamma=4, max_new_tokens=N, stop_at_eos=False)
    with torch.no_grad(), steer(target, LAYER, direction, ALPHA, positions=[-1]):
        with pytest.raises(ValueError, match=r"positions=\[-1\].*extends a cache.*range\(len\(prompt\) - 1"):
            speculative_generate(target, ModelDrafter(toy_hf("draft", DRAFT)), p, cfg)
        with pytest.raises(ValueError, match=r"positions=\[-1\]"):
            generate(target, p, cfg)
        # a forward from position 0 has one end: -1 is its last input token
        x = torch.tensor([p])
        got = target(x, return_type="logits")
    with torch.no_grad(), steer(target, LAYER, direction, ALPHA, positions=[len(p) - 1]):
        torch.testing.assert_close(got, target(x, return_type="logits"), atol=0, rtol=0)
