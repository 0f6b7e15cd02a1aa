"""The architecture matrix (tests/architectures.py): 14 decoder families, tiny random models built from
configs with the shipped tokenizer, each checked against HF's own logits, HF's own cache under HF's
own ``generate``, an uncached recompute and recompute greedy; the sliding-window families (Gemma2,
Mistral, Phi-3) with a window shorter than the stories. What a bridge cannot compute is refused by name.
Run ``python -m tests.architectures`` for the table."""

from functools import lru_cache

import pytest
import torch

from .architectures import CHECKS, built, configs, make_hf, story_ids

pytestmark = pytest.mark.usefixtures("one_thread")


@lru_cache(maxsize=1)
def bridge_of(arch):
    return built(arch)


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("arch", list(configs()))
def test_matrix(arch, check):
    bridge, ref = bridge_of(arch)
    CHECKS[check](arch, bridge, ref)


@pytest.mark.parametrize("arch", ["Mistral (sliding)", "Gemma2 (sliding)"])
def test_sliding_window_fork_needs_the_window(arch):
    """The fork check fails without the window in the cache's masks (the test can fail): the branch's
    2D mask lets HF measure windows in physical slots, across the hole the fork leaves."""
    from beliefscope.cache import KVCache
    from beliefscope.models.runner import Runner

    hf = make_hf(arch)
    ref = make_hf(arch)
    bridge = Runner(hf)
    ids = story_ids(12)
    at = len(ids) - 12
    replay = torch.tensor([ids[at:][::-1]])
    with torch.no_grad():
        full = ref(torch.cat([torch.tensor([ids[:at]]), replay], 1)).logits[:, at:]
        gaps = []
        for windows in (None, "model"):
            kw = {} if windows == "model" else {"windows": None}
            cache = KVCache.for_model(bridge, capacity=64, **kw)
            bridge(torch.tensor([ids]), past_key_values=cache, return_type="logits")
            with cache.fork(at=at) as branch:
                got = bridge(replay, return_type="logits", **branch.forward_kwargs(12))
            gaps.append((got - full).abs().max().item())
    assert gaps[0] > 1e-2 and gaps[1] < 1e-4, gaps


def test_falcon_new_architecture_refused_by_name():
    """A config TransformerLens 4.3 cannot bridge is refused with the class name, not a raw traceback, when a
    hook name first needs the bridge (the Runner runs the HF model itself until then)."""
    from transformers import FalconConfig, FalconForCausalLM

    from beliefscope.models.load import ModelLoadError
    from beliefscope.models.runner import Runner

    torch.manual_seed(0)
    hf = FalconForCausalLM(FalconConfig(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        new_decoder_architecture=True, num_kv_heads=2))
    runner = Runner(hf)
    with pytest.raises(ModelLoadError, match="FalconForCausalLM"):
        runner.bridge


@pytest.mark.parametrize("arch", ["Mistral (sliding)", "Gemma2 (sliding)", "Llama"])
def test_scheduler_slots_keep_the_window(arch):
    """Deterministic requests among others on a sliding-window model: one output per prompt across
    batch compositions, equal to recompute greedy (the slots' fixed-shape masks slide too)."""
    from beliefscope.decoding.sweep import determinism_sweep

    from .architectures import recompute_greedy

    bridge, ref = bridge_of(arch)
    prompts = [story_ids(6, seed=s) for s in range(3)]
    others = [story_ids(3, seed=10 + s) for s in range(3)]
    seen = determinism_sweep(bridge, prompts, others, others=(0, 2), orders=2, max_new_tokens=10)
    for i, p in enumerate(prompts):
        assert seen[i] == {tuple(recompute_greedy(ref, p, 10))}, (arch, i, seen[i])


def test_row_invariant_verify_is_refused_on_sliding_windows_and_auto_avoids_it():
    """The row-invariant verify reads every key of a row, so a sliding-window model gets the
    fixed-shape verify under "auto" and a clear refusal when it is asked for by name."""
    from beliefscope.decoding.scheduler import Scheduler, SchedulerConfig

    bridge, _ = bridge_of("Mistral (sliding)")
    assert Scheduler(bridge, SchedulerConfig()).verify_kernels == "fixed-shape"
    with pytest.raises(ValueError, match="sliding-window layers: use verify_kernels='fixed-shape'"):
        Scheduler(bridge, SchedulerConfig(verify_kernels="row-invariant"))
