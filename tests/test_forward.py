"""What a Runner's forward runs (models.forward, models.runner): the HF model's own forward, with no bridge
built until a hook name needs TransformerLens's wrappers, and through the wrappers from then on.

Reference: an untouched deep copy of the same HF model (logits bit for bit while no bridge is built, within
float rounding through the wrappers), and TransformerLens's own hooks for what only its wrappers compute."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from beliefscope.hooks import capture
from beliefscope.models.forward import forward_module, hf_named_tensors, is_wrapper, last_logits_only
from beliefscope.models.runner import Runner

X = torch.tensor([[5, 9, 2, 7, 7, 1, 3]])


@pytest.fixture
def pair():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    hf = LlamaForCausalLM(cfg).eval()
    ref = copy.deepcopy(hf)
    return Runner(hf), ref


def wrapped(runner) -> bool:
    return any(map(is_wrapper, runner.hf.modules()))


def test_an_unhooked_forward_is_hf_bit_for_bit_and_a_tl_hook_builds_the_bridge_once(pair):
    runner, ref = pair
    with torch.no_grad():
        want = ref(X).logits
        assert torch.equal(runner(X), want) and not runner.built and not wrapped(runner)
        fired = []
        got = runner.run_with_hooks(X, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda a, hook: fired.append(a))])
        assert fired and fired[0].shape == (1, 4, X.shape[1], X.shape[1])  # only the wrappers compute it
        assert runner.built and wrapped(runner) and forward_module(runner) is runner.hf
        assert (got - want).abs().max() < 1e-5
        assert (runner(X) - want).abs().max() < 1e-5  # through the wrappers from now on: float rounding apart
        logits, cache = runner.run_with_cache(X)
        assert cache["blocks.1.attn.hook_pattern"].shape == (1, 4, X.shape[1], X.shape[1])
        assert (logits - want).abs().max() < 1e-5


def test_a_torch_hook_on_a_hf_module_fires_with_no_bridge_and_on_a_wrapper_once_built(pair):
    runner, ref = pair
    seen = []
    layer = runner.hf.model.layers[0]
    h = layer.register_forward_hook(lambda m, a, out: seen.append("hf layer"))
    with torch.no_grad():
        assert torch.equal(runner(X), ref(X).logits)
    h.remove()
    h = runner.blocks[0].register_forward_hook(lambda m, a, out: seen.append("wrapper"))  # builds the bridge
    with torch.no_grad():
        runner(X)
    h.remove()
    assert seen == ["hf layer", "wrapper"]


def test_the_checkpoint_hash_and_hf_names_are_the_same_before_and_after_the_bridge(pair):
    """Building the bridge wraps the modules (their state-dict names change) and registers a zero unembedding
    bias; the HF names read through the wrappers, less what the bridge added, are the untouched model's."""
    from beliefscope.probes.twin import checkpoint_hash

    runner, ref = pair
    before = checkpoint_hash(runner)
    names = set(hf_named_tensors(runner.hf))
    assert names == set(hf_named_tensors(ref)) and checkpoint_hash(ref) == before
    _ = runner.bridge
    assert set(runner.hf.state_dict()) != set(ref.state_dict())  # TransformerLens's names
    assert set(hf_named_tensors(runner.hf)) - runner.bridge_added == names
    assert checkpoint_hash(runner) == before
    with torch.no_grad():
        runner.hf.model.norm.original_component.weight.add_(1.0)
    assert checkpoint_hash(runner) != before  # the bytes count


def test_dtype_moves_and_train_mode_follow_and_tl_only_modes_run_the_bridge(pair):
    runner, ref = pair
    runner.to(torch.float64)
    with torch.no_grad():
        assert torch.equal(runner(X), ref.to(torch.float64)(X).logits)
    runner.to(torch.float32)
    runner.train()
    assert runner.hf.training and all(m.training for m in runner.hf.modules())
    runner.eval()
    assert not any(m.training for m in runner.hf.modules())
    with torch.no_grad(), capture(runner, ["blocks.0.hook_resid_post"]) as cap:
        resid = runner(X, stop_at_layer=1)  # TransformerLens's own mode: the bridge's forward stops it
    assert runner.built and torch.equal(resid, cap.stacked("blocks.0.hook_resid_post"))


