"""Compiled decoding (`decoding.graphed`, ``SpecConfig(compile=True)``) against the eager path.

The recorded forward is checked in ``static`` mode: the fixed-shape forward a CUDA graph records, run
as it is (so the tests need neither a GPU nor a compiler); one test compiles it with ``torch.compile``.
The CUDA graph itself runs in `beliefscope.benchmarks.gpu_session` on a GPU machine."""

import copy
import math
from dataclasses import replace

import pytest
import torch

from beliefscope.cache import KVCache
from beliefscope.decoding import SpecConfig, make_drafter, speculative_generate
from beliefscope.decoding.core import hf_logits
from beliefscope.decoding.graphed import GraphedForward
from beliefscope.decoding.loop import generate
from beliefscope.decoding.tree import TreeConfig
from beliefscope.hooks import capture
from beliefscope.models.testing import tiny_gpt2, tiny_llama


@pytest.fixture
def static(monkeypatch):
    monkeypatch.setattr(GraphedForward, "cpu_mode", "static")


def _events(cache):
    """The event log and every position's provenance label."""
    return [tuple(e) for e in cache.recorder.events], cache.recorder.provenance.tolist()


@pytest.mark.parametrize("make", [tiny_gpt2, tiny_llama])
def test_compiled_plain_greedy_equals_eager_tokens_events_and_cache(static, make):
    model = make()
    cfg = SpecConfig(max_new_tokens=12, stop_at_eos=False)
    eager = generate(model, [3, 4, 5, 6], cfg)
    comp = generate(model, [3, 4, 5, 6], replace(cfg, compile=True))
    assert comp.compiled == "static"
    assert comp.tokens == eager.tokens
    assert _events(comp.cache) == _events(eager.cache)
    n = eager.cache.seq_len
    assert comp.cache.seq_len == n
    for layer in range(eager.cache.config.n_layers):  # the K/V the replays wrote, against the eager forwards'
        torch.testing.assert_close(comp.cache.storage.k[layer][:, :, :n], eager.cache.storage.k[layer][:, :, :n])
        torch.testing.assert_close(comp.cache.storage.v[layer][:, :, :n], eager.cache.storage.v[layer][:, :, :n])


def test_compiled_chain_equals_eager_with_rollbacks_recorded(static):
    model = tiny_llama()
    cfg = SpecConfig(gamma=3, max_new_tokens=16, stop_at_eos=False, keep_rejected=True)
    prompt = [4, 5, 4, 5, 4, 5, 4]
    eager = speculative_generate(model, make_drafter("ngram:2", model), prompt, cfg)
    comp = speculative_generate(model, make_drafter("ngram:2", model), prompt, replace(cfg, compile=True))
    assert comp.compiled == "static"
    assert (comp.tokens, comp.accepted_per_step) == (eager.tokens, eager.accepted_per_step)
    assert _events(comp.cache) == _events(eager.cache)
    assert any(e.kind == "rollback" for e in comp.cache.recorder.events)
    spans = lambda c: [(r.row, r.start, r.end, r.step, r.provenance.tolist()) for r in c.recorder.rejected]
    assert spans(comp.cache) == spans(eager.cache) and spans(comp.cache)
    # the rejected drafts' K/V, kept by the rollback
    for a, b in zip(comp.cache.recorder.rejected, eager.cache.recorder.rejected):
        torch.testing.assert_close(a.keys, b.keys)


def test_replay_of_ragged_rows_equals_eager_forward(static):
    """Two rows of different lengths (a rollback of one): the recorded forward's mask and positions give
    the eager forward's logits, twice (the second is a replay of the first recording)."""
    model = tiny_llama()
    prompt = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]])

    def prefilled():
        cache = KVCache.for_model(model, batch=2, capacity=32)
        hf_logits(model, prompt, past_key_values=cache)
        cache.rollback(3, row=1)
        return cache

    eager_cache, comp_cache = prefilled(), prefilled()
    runner = GraphedForward(model, comp_cache)
    assert runner.why_not is None
    for step in ([[13], [14]], [[15], [16]]):
        x = torch.tensor(step)
        want = hf_logits(model, x, **eager_cache.forward_kwargs(1))
        got = runner.logits(x)
        torch.testing.assert_close(got, want)
    assert runner.replays == 2 and len(runner.recordings) == 1
    assert comp_cache.lengths == eager_cache.lengths == [7, 5]


def test_compile_runs_eagerly_and_says_why_for_hooks_and_trees(static):
    model = tiny_llama()
    cfg = SpecConfig(max_new_tokens=6, stop_at_eos=False, compile=True)
    eager = generate(model, [3, 4, 5], replace(cfg, compile=False))
    with capture(model, ["blocks.0.hook_resid_post"]):
        hooked = generate(model, [3, 4, 5], cfg)
    assert hooked.compiled.startswith("eager: hooks on the model") and hooked.tokens == eager.tokens
    tree = speculative_generate(model, make_drafter("ngram:2", model), [4, 5, 4, 5, 4],
                                replace(cfg, tree=TreeConfig(nodes=4)))
    assert tree.compiled.startswith("eager: TreeStep")


