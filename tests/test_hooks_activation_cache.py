"""Captures converted to TransformerLens ActivationCache: TL's own accumulated_resid, decompose_resid and
stack_activation on a converted capture equal the same calls on bridge.run_with_cache's cache."""

import pytest
import torch

from beliefscope.cache import KVCache
from beliefscope.hooks import capture, decomposition_hooks, to_activation_cache
from beliefscope.models.testing import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=["target", "llama"])
def model_and_tokens(request, target):
    if request.param == "target":
        bridge, tok = target
        ids = tok("A coin is heads . Alice flips . Bob stays . Carol flips . State ?", return_tensors="pt").input_ids
    else:
        bridge = tiny_llama()
        ids = torch.randint(3, 50, (2, 11), generator=torch.Generator().manual_seed(0))
    return bridge, ids  # ids: [batch, T]


def tl_calls(cache):
    """TL's own methods, each as {label: tensor}."""
    acc, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    return {
        "accumulated_resid": cache.accumulated_resid(),
        "accumulated_resid(incl_mid)": acc,
        "accumulated_resid(apply_ln)": cache.accumulated_resid(apply_ln=True),
        "decompose_resid": cache.decompose_resid(),
        "stack_activation(resid_post)": cache.stack_activation("resid_post"),
        "stack_activation(mlp_out)": cache.stack_activation("mlp_out"),
    }, labels


def test_one_forward_converts_and_tl_methods_match_run_with_cache(model_and_tokens):
    bridge, ids = model_and_tokens
    with torch.no_grad():
        _, ref_cache = bridge.run_with_cache(ids)
        with capture(bridge, decomposition_hooks(bridge)) as cap:
            bridge(ids)
    ours, labels = tl_calls(cap.to_activation_cache(bridge))
    ref, ref_labels = tl_calls(ref_cache)
    assert labels == ref_labels
    for k in ref:
        assert ours[k].shape == ref[k].shape, k
        assert (ours[k] - ref[k]).abs().max() <= 1e-6, (k, float((ours[k] - ref[k]).abs().max()))
    L = bridge.cfg.n_layers
    assert ours["accumulated_resid"].shape[:2] == (L + 1, ids.shape[0])


def test_cached_decode_stacked_equals_uncached_run_with_cache(model_and_tokens):
    """Prefill + one token per forward through a KVCache; the capture's positions are absolute, so the
    stacked conversion is the whole sequence, as one uncached forward would see it."""
    bridge, ids = model_and_tokens
    T, p = ids.shape[1], 6
    cache = KVCache.for_model(bridge, batch=ids.shape[0], capacity=32)
    with torch.no_grad():
        _, ref_cache = bridge.run_with_cache(ids)
        with capture(bridge, decomposition_hooks(bridge), cache=cache) as cap:
            bridge(ids[:, :p], past_key_values=cache)
            for t in range(p, T):
                bridge(ids[:, t:t + 1], past_key_values=cache)
    name = "blocks.0.hook_resid_post"
    assert [r.positions.tolist() for r in cap.records[name]] == [list(range(p)), *([t] for t in range(p, T))]
    with pytest.raises(ValueError, match=f"holds {T - p + 1} forwards per hook; choose one with forward=i"):
        to_activation_cache(cap, bridge)
    last = to_activation_cache(cap, bridge, forward=-1).accumulated_resid()  # [L + 1, batch, 1, d]
    full = to_activation_cache(cap, bridge, stacked=True).accumulated_resid()  # [L + 1, batch, T, d]
    want = ref_cache.accumulated_resid()
    assert full.shape == want.shape and (full - want).abs().max() < 1e-5
    assert (last[:, :, 0] - want[:, :, -1]).abs().max() < 1e-5


def test_tags_select_records_and_gaps_are_refused():
    """Draft tokens written then rolled back, and the verified ones written over them: the stacked
    conversion of the verified records is the committed sequence."""
    bridge = tiny_llama()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])  # [1, 6]
    wrong = torch.tensor([[11, 12]])
    cache = KVCache.for_model(bridge, capacity=16)
    with torch.no_grad():
        _, ref_cache = bridge.run_with_cache(ids)
        with capture(bridge, decomposition_hooks(bridge), cache=cache) as cap:
            cap.tags = {"pass": "verify"}
            bridge(ids[:, :4], past_key_values=cache)
            cap.tags = {"pass": "draft"}
            bridge(wrong, past_key_values=cache)
            cache.rollback(4)
            cap.tags = {"pass": "verify"}
            bridge(ids[:, 4:], past_key_values=cache)
    kept = to_activation_cache(cap, bridge, stacked=True, where={"pass": "verify"}).accumulated_resid()
    assert (kept - ref_cache.accumulated_resid()).abs().max() < 1e-5
    drafts = cap.records["blocks.1.hook_resid_post"][1]
    assert drafts.tags == {"pass": "draft"} and drafts.positions.tolist() == [4, 5]
    with pytest.raises(ValueError, match=r"positions \[0, 1, 2, 3\] were never recorded"):
        to_activation_cache(cap, bridge, stacked=True, where={"pass": "draft"})
    with pytest.raises(KeyError, match="no record of"):
        to_activation_cache(cap, bridge, stacked=True, where={"pass": "tree"})
    with pytest.raises(ValueError, match="pass stacked=True"):
        to_activation_cache(cap, bridge, where={"pass": "verify"})
