"""Deterministic requests made visible: a fast path whose tokens follow the batch, verified tokens that do not.

The constructed case: a tiny model whose fast path adds a batch-size-dependent perturbation to its
logits (standing in for kernels that round differently at each batch size). Its unverified tokens
then change with the batch composition, which the sweep must detect, while the verified tokens of
the same prompts stay identical and equal to the fixed-shape reference. The real-model case
(slow): SmolLM2's fast-path decode logits for one row differ between batch sizes, while its
verified rows are bit-identical whatever the other slots hold.
"""

import copy

import pytest
import torch

from beliefscope.decoding import SpecConfig, generate
from beliefscope.decoding.scheduler import Request, Scheduler, SchedulerConfig
from beliefscope.decoding.sweep import determinism_sweep
from beliefscope.models.testing import tiny_gpt2, tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")


def batch_dependent(model, scale: float):
    """A copy of ``model``'s HF net whose logits get ``scale`` x a fixed random vector that depends only
    on the batch size (the same for every row of a batch)."""
    from beliefscope.decoding.core import hf_model

    fast = copy.deepcopy(hf_model(model)).eval()

    def hook(module, args, kwargs, out):
        ids = kwargs.get("input_ids", args[0] if args else None)
        g = torch.Generator().manual_seed(int(ids.shape[0]))
        out.logits = out.logits + scale * torch.randn(out.logits.shape[-1], generator=g)
        return out

    fast.register_forward_hook(hook, with_kwargs=True)
    return fast


def _prompts(n, seed=0, vocab=48):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _sweep(model, fast, prompts, pool, deterministic, window=4):
    import beliefscope.decoding.sweep as sweep  # the module whose Scheduler the sweep builds

    real = sweep.Scheduler
    sweep.Scheduler = lambda target, cfg: real(target, cfg, fast=fast)
    try:
        return determinism_sweep(model, prompts, pool, others=(0, 1, 3, 7), orders=3, window=window,
                                 max_new_tokens=16, deterministic=deterministic)
    finally:
        sweep.Scheduler = real


@pytest.mark.slow
@pytest.mark.parametrize("builder", [tiny_gpt2, tiny_llama])
def test_fast_path_diverges_verified_does_not(builder):
    model = builder()
    prompts, pool = _prompts(8), _prompts(8, seed=1)
    with torch.no_grad():
        logits = getattr(model, "original_model", model)(torch.tensor([prompts[0]])).logits
    fast = batch_dependent(model, scale=0.3 * float(logits.std()))
    fast_seen = _sweep(model, fast, prompts, pool, deterministic=False)
    assert max(map(len, fast_seen.values())) > 1  # the sweep sees the batch-dependent fast path
    verified = _sweep(model, fast, prompts, pool, deterministic=True)
    ref = SpecConfig(gamma=3, max_new_tokens=16, stop_at_eos=False)
    for i, p in enumerate(prompts):  # one output per prompt, and it is the fixed-shape reference's
        assert verified[i] == {tuple(generate(model, p, ref, window=4).tokens)}, i


