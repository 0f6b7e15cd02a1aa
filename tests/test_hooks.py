"""Hooks: capture during cached decoding, streaming, steering, hook removal, unknown names."""

import pytest
import torch
from transformers import DynamicCache

from beliefscope.hooks import capture, hook_name, layer_names, steer, stream
from beliefscope.models.load import bridge_from_hf

from .helpers import copy_of, tiny_gpt2_hf, tiny_llama_hf


@pytest.mark.parametrize("make", [tiny_gpt2_hf, tiny_llama_hf], ids=["gpt2", "llama"])
def test_capture_during_cached_decoding_matches_uncached(make):
    bridge = bridge_from_hf(make())
    x = torch.randint(0, 64, (2, 10))
    names = layer_names(bridge, "resid_post")
    with torch.no_grad(), capture(bridge, names) as full:
        bridge(x)
    cache = DynamicCache()
    with torch.no_grad(), capture(bridge, names, cache=cache) as inc:
        bridge(x[:, :6], past_key_values=cache, return_type="logits_and_cache")
        for i in range(6, 10):
            bridge(x[:, i:i + 1], past_key_values=cache, return_type="logits_and_cache")
    assert [r.positions.tolist() for r in inc.records[names[-1]]] == [[0, 1, 2, 3, 4, 5], [6], [7], [8], [9]]
    for n in names:
        assert (full.stacked(n) - inc.stacked(n)).abs().max() < 1e-5


def test_capture_seek_after_rollback_overwrites_positions():
    bridge = bridge_from_hf(tiny_gpt2_hf())
    x = torch.randint(0, 64, (1, 8))
    name = hook_name("resid_post", 1)
    with torch.no_grad(), capture(bridge, [name]) as cap:
        bridge(x[:, :6])       # positions 0..5
        cap.seek(4)
        bridge(x)  # a re-run from scratch is recorded at 4..11, the later write wins
    st = cap.stacked(name)
    assert st.shape[1] == 12
    assert [r.positions.tolist()[0] for r in cap.records[name]] == [0, 4]


def test_stream_hands_over_each_activation_once_and_is_removed():
    hf = tiny_llama_hf()
    ref = copy_of(hf)
    bridge = bridge_from_hf(hf)
    x = torch.randint(0, 64, (2, 7))
    names = ["blocks.0.hook_resid_pre", *layer_names(bridge, "resid_post")]
    got = {n: [] for n in names}
    with torch.no_grad():
        with stream(bridge, names, lambda n, act: got[n].append(act.clone())):
            bridge(x)
        bridge(x)  # after the block nothing arrives

        def failing_sink(name, act):
            raise RuntimeError("sink failed")

        with pytest.raises(RuntimeError, match="sink failed"), stream(bridge, names, failing_sink):
            bridge(x)
        bridge(x)  # the failing sink was removed too
        hs = ref(x, output_hidden_states=True).hidden_states  # embeddings, then each layer (last one normed)
    assert all(len(got[n]) == 1 for n in names)
    for i, n in enumerate(names[:-1]):
        torch.testing.assert_close(got[n][0], hs[i], atol=1e-5, rtol=1e-5)
    with torch.no_grad(), capture(bridge, names[-1:]) as cap:
        bridge(x)
    assert torch.equal(got[names[-1]][0], cap.records[names[-1]][0].act)


def test_steer_changes_downstream_only_and_is_removed():
    bridge = bridge_from_hf(tiny_llama_hf())
    x = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        base = bridge(x, return_type="logits")
        with steer(bridge, 0, torch.randn(32), 5.0, positions=[5]):
            s = bridge(x, return_type="logits")
        after = bridge(x, return_type="logits")
    delta = (s - base).abs().amax(-1)[0]  # [pos]
    assert delta[:5].max() == 0 and delta[5:].min() > 1e-3  # causal: only positions >= 5 move
    assert torch.equal(after, base)  # hook removed


def test_hooks_removed_after_exception():
    bridge = bridge_from_hf(tiny_gpt2_hf())
    x = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        base = bridge(x, return_type="logits")
        with pytest.raises(RuntimeError), steer(bridge, 1, torch.randn(32), 9.0):
            raise RuntimeError("boom")
        assert torch.equal(bridge(x, return_type="logits"), base)


def test_unknown_hook_name_lists_closest():
    bridge = bridge_from_hf(tiny_gpt2_hf())
    with pytest.raises(KeyError, match="blocks.0.hook_resid_post"):
        with capture(bridge, ["blocks.0.hook_resid_psot"]):
            pass
    with pytest.raises(ValueError, match="valid kinds"):
        hook_name("resid_psot", 0)
    with pytest.raises(ValueError, match=r"layers 0\.\.1"):
        layer_names(bridge, "resid_post", [5])


def test_a_capture_sees_direct_calls_of_the_hf_model_as_it_sees_the_bridge():
    """The decoding loops call the Runner's HF model, not the Runner: a capture records those forwards at the
    same absolute positions, with the same activations, as the Runner's own."""
    from beliefscope.cache import KVCache
    from beliefscope.models.testing import tiny_gpt2

    model = tiny_gpt2()
    name, x = "blocks.1.hook_resid_post", torch.tensor([[5, 6, 7, 8, 9]])
    seen = {}
    for path in ("bridge", "hf model"):
        cache = KVCache.for_model(model, capacity=16)
        with torch.no_grad(), capture(model, [name], cache=cache) as cap:
            run = {"bridge": model, "hf model": model.original_model}[path]
            for a, b in ((0, 3), (3, 5)):  # a prefill of 3 tokens, then 2 more on the cache
                run(x[:, a:b], past_key_values=cache, use_cache=True)
        recs = cap.records[name]
        seen[path] = ([r.positions.tolist() for r in recs], torch.cat([r.act for r in recs], dim=1), cap.forwards)
    assert seen["bridge"][0] == [[0, 1, 2], [3, 4]] and seen["bridge"][2] == 2
    for path in ("hf model",):
        assert seen[path][0] == seen["bridge"][0] and seen[path][2] == 2, path
        torch.testing.assert_close(seen[path][1], seen["bridge"][1])


def test_resolve_hooks_builds_no_hook_dict_and_follows_a_swapped_component(monkeypatch):
    """The hook dictionary TransformerLens rebuilds per access is never built for names the bridge finds itself
    (its public ``get_hook_point``), the points are the dictionary's own, and a component swapped in (here the
    embedding, which TransformerLens's setattr re-registers under the old names) gives its new points."""
    import copy

    from beliefscope.hooks.names import resolve_hooks

    runner = bridge_from_hf(tiny_llama_hf())
    bridge = runner.bridge  # TransformerLens's, built: the names below need its wrappers
    names = ["embed.hook_out", *layer_names(runner, "resid_post"), "blocks.0.attn.hook_pattern"]
    built = []
    prop = type(bridge).hook_dict
    monkeypatch.setattr(type(bridge), "hook_dict", property(lambda m: built.append(1) or prop.fget(m)))
    first = resolve_hooks(runner, names)
    again = resolve_hooks(runner, names)
    assert not built and all(a is b for a, b in zip(first, again))
    assert all(p is prop.fget(bridge)[n] for p, n in zip(first, names))
    bridge.embed = copy.deepcopy(bridge.embed)  # new hook points under "embed.hook_in" / "embed.hook_out"
    fresh = resolve_hooks(runner, names)
    assert fresh[0] is bridge.embed.hook_out and fresh[0] is not first[0]
    assert all(p is prop.fget(bridge)[n] for p, n in zip(fresh, names))
