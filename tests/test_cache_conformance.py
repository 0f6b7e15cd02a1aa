"""KVCache as a whole transformers ``Cache``: the conformance suite (tests/conformance.py) with
``DynamicCache`` as the control of every check, and regression tests of the per-layer bugs: a deep
copy that shared its layers with the original, a crop of one layer that cropped them all, and a
layer reorder that raised AttributeError."""

import copy
import gc

import pytest
import torch
from transformers import DynamicCache

from .conformance import CHECKS, MODELS, fwd, hf_model, ids, kvcache, verdict

pytestmark = pytest.mark.usefixtures("one_thread")
_MODELS = {}


def model_of(arch):
    if arch not in _MODELS:
        _MODELS[arch] = hf_model(arch)
    return _MODELS[arch]


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("arch", MODELS)
def test_conformance(arch, check):
    d, k, v = verdict(check, model_of(arch))
    assert v in ("agree", "refused (documented)", "both fail", "KVCache only (= recompute)"), (d, k)


@pytest.mark.parametrize("arch", ["Llama", "GPT-2"])
def test_deepcopy_then_generate_keeps_its_own_positions(arch):
    """HF's documented pattern: prefill a prompt once, deep-copy the cache per request. After generating
    from the copy, its layers show every position (8 here), as DynamicCache's do; the original keeps 6."""
    model = model_of(arch)
    shown = {}
    for name, make in (("dynamic", lambda: DynamicCache(config=model.config)), ("ours", lambda: kvcache(model, 1))):
        shared = make()
        fwd(model, ids(6), shared)
        c = copy.deepcopy(shared)
        fwd(model, ids(2, seed=1), c)
        del shared
        gc.collect()
        shown[name] = (c.layers[0].keys.shape[-2], c.get_seq_length(), [lay.get_seq_length() for lay in c.layers])
    assert shown["ours"] == shown["dynamic"] == (8, 8, [8, 8])


def test_layer_operations_refused_with_the_cache_level_call():
    model = model_of("Llama")
    c = kvcache(model, 2)
    fwd(model, ids(5, batch=2), c)
    layer = c.layers[0]
    for call, fix in ((lambda: layer.crop(-1), "cache.crop(-1)"), (layer.reset, "cache.reset()"),
                      (lambda: layer.reorder_cache(torch.tensor([1, 0])), "cache.reorder_cache"),
                      (lambda: layer.batch_repeat_interleave(2), "cache.batch_repeat_interleave(2)"),
                      (lambda: layer.batch_select_indices(torch.tensor([0])), "cache.batch_select_indices"),
                      (lambda: setattr(layer, "keys", None), "cache.overwrite")):
        with pytest.raises(ValueError, match=f"alone is refused.*{fix.replace('(', '[(]').replace(')', '[)]')}"):
            call()
    assert c.lengths == [5, 5]  # nothing changed
    c.crop(-1)  # the cache-level calls act on every layer, as DynamicCache's do
    assert [lay.get_seq_length() for lay in c.layers] == [4, 4]


def test_shallow_copy_refused_and_deepcopy_copies_only_the_filled_part():
    model = model_of("Llama")
    c = kvcache(model, 1, capacity=64)
    fwd(model, ids(5), c)
    with pytest.raises(TypeError, match="fork"):
        copy.copy(c)
    d = copy.deepcopy(c)
    assert d.capacity == 5 and c.capacity == 64 and d.recorder.events == c.recorder.events and d.id != c.id
    assert torch.equal(d.keys(0), c.keys(0)) and torch.equal(d.recorder.provenance_of(0), c.recorder.provenance_of(0))