def test_steering_a_resid_hook_with_no_bridge_equals_steering_through_transformerlens(pair):
    from beliefscope.hooks.capture import steer

    runner, ref = pair
    twin = Runner(ref)
    d = torch.randn(32)
    with torch.no_grad(), steer(runner, 0, d, alpha=2.0):
        got = runner(X)
        assert not runner.built
    with torch.no_grad(), steer(twin, 0, d, alpha=2.0):
        _ = twin.bridge  # the same steer through TransformerLens's wrappers
        tl = twin.run_with_hooks(X, fwd_hooks=[("blocks.0.hook_resid_post", lambda a, hook: a)])
    assert (got - tl).abs().max() < 1e-5
    with torch.no_grad():
        plain = runner(X)
    assert (got - plain).abs().max() > 1e-2  # the steer changed the logits


def test_hf_generate_on_the_runners_model_is_hf_bit_for_bit(pair):
    runner, ref = pair
    kw = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        ours = runner.hf.generate(X, attention_mask=torch.ones_like(X), **kw)
        theirs = ref.generate(X, attention_mask=torch.ones_like(X), **kw)
        assert torch.equal(ours.sequences, theirs.sequences)
        assert all(torch.equal(a, b) for a, b in zip(ours.scores, theirs.scores))
        with runner.hooks(fwd_hooks=[("blocks.0.hook_attn_out", lambda act, hook: None)]):
            hooked = runner.hf.generate(X, attention_mask=torch.ones_like(X), **kw)
    assert torch.equal(hooked.sequences, theirs.sequences)
    assert max(float((a - b).abs().max()) for a, b in zip(hooked.scores, theirs.scores)) < 1e-4


def test_the_cache_keyword_is_read_once_per_class_and_each_time_for_an_instances_own_forward(pair):
    from beliefscope.models.bridge import cache_kwarg

    _, hf = pair
    # transformers 5.24 renamed the forward's cache keyword to `cache` (past_key_values still works, deprecated)
    import inspect

    takes = inspect.signature(LlamaForCausalLM.forward).parameters
    assert cache_kwarg(hf) == ("cache" if "cache" in takes and "past_key_values" not in takes else "past_key_values")
    hf.forward = lambda input_ids, past_key_values=None: None  # a forward set on the instance (accelerate's dispatch)
    assert cache_kwarg(hf) == "past_key_values"
    hf.forward = lambda input_ids, cache=None: None
    assert cache_kwarg(hf) == "cache"
    del hf.forward
    assert cache_kwarg(hf) == cache_kwarg(copy.deepcopy(hf))


def test_a_prefill_computes_the_last_logits_alone_as_hf_generate_does_unless_the_output_layer_is_watched(pair):
    """`generate`'s prefill reads the last position's logits only; it asks HF for that one row
    (``logits_to_keep=1``, what HF's ``generate`` passes), unless a hook watches the output layer, which then
    sees every position as before. Reference: HF's own forward with and without ``logits_to_keep``."""
    from beliefscope.decoding.config import SpecConfig
    from beliefscope.decoding.core import hf_logits
    from beliefscope.decoding.loop import generate

    bridge, ref = pair
    assert last_logits_only(forward_module(bridge)) == {"logits_to_keep": 1}
    got = hf_logits(bridge, X, last_only=True)  # [1, 1, vocab]
    assert got.shape == (1, 1, 40)
    with torch.no_grad():
        assert torch.equal(got, ref(X, logits_to_keep=1).logits.float())
        assert torch.allclose(got[:, -1], ref(X).logits[:, -1], atol=1e-5)
    seen = []
    handle = bridge.hf.lm_head.register_forward_hook(lambda m, a, out: seen.append(out.shape))
    try:
        assert last_logits_only(forward_module(bridge)) == {}
        hf_logits(bridge, X, last_only=True)
    finally:
        handle.remove()
    assert seen == [torch.Size([1, 7, 40])]  # the watched output layer saw every position
    with bridge.hooks(fwd_hooks=[("unembed.hook_out", lambda act, hook: None)]):  # the wrapped tree runs
        assert last_logits_only(forward_module(bridge)) == {}
    x = X.clone()  # plain greedy by uncached forwards of the untouched copy (HF's generate would suppress EOS)
    with torch.no_grad():
        for _ in range(6):
            x = torch.cat([x, ref(x).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert generate(bridge, X[0].tolist(), SpecConfig(max_new_tokens=6, stop_at_eos=False)).tokens == x[0, 7:].tolist()
