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
    from beliefscope.decoding.slots import prefill_slot, slot_cache, verify_slots

    model = getattr(ct, builder)()
    g = torch.Generator().manual_seed(0)
    prompt, window = [3, 4, 5, 6, 7], torch.tensor([9, 10, 11, 12])
    outs = []
    for slot, others in [(0, []), (2, [1, 3]), (1, [0, 2, 3]), (3, [0])]:
        slots = slot_cache(model, slots=4, capacity=64)
        prefill_slot(slots, model, slot, prompt)
        for o in others:
            prefill_slot(slots, model, o, torch.randint(1, 30, (int(torch.randint(2, 40, (1,), generator=g)),),
                                                  generator=g).tolist())
        x = torch.randint(1, 30, (4, 4), generator=g)  # [B, W]: other rows hold random windows
        x[slot] = window
        outs.append(verify_slots(slots, model, x)[slot])  # [W, vocab]
    full = hf_model(model)(torch.tensor(prompt + window.tolist())[None]).logits[0, -4:]
    assert (outs[0] - full).abs().max() < 1e-5
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_slot_capacity_error_names_the_fix():
    from beliefscope.decoding.scheduler import Request, Scheduler, SchedulerConfig
    from beliefscope.models.testing import tiny_gpt2

    sched = Scheduler(tiny_gpt2(), SchedulerConfig(window=4, slot_capacity=16))
    with pytest.raises(ValueError, match="slot_capacity=16"):
        sched.run([Request(list(range(1, 12)), 8, deterministic=True)])


@pytest.mark.parametrize("kernels", ["fixed-shape", "row-invariant"])
def test_scheduler_slots_record_each_request(kernels):
    """The scheduler's verify slots are a `KVCache`: after a run, a finished deterministic request's slot holds its
    prompt (PREFILL) and its committed tokens but the last (VERIFIED), with the K/V of an uncached forward of them
    (1e-5), and its event log shows the prefill, every verify's write and the rollback of what was rejected."""
    import copy

    import torch

    from beliefscope.cache import Provenance
    from beliefscope.decoding.core import forward, hf_model, new_cache
    from beliefscope.decoding.scheduler import Request, Scheduler, SchedulerConfig
    from beliefscope.models.packed import packing_available
    from beliefscope.models.testing import tiny_gpt2

    if kernels == "row-invariant" and not packing_available():
        pytest.skip("this torch build cannot pack weights (oneDNN)")
    model = tiny_gpt2()
    hf = hf_model(model)
    fast = copy.deepcopy(hf)
    with torch.no_grad():  # a fast path that disagrees now and then: some drafts are rejected
        for p in fast.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
    cfg = SchedulerConfig(window=4, verify_slots=1, max_batch=2, slot_capacity=64, verify_kernels=kernels)
    sched = Scheduler(model, cfg, fast=fast)
    prompt = [3, 4, 5, 6, 7]
    out = sched.run([Request(prompt, 12, deterministic=True), Request([9, 8, 7], 10)])[0]
    slots = sched.slots
    held = len(prompt) + len(out) - 1  # the last token was never fed back
    assert slots.lengths == [held]
    want = [int(Provenance.PREFILL)] * len(prompt) + [int(Provenance.VERIFIED)] * (len(out) - 1)
    assert slots.recorder.provenance_of(0).tolist() == want
    ref = new_cache(model, held)
    forward(model, torch.tensor(prompt + out[:-1]), ref)
    for layer in range(ref.config.n_layers):
        assert (slots.keys(layer, row=0) - ref.keys(layer)).abs().max() < 1e-5
        assert (slots.values(layer, row=0) - ref.values(layer)).abs().max() < 1e-5
    events = slots.recorder.events
    assert (events[0].kind, events[0].start, events[0].end) == ("prefill", 0, len(prompt))
    wrote = [e.end - e.start for e in events if e.kind == "decode"]  # one W-wide write per verify
    cut = [e.end - e.start for e in events if e.kind == "rollback"]
    assert wrote == [cfg.window] * sched.verify_forwards
    assert sum(wrote) - sum(cut) == held - len(prompt)  # what every verify wrote, less what was cut, is kept
    assert [e.row for e in sched.pool.recorder.events if e.kind == "prefill"] == [0, 1]  # the fast path's rows
