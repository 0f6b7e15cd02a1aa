"""On a CUDA device, against references on that device: skipped with the reason where there is none
(CPU-only CI); `make gpu-check` runs every command there. `tests/test_host_guard.py` covers placement here."""

import pytest
import torch

from .helpers import TARGET, copy_of, tiny_llama_hf

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")]


def test_bridge_logits_and_host_ids_on_cuda_equal_hf_on_cuda():
    from beliefscope.models.bridge import build_bridge

    hf = tiny_llama_hf().cuda()
    ref = copy_of(hf.cpu()).cuda()(torch.tensor([[1, 2, 3, 4]], device="cuda")).logits
    bridge = build_bridge(hf.cuda())
    ours = bridge(torch.tensor([[1, 2, 3, 4]]))  # host ids: the bridge places them
    assert ours.device.type == "cuda"
    assert torch.allclose(ours, ref, atol=1e-5)


def test_speculative_greedy_on_cuda_float32_equals_plain_greedy():
    from beliefscope.decoding import SpecConfig, make_drafter, speculative_generate
    from beliefscope.decoding.core import generate
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