def test_recordings_follow_the_cache_when_its_buffers_change(static):
    """A cache that grows gets new buffers: the old recordings are dropped, and the next replay writes the new
    ones (its logits equal the eager forward's)."""
    model = tiny_gpt2()
    eager_cache = KVCache.for_model(model, batch=1, capacity=4)
    comp_cache = KVCache.for_model(model, batch=1, capacity=4)
    prompt = torch.tensor([[3, 4, 5]])
    hf_logits(model, prompt, past_key_values=eager_cache)
    hf_logits(model, prompt, past_key_values=comp_cache)
    runner = GraphedForward(model, comp_cache)
    first = comp_cache.storage.k[0]
    for tok in (6, 7, 8):  # the cache grows past 4 positions
        x = torch.tensor([[tok]])
        torch.testing.assert_close(runner.logits(x), hf_logits(model, x, past_key_values=eager_cache))
    assert comp_cache.storage.k[0] is not first and len(runner.recordings) == 1


def test_torch_compile_on_the_cpu_gives_the_eager_tokens():
    model = tiny_llama()
    cfg = SpecConfig(max_new_tokens=8, stop_at_eos=False)
    comp = generate(model, [3, 4, 5, 6], replace(cfg, compile=True))
    assert comp.compiled == "torch.compile"
    assert comp.tokens == generate(model, [3, 4, 5, 6], cfg).tokens


def test_overhead_bench_names_what_ran_and_gives_no_ratio_for_an_eager_fallback(static):
    from beliefscope.benchmarks import overhead
    from beliefscope.models.profile import decoder_layers

    bridge, _ = overhead.tiny_bridge()
    cfg = replace(overhead.QUICK, compiled=True, repeats=1)
    out = overhead.bench_model(bridge, "tiny", (1, 8), cfg)
    assert out["compiled_mode"] == "static" and out["generate"]["compiled_ratio"] > 0
    assert out["compiled_tokens_equal_ours"]
    handle = decoder_layers(bridge.original_model)[0].register_forward_hook(lambda *a: None)  # a user's hook
    try:
        out = overhead.bench_model(bridge, "tiny", (1, 8), cfg)
    finally:
        handle.remove()
    assert out["compiled_mode"].startswith("eager: hooks on the model")
    assert out["generate"]["compiled_ratio"] is None


@pytest.mark.parametrize("make", [tiny_gpt2, tiny_llama])
def test_scheduler_with_replayed_fast_rounds_and_verifies_gives_the_eager_scheduler_outputs(monkeypatch, make):
    """The scheduler's fast rounds (one recording per batch size, over the whole capacity) and fixed-shape
    verifies, replayed: every request's tokens, the batch sizes and the verify count are the eager run's; a
    second run reuses the recordings."""
    from beliefscope.decoding.graphed import SlotReplays
    from beliefscope.decoding.scheduler import Scheduler, SchedulerConfig
    from beliefscope.decoding.sweep import sweep_workload

    monkeypatch.setattr(SlotReplays, "cpu_mode", "static")
    model = make()
    cfg = SchedulerConfig(window=3, verify_slots=4, max_batch=4, slot_capacity=48, verify_kernels="fixed-shape")

    def workload():
        return sweep_workload([[3, 4, 5], [7, 8], [9, 10, 11, 12], [13, 14]], [[20, 21, 22], [23, 24]], k=3,
                              order=2, max_new_tokens=10, deterministic=True, n_others=3)

    eager = Scheduler(model, cfg)
    want = eager.run(workload())
    comp = Scheduler(model, replace(cfg, compile=True))
    assert comp.run(workload()) == want
    assert comp.compiled == "static" and set(comp.replays) == {"fast", "verify"}
    assert (dict(comp.batch_sizes), comp.verify_forwards) == (dict(eager.batch_sizes), eager.verify_forwards)
    for name in ("slots", "pool"):  # a replay's bookkeeping (cache.slots.begin_replay) is the eager forward's
        a, b = getattr(eager, name), getattr(comp, name)
        assert a.lengths == b.lengths, name
        assert [(e.kind, e.row, e.start, e.end) for e in a.recorder.events] == \
            [(e.kind, e.row, e.start, e.end) for e in b.recorder.events], name
        for row, n in enumerate(a.lengths):
            assert torch.equal(a.recorder.provenance_of(row), b.recorder.provenance_of(row))
            if n and name == "slots":  # what a row holds: the same K/V (float32 on the CPU: the same bits)
                assert torch.equal(a.keys(0, row=row), b.keys(0, row=row)), (name, row)
    recorded = {k: len(r.recordings) for k, r in comp.replays.items()}
    assert comp.run(workload()) == want
    assert {k: len(r.recordings) for k, r in comp.replays.items()} == recorded


