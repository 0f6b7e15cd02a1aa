"""On a CUDA device, against references on that device: skipped with the reason where there is none
(CPU-only CI); `make gpu-check` runs every command there. `tests/test_host_guard.py` covers placement here."""

import pytest
import torch

from .helpers import TARGET, copy_of, tiny_llama_hf

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")]


def test_bridge_logits_and_host_ids_on_cuda_equal_hf_on_cuda():
    from beliefscope.models.runner import Runner

    hf = tiny_llama_hf().cuda()
    ref = copy_of(hf.cpu()).cuda()(torch.tensor([[1, 2, 3, 4]], device="cuda")).logits
    bridge = Runner(hf.cuda())
    ours = bridge(torch.tensor([[1, 2, 3, 4]]))  # host ids: the bridge places them
    assert ours.device.type == "cuda"
    assert torch.allclose(ours, ref, atol=1e-5)


def test_speculative_greedy_on_cuda_float32_equals_plain_greedy():
    from beliefscope.decoding import SpecConfig, make_drafter, speculative_generate
    from beliefscope.decoding.loop import generate
    from beliefscope.models.load import load_model

    model, tok = load_model(TARGET, device="cuda")
    ids = torch.tensor(tok("A coin is heads . Alice flips . Bob stays . State ?")["input_ids"])
    cfg = SpecConfig(gamma=4, max_new_tokens=24, stop_at_eos=False)
    spec = speculative_generate(model, make_drafter("ngram:2", model), ids, cfg).tokens
    assert spec == generate(model, ids, cfg).tokens


def test_harvest_on_cuda_equals_harvest_on_cpu(tmp_path):
    from beliefscope.models.load import load_model
    from beliefscope.probes.harvest import HarvestConfig, harvest, make_examples

    hc = HarvestConfig(model="target", n=6, events="1-4", hooks="resid_post", layers="all")
    ex = make_examples(hc)
    stores = []
    for dev in ("cpu", "cuda"):
        model, tok = load_model(TARGET, device=dev)
        stores.append(harvest(model, tok, ex, hc.hooks, hc.layers, str(tmp_path / dev)))
    h = stores[0].hooks[-1]
    assert torch.allclose(stores[0].load_hook(h), stores[1].load_hook(h), atol=1e-4)


def test_a_model_split_over_the_gpu_and_the_cpu_equals_the_model_on_the_gpu(tmp_path):
    """--device-map over the GPU and the CPU: logits, captures and greedy tokens match the model in one piece, and
    each layer's KV buffers sit where the layer computes."""
    from beliefscope.cache import KVCache
    from beliefscope.decoding import SpecConfig
    from beliefscope.decoding.loop import generate
    from beliefscope.hooks import capture
    from beliefscope.models.load import load_model, model_defaults

    dm = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": "cpu",
          "model.layers.3": "cpu", "model.norm": "cpu", "model.rotary_emb": 0, "lm_head": "cpu"}
    whole, tok = load_model("direct-rope", device="cuda")
    with model_defaults(device_map=dm):
        split, _ = load_model("direct-rope")
    ids = torch.tensor([tok("A coin is heads . Alice flips . Bob stays . State ?")["input_ids"]])
    names = [f"blocks.{i}.hook_resid_post" for i in range(4)]
    with torch.no_grad(), capture(whole, names) as a:
        la = whole(ids)
    with torch.no_grad(), capture(split, names) as b:
        lb = split(ids)
    assert torch.allclose(la.cpu(), lb.cpu(), atol=1e-4)
    for n in names:
        assert torch.allclose(a.stacked(n).cpu(), b.stacked(n).cpu(), atol=1e-4), n
    cache = KVCache.for_model(split)
    split(ids, past_key_values=cache)
    # accelerate runs layers mapped to "cpu" on the GPU when there is one (CPU offload: stored on the host,
    # computed on the card); each layer's buffers sit where the layer computes
    from beliefscope.models.profile import compute_device, decoder_layers, hf_of

    where = [compute_device(m) for m in decoder_layers(hf_of(split))]
    assert [cache.storage.k[i].device for i in range(4)] == where and where[0].type == "cuda"
    gen = SpecConfig(max_new_tokens=32, stop_at_eos=False)
    assert generate(whole, ids[0], gen).tokens == generate(split, ids[0], gen).tokens


def test_compiled_decode_on_cuda_replays_cuda_graphs_and_gives_the_eager_tokens():
    from dataclasses import replace

    from beliefscope.decoding import SpecConfig, make_drafter, speculative_generate
    from beliefscope.decoding.loop import generate
    from beliefscope.models.load import load_model

    model, tok = load_model(TARGET, device="cuda")
    ids = torch.tensor(tok("A coin is heads . Alice flips . Bob stays . State ?")["input_ids"])
    cfg = SpecConfig(max_new_tokens=24, stop_at_eos=False)
    plain = generate(model, ids, replace(cfg, compile=True))
    assert plain.compiled == "cuda-graphs" and plain.tokens == generate(model, ids, cfg).tokens
    chain = speculative_generate(model, make_drafter("ngram:3", model), ids, replace(cfg, compile=True))
    assert chain.compiled == "cuda-graphs"
    assert chain.tokens == speculative_generate(model, make_drafter("ngram:3", model), ids, cfg).tokens