@pytest.mark.parametrize("builder", [tiny_gpt2, tiny_llama])
def test_unperturbed_fast_path_is_plain_greedy(builder):
    """The fast path's KV pool (ragged rows, arrivals, compaction as requests finish) decodes what an
    uncached forward of the whole sequence would: token-exact on tiny models."""
    model = builder()
    hf = getattr(model, "original_model", model)
    prompts = _prompts(6, seed=3)
    reqs = [Request(p, 3 + 2 * i, arrival=i // 2) for i, p in enumerate(prompts)]
    outs = Scheduler(model, SchedulerConfig(max_batch=3, slot_capacity=64)).run(reqs)
    for p, out, r in zip(prompts, outs, reqs):
        seq = list(p)
        for _ in range(r.max_new_tokens):
            seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
        assert out == seq[len(p):]


def test_fixed_shape_mode_and_mixed_shares_agree():
    """window=1 (no fast path, every token from [B, 1]) and the same requests deterministic among others
    give each deterministic request the fixed-shape reference tokens."""
    model = tiny_gpt2()
    prompts = _prompts(5, seed=4)
    for cfg, det in ((SchedulerConfig(window=1, verify_slots=5, max_batch=5, slot_capacity=64), [True] * 5),
                     (SchedulerConfig(window=4, verify_slots=2, max_batch=4, slot_capacity=64), [1, 0, 1, 0, 0])):
        reqs = [Request(p, 10, deterministic=bool(d), arrival=i) for i, (p, d) in enumerate(zip(prompts, det))]
        outs = Scheduler(model, cfg).run(reqs)
        ref = SpecConfig(gamma=max(1, cfg.window - 1), max_new_tokens=10, stop_at_eos=False)
        for p, out, d in zip(prompts, outs, det):
            if d:
                assert out == generate(model, p, ref, window=cfg.window).tokens


# ------------------------------------------------------------------------------ bad input
def test_empty_workload_and_bad_values_are_refused():
    from beliefscope.analyses.determinism import DeterminismConfig, main

    model = tiny_gpt2()
    with pytest.raises(ValueError, match="workload is empty"):
        Scheduler(model).run([])
    with pytest.raises(ValueError, match="workload is empty"):
        determinism_sweep(model, [], [[3, 4]])
    with pytest.raises(ValueError, match="max_batch=0"):
        Scheduler(model, SchedulerConfig(max_batch=0))
    with pytest.raises(ValueError, match="n=0"):
        main(DeterminismConfig(n=0, out=None))
    with pytest.raises(ValueError, match="others='1,-2'"):
        main(DeterminismConfig(n=1, others="1,-2", out=None))


@pytest.mark.slow
def test_verified_outputs_equal_across_the_verify_shape_grid():
    """The W x slots grid (4 x 3 shapes, 4 numbers of co-batched requests, 2 arrival orders): every
    verified prompt gives one output over the whole grid, equal to plain greedy decoding of the
    same model; the grid is validated before the model loads."""
    from beliefscope.analyses.determinism import DeterminismConfig, main
    from beliefscope.models.load import load_model

    model, tok = load_model("target", device="cpu")
    res = main(DeterminismConfig(model="target", n=3, others="0,1,3,7", out=None, max_new_tokens=6,
                                 quick=True, window="1,2,4,8", verify_slots="2,4,8", paths="verified"),
               bridge=model, tok=tok)
    assert res["verified_unique_max"] == 1
    hf = model.original_model
    for prompt, (out,) in zip(res["measured_prompts"], res["outputs"]["verified"], strict=True):
        ids = torch.tensor([prompt])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                          pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
        assert out == ref  # HF's own greedy decoding with its own cache
    assert [(c["window"], c["verify_slots"]) for c in res["verified_by_shape"]] == \
        [(w, b) for w in (1, 2, 4, 8) for b in (2, 4, 8)]
    with pytest.raises(ValueError, match="window='4,x' must be comma-separated integers >= 1"):
        main(DeterminismConfig(model="no-such-model", n=1, window="4,x", out=None))
    with pytest.raises(ValueError, match="verify_slots='0' must be"):
        main(DeterminismConfig(model="no-such-model", n=1, verify_slots="0", out=None))


def test_fast_path_request_too_long_names_slot_capacity():
    sched = Scheduler(tiny_gpt2(), SchedulerConfig(window=4, slot_capacity=16))
    with pytest.raises(ValueError, match="fast-path pool row.*slot_capacity=16"):
        sched.run([Request(list(range(1, 10)), 8)])


# ------------------------------------------------------------------------------ the real model
@pytest.mark.slow
def test_smollm2_fast_logits_follow_the_batch_verified_rows_do_not(smollm2):
    """Measured on this CPU (float32, 1 thread): one row's decode logits alone vs in batches of 2..8
    differ (~1e-5); a verified row is bit-identical whatever the other slots hold."""
    from beliefscope.decoding.slots import slot_cache, verify_slots

    bridge, tok = smollm2
    hf = bridge.original_model
    rows = [tok(t)["input_ids"] for t in ("The capital of France is", "def add(a, b):", "Once upon a time",
                                           "import numpy as np", "Water boils at", "The quick brown fox",
                                           "SELECT * FROM", "In 1492,")]
    n = max(map(len, rows))
    step = {}
    for b in (1, 2, 8):
        pool = slot_cache(hf, b, n + 4)
        for i, p in enumerate(rows[:b]):
            verify_slots(pool, hf, torch.tensor([p]), rows=range(i, i + 1), span=len(p))
        x = torch.tensor([[p[-1]] for p in rows[:b]])
        span = max(pool.layout.lengths[:b]) + 1
        step[b] = verify_slots(pool, hf, x, rows=range(b), span=span)[0, -1]  # row 0, [vocab]
    assert (step[1] - step[2]).abs().max() > 0 or (step[1] - step[8]).abs().max() > 0
    assert max((step[1] - step[b]).abs().max() for b in (2, 8)) < 1e-3
    outs = []
    for other in ([], rows[1:4], rows[4:7]):
        slots = slot_cache(hf, 4, n + 8)
        for i, p in enumerate([rows[0], *other]):
            verify_slots(slots, hf, torch.tensor([p]), rows=range(i, i + 1), span=len(p))
        x = torch.full((4, 4), 0)
        x[0] = torch.tensor(tok(" and")["input_ids"][:1] * 4)
        outs.append(verify_slots(slots, hf, x)[0])
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.slow
def test_smollm2_row_invariant_verify_keeps_its_bits(smollm2):
    """SmolLM2 (GQA, 30 layers): a row verified by the row-invariant copy has the same logit bits alone
    and beside 3 rows of other prompts, and its 4-token window has the bits of 4 one-token verifies."""
    from beliefscope.decoding.slots import prefill_slot, slot_cache, verify_rows
    from beliefscope.models.invariant_attention import row_invariant_copy
    from beliefscope.models.packed import packing_available

    if not packing_available():
        pytest.skip("this torch build cannot pack weights (oneDNN)")
    bridge, tok = smollm2
    hf = bridge.original_model
    twin = row_invariant_copy(hf)
    prompts = [tok(t)["input_ids"] for t in ("The capital of France is", "def add(a, b):", "Once upon a time, in",
                                              "SELECT * FROM")]
    window = torch.tensor([tok(" Paris, and the")["input_ids"][:4]])  # [1, 4]

    def verify(rows, w=4):
        slots = slot_cache(hf, 4, 64)
        for r, p in zip(rows, prompts, strict=False):
            prefill_slot(slots, twin, r, p)
        x = torch.cat([window, torch.randint(100, 5000, (len(rows) - 1, 4))])[:, :w]
        return slots, verify_rows(slots, twin, x, rows)[0]  # [w, vocab]

    _, alone = verify([0])
    _, crowded = verify([2, 0, 1, 3])
    assert torch.equal(alone, crowded)
    slots, first = verify([0], w=1)
    steps = [first]
    for i in range(1, 4):  # each verify appends its token to the row
        steps.append(verify_rows(slots, twin, window[:, i: i + 1], [0])[0])
    assert torch.equal(torch.cat(steps), alone)
    full = hf(torch.tensor([prompts[0] + window[0].tolist()])).logits[0, -4:]
    assert (alone - full).abs().max() < 1e-3