def test_a_hook_attached_mid_run_runs_eagerly_and_fires_then_replays_resume(static):
    """Replays skip Python hooks, so a hook attached after the runner was built is seen at the next forward
    (PyTorch's hook counter moved): that forward runs eagerly and the hook fires; once it is removed, the
    forwards replay again. Every logit equals the eager forward's."""
    from beliefscope.models.profile import decoder_layers

    model = tiny_llama()
    eager_cache, comp_cache = (KVCache.for_model(model, batch=1, capacity=32) for _ in range(2))
    prompt = torch.tensor([[3, 4, 5]])
    hf_logits(model, prompt, past_key_values=eager_cache)
    hf_logits(model, prompt, past_key_values=comp_cache)
    runner = GraphedForward(model, comp_cache)
    seen = []

    def step(tok):
        x = torch.tensor([[tok]])
        torch.testing.assert_close(runner.logits(x), hf_logits(model, x, past_key_values=eager_cache))

    step(6)
    handle = decoder_layers(model.original_model)[0].register_forward_hook(lambda *a: seen.append(1))
    step(7)
    assert runner.eager == 1 and runner.why_not.startswith("hooks on the model") and len(seen) == 2  # both caches
    handle.remove()
    step(8)
    assert runner.why_not is None and runner.replays == 2 and runner.eager == 1


def test_one_sweep_scheduler_serves_every_batch_limit_and_both_paths(monkeypatch):
    """A determinism sweep keeps one scheduler (its slot caches and recordings) for every k and, through
    ``schedulers``, for the fast and verified sweeps alike: each prompt's outputs equal a sweep with a fresh,
    exactly sized scheduler per k, replayed or eager; fewer recordings are made; a run above the scheduler's
    limit is refused by name."""
    from beliefscope.decoding.graphed import SlotReplays
    from beliefscope.decoding.sweep import determinism_sweep

    monkeypatch.setattr(SlotReplays, "cpu_mode", "static")
    model = tiny_llama()
    prompts, pool = [[3, 4, 5], [7, 8], [9, 10, 11, 12]], [[20, 21, 22], [23, 24], [25, 26, 27], [28, 29]]
    kw = dict(orders=2, window=3, max_new_tokens=8, slot_capacity=40, verify_slots=4)
    shared = {}
    for flag in (False, True):
        for compile in (False, True):
            fresh = {}
            for k in (0, 1, 3):  # the old way: a scheduler sized k + 1 per k
                for i, v in determinism_sweep(model, prompts, pool, others=(k,), deterministic=flag, compile=compile,
                                              **kw).items():
                    fresh.setdefault(i, set()).update(v)
            kept = determinism_sweep(model, prompts, pool, others=(0, 1, 3), deterministic=flag, compile=compile,
                                     schedulers=shared, max_batch=4, **kw)
            assert kept == fresh, (flag, compile)
    assert len(shared) == 2  # one per configuration (eager, replayed), both paths through each
    replayed = next(s for s in shared.values() if s.cfg.compile)
    assert len(replayed.replays["fast"].recordings) <= 4  # batch sizes 1..4, recorded once for every k and path
    with pytest.raises(ValueError, match=r"max_batch=5 for this run must be in \[1, 4\]"):
        replayed.run([], max_batch=5)
    with pytest.raises(ValueError, match="max_batch=2 is below the largest batch of this sweep"):
        determinism_sweep(model, prompts, pool, others=(3,), max_batch=2, **kw)


def test_compiled_bfloat16_greedy_parts_from_eager_only_at_rounding_ties(static):
    """A replayed step attends over the cache's whole capacity (masked), the eager one over the filled length,
    so in bfloat16 greedy may part; where it does, both tokens' logits in a full forward are within two
    bfloat16 steps of the top one (a rounding tie, not a wrong mask). In float32 every token is equal."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from beliefscope.models.runner import Runner

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=8192, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.05, max_position_embeddings=256)
    hf = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 8192, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
               for _ in range(12)]
    eager, replayed = (SpecConfig(max_new_tokens=24, stop_at_eos=False, compile=c) for c in (False, True))
    for dtype in (torch.float32, torch.bfloat16):
        model = Runner(copy.deepcopy(hf).to(dtype)).eval()
        parted = 0
        for p in prompts:
            a, b = generate(model, p, eager).tokens, generate(model, p, replayed)
            assert b.compiled == "static"
            d = next((i for i, (x, y) in enumerate(zip(a, b.tokens)) if x != y), None)
            if d is None:
                continue
            assert dtype == torch.bfloat16, f"float32 replay parted from eager at new token {d}"
            parted += 1
            with torch.no_grad():
                logits = model.original_model(torch.tensor([p + a[:d]])).logits[0, -1].float()  # [vocab]
            top = float(logits.max())
            step = 2.0 ** (math.floor(math.log2(abs(top))) - 7)  # one bfloat16 step at that magnitude
            assert top - float(logits[a[d]]) <= 2 * step and top - float(logits[b.tokens[d]]) <= 2 * step
        if dtype == torch.bfloat16:
            assert parted >= 1  # this seed parts (4 of 12): the bound above was exercised
