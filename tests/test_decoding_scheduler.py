"""Deterministic requests: identical verified output across batch compositions and arrival orders."""

import pytest

from beliefscope.decoding import SpecConfig, generate
from beliefscope.decoding.sweep import determinism_sweep

from .helpers import TARGET, toy_hf


@pytest.fixture(scope="module")
def setup():
    from beliefscope.models.tokenizer import toy_tokenizer
    from beliefscope.tasks import get_task

    tok = toy_tokenizer()
    model = toy_hf("target", TARGET)
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


@pytest.mark.parametrize("builder", ["tiny_gpt2", "tiny_llama"])
def test_slot_verify_exact_and_batch_invariant(builder):
    """A row's verified logits equal an uncached forward (1e-5) and are bit-identical whatever slot it
    sits in and whatever the other slots hold (contents and lengths)."""
    import torch

    import beliefscope.models.testing as ct
    from beliefscope.decoding.core import hf_model
    from beliefscope.decoding.slots import SlotCache

    model = getattr(ct, builder)()
    g = torch.Generator().manual_seed(0)
    prompt, window = [3, 4, 5, 6, 7], torch.tensor([9, 10, 11, 12])
    outs = []
    for slot, others in [(0, []), (2, [1, 3]), (1, [0, 2, 3]), (3, [0])]:
        slots = SlotCache.for_model(model, slots=4, capacity=64)
        slots.prefill(model, slot, prompt)
        for o in others:
            slots.prefill(model, o, torch.randint(1, 30, (int(torch.randint(2, 40, (1,), generator=g)),),
                                                  generator=g).tolist())
        x = torch.randint(1, 30, (4, 4), generator=g)  # [B, W]: other rows hold random windows
        x[slot] = window
        outs.append(slots.verify(model, x)[slot])  # [W, vocab]
    full = hf_model(model)(torch.tensor(prompt + window.tolist())[None]).logits[0, -4:]
    assert (outs[0] - full).abs().max() < 1e-5
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_slot_capacity_error_names_the_fix():
    from beliefscope.decoding.scheduler import Request, Scheduler, SchedulerConfig
    from beliefscope.models.testing import tiny_gpt2

    sched = Scheduler(tiny_gpt2(), SchedulerConfig(window=4, slot_capacity=16))
    with pytest.raises(ValueError, match="slot_capacity=16"):
        sched.run([Request(list(range(1, 12)), 8, deterministic=True)])
