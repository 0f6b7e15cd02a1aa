"""Deterministic requests: identical verified output across batch compositions and arrival orders."""

import pytest

from decoding import SpecConfig, generate
from decoding.scheduler import determinism_sweep
from tests.test_decoding import _toy
from tests.conftest import TARGET


@pytest.fixture(scope="module")
def setup():
    from models.tokenizer import toy_tokenizer
    from tasks import get_task

    tok = toy_tokenizer()
    model = _toy("target", TARGET)
    exs = get_task("coinflip", fmt="cot", split="heldout").examples(80, seed=99, events=(1, 8))
    ps = [tok(e.prompt)["input_ids"] for e in exs]
    return model, ps[:50], ps[50:]


@pytest.mark.slow
def test_deterministic_requests_identical_across_batches(setup):
    model, prompts, others = setup
    seen = determinism_sweep(model, prompts, others)
    assert max(len(v) for v in seen.values()) == 1
    cfg = SpecConfig(gamma=3, max_new_tokens=12, stop_at_eos=False)
    for i, p in enumerate(prompts):  # and it is the fixed-shape reference output
        assert seen[i] == {tuple(generate(model, p, cfg, window=4).tokens)}


pytestmark = pytest.mark.usefixtures("one_thread")
