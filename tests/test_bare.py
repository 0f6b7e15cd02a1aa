"""The bare HF tree under a bridge (models.bare): which forwards run it, and that it stays the model.

Reference: an untouched deep copy of the same HF model (logits bit for bit), and the bridge's own
wrapped path for what only TransformerLens computes."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from beliefscope.hooks import capture
from beliefscope.models.bare import bare_model, runnable
from beliefscope.models.bridge import build_bridge

X = torch.tensor([[5, 9, 2, 7, 7, 1, 3]])


@pytest.fixture
def pair():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    hf = LlamaForCausalLM(cfg).eval()
    ref = copy.deepcopy(hf)
    return build_bridge(hf).eval(), ref


def wrapped_logits(bridge, x):
    """The bridge's wrapped path: a TransformerLens hook that changes nothing forces it."""
    with torch.no_grad():
        return bridge.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_attn_out", lambda act, hook: None)])


def test_an_unhooked_bridge_forward_is_hf_bit_for_bit_and_a_tl_hook_runs_the_wrappers(pair):
    bridge, ref = pair
    with torch.no_grad():
        want = ref(X).logits
        assert runnable(bridge) is bare_model(bridge.original_model)
        assert torch.equal(bridge(X), want)
        fired = []
        got = bridge.run_with_hooks(X, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda a, hook: fired.append(a))])
        assert fired and fired[0].shape == (1, 4, X.shape[1], X.shape[1])  # only the wrappers compute it
        assert (got - want).abs().max() < 1e-5
        assert runnable(bridge) is bare_model(bridge.original_model)  # the hook is gone: bare again
        logits, cache = bridge.run_with_cache(X)
        assert cache["blocks.1.attn.hook_pattern"].shape == (1, 4, X.shape[1], X.shape[1])
        assert (logits - want).abs().max() < 1e-5


def test_a_torch_hook_on_a_wrapper_runs_the_wrappers_and_one_on_a_hf_module_stays_bare(pair):
    bridge, ref = pair
    seen = []
    h = bridge.blocks[0].register_forward_hook(lambda m, a, out: seen.append("wrapper"))
    assert runnable(bridge) is bridge.original_model
    with torch.no_grad():
        bridge(X)
    h.remove()
    assert seen == ["wrapper"]
    layer = bridge.blocks[0].original_component  # the HF decoder layer: in both trees
    h = layer.register_forward_hook(lambda m, a, out: seen.append("hf layer"))
    assert runnable(bridge) is bare_model(bridge.original_model)
    with torch.no_grad():
        assert torch.equal(bridge(X), ref(X).logits)
    h.remove()
    assert seen == ["wrapper", "hf layer"]


def test_a_swapped_module_rebuilds_the_bare_tree(pair):
    bridge, _ = pair
    before = bare_model(bridge.original_model)
    unembed = bridge.original_model.lm_head  # a wrapper; its HF Linear is what the bare tree calls
    zero = torch.nn.Linear(32, 40, bias=False)
    torch.nn.init.zeros_(zero.weight)
    unembed._original_component = zero
    with torch.no_grad():
        assert bare_model(bridge.original_model) is not before
        assert torch.equal(bridge(X), torch.zeros(1, X.shape[1], 40))
        assert torch.equal(wrapped_logits(bridge, X), torch.zeros(1, X.shape[1], 40))


def test_dtype_device_moves_and_copies_follow_the_bridge(pair):
    bridge, ref = pair
    _ = bare_model(bridge.original_model)  # built before the move
    bridge.to(torch.float64)
    with torch.no_grad():
        assert torch.equal(bridge(X), ref.to(torch.float64)(X).logits)
    half = copy.deepcopy(bridge.original_model).to(torch.bfloat16)  # the scheduler's fast-path copy
    assert next(bare_model(half).parameters()).dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in bare_model(half).parameters())
    assert not any(p is q for p, q in zip(bare_model(half).parameters(), bridge.original_model.parameters()))


def test_train_mode_follows_and_tl_only_modes_run_the_wrappers(pair):
    bridge, ref = pair
    bridge.train()
    assert runnable(bridge).training and all(m.training for m in runnable(bridge).modules())
    bridge.eval()
    assert not any(m.training for m in runnable(bridge).modules())
    with torch.no_grad(), capture(bridge, ["blocks.0.hook_resid_post"]) as cap:
        resid = bridge(X, stop_at_layer=1)  # TransformerLens's own mode: the wrappers stop the forward
    assert torch.equal(resid, cap.stacked("blocks.0.hook_resid_post"))
    assert runnable(bridge) is bare_model(bridge.original_model)
    bridge.compatibility_mode = True
    assert runnable(bridge) is bridge.original_model
    bridge.compatibility_mode = False


def test_steering_a_resid_hook_on_the_bare_tree_equals_steering_through_transformerlens(pair):
    from beliefscope.hooks.capture import steer

    bridge, _ = pair
    d = torch.randn(32)
    with torch.no_grad(), steer(bridge, 0, d, alpha=2.0):
        assert runnable(bridge) is bare_model(bridge.original_model)
        got = bridge(X)
        tl = bridge.run_with_hooks(X, fwd_hooks=[("blocks.0.hook_resid_post", lambda a, hook: a)])  # wrapped
    assert (got - tl).abs().max() < 1e-5
    with torch.no_grad():
        plain = bridge(X)
    assert (got - plain).abs().max() > 1e-2  # the steer changed the logits


def test_hf_generate_on_the_bridged_model_runs_bare_and_its_scores_are_hf_bit_for_bit(pair):
    bridge, ref = pair
    kw = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        ours = bridge.original_model.generate(X, attention_mask=torch.ones_like(X), **kw)
        theirs = ref.generate(X, attention_mask=torch.ones_like(X), **kw)
        assert torch.equal(ours.sequences, theirs.sequences)
        assert all(torch.equal(a, b) for a, b in zip(ours.scores, theirs.scores))  # the wrappers round differently
        with bridge.hooks(fwd_hooks=[("blocks.0.hook_attn_out", lambda act, hook: None)]):
            hooked = bridge.original_model.generate(X, attention_mask=torch.ones_like(X), **kw)
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
    from beliefscope.models.bare import last_logits_only

    bridge, ref = pair
    assert last_logits_only(runnable(bridge)) == {"logits_to_keep": 1}
    got = hf_logits(bridge, X, last_only=True)  # [1, 1, vocab]
    assert got.shape == (1, 1, 40)
    with torch.no_grad():
        assert torch.equal(got, ref(X, logits_to_keep=1).logits.float())
        assert torch.allclose(got[:, -1], ref(X).logits[:, -1], atol=1e-5)
    seen = []
    handle = bare_model(bridge.original_model).lm_head.register_forward_hook(lambda m, a, out: seen.append(out.shape))
    try:
        assert last_logits_only(runnable(bridge)) == {}
        hf_logits(bridge, X, last_only=True)
    finally:
        handle.remove()
    assert seen == [torch.Size([1, 7, 40])]  # the watched output layer saw every position
    with bridge.hooks(fwd_hooks=[("unembed.hook_out", lambda act, hook: None)]):  # the wrapped tree runs
        assert last_logits_only(runnable(bridge)) == {}
    x = X.clone()  # plain greedy by uncached forwards of the untouched copy (HF's generate would suppress EOS)
    with torch.no_grad():
        for _ in range(6):
            x = torch.cat([x, ref(x).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert generate(bridge, X[0].tolist(), SpecConfig(max_new_tokens=6, stop_at_eos=False)).tokens == x[0, 7:].tolist()
