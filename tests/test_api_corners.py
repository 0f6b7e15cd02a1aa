"""Corners of the Python API that were silently wrong (issue "The Python API ... no silent corner"): a model
wrapped in memory left in training mode, a batch flattened into one prompt, and a short generation that did
not say why it stopped. Each is checked against a reference: the same model's own forward, and plain greedy."""

import pytest
import torch

from beliefscope.decoding import SpecConfig, generate, make_drafter, speculative_generate
from beliefscope.models.load import bridge_from_hf

from .helpers import tiny_gpt2_hf


def _dropout_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=24, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.5,
                     embd_pdrop=0.5, attn_pdrop=0.5, bos_token_id=1, eos_token_id=1)
    return GPT2LMHeadModel(cfg).train()  # as a freshly built or fine-tuned model comes


def test_a_model_wrapped_in_memory_runs_in_eval_mode():
    """Before: `bridge_from_hf` left dropout on; two forwards of one prompt differed by 0.17."""
    hf = _dropout_gpt2()
    bridge = bridge_from_hf(hf)
    assert not hf.training and not any(m.training for m in hf.modules())
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        a, b = bridge(x, return_type="logits"), bridge(x, return_type="logits")
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_batch_is_refused_not_flattened():
    """Before: a [2, n] batch became one prompt of 2n tokens (prompt_len 20 for two 10-token prompts)."""
    bridge = bridge_from_hf(tiny_gpt2_hf(seed=3))
    cfg = SpecConfig(max_new_tokens=3, stop_at_eos=False)
    batch = torch.randint(2, 60, (2, 10))
    drafter = make_drafter("early-exit:1", bridge)
    for run in (lambda p: generate(bridge, p, cfg), lambda p: speculative_generate(bridge, drafter, p, cfg)):
        with pytest.raises(ValueError, match=r"one prompt \(\[n\] or \[1, n\] token ids\); got shape \[2, 10\]"):
            run(batch)
    one = generate(bridge, batch[:1], cfg)
    assert one.prompt_len == 10 and one.tokens == generate(bridge, batch[0], cfg).tokens


def test_a_short_generation_says_why_it_stopped():
    """Before: near the context limit `generate` returned 2 of 8 tokens asked, and nothing said so."""
    hf = _dropout_gpt2()  # a 24-position context
    bridge = bridge_from_hf(hf)
    prompt = list(range(2, 20))  # 18 tokens
    plain = generate(bridge, prompt, SpecConfig(max_new_tokens=8, stop_at_eos=False))
    assert len(plain.tokens) < 8 and plain.stop_reason == "context"
    spec = speculative_generate(bridge, make_drafter("early-exit:1", bridge), prompt,
                                SpecConfig(max_new_tokens=8, stop_at_eos=False))
    assert len(spec.tokens) < 8 and spec.stop_reason == "context"
    room = generate(bridge, prompt[:4], SpecConfig(max_new_tokens=3, stop_at_eos=False))
    assert len(room.tokens) == 3 and room.stop_reason == "budget"
    first = room.tokens[0]  # plain greedy's first token, made the end of sequence: decoding stops right there
    eos = generate(bridge, prompt[:4], SpecConfig(max_new_tokens=3, eos_token_id=first))
    assert eos.tokens == [first] and eos.stop_reason == "eos"


def test_a_probe_fitted_in_python_carries_its_model(tmp_path):
    """Before: a probe fitted in Python carried no model identity, and `trajectory()` read it on another model of
    the same width (0.5 accuracy, silently). Fitted from a store or with `model=`, it is refused there."""
    import numpy as np

    from beliefscope.analyses.beliefs import trajectory
    from beliefscope.models.tokenizer import toy_tokenizer
    from beliefscope.probes import ActivationStore, fit_all_layers, harvest
    from beliefscope.tasks import get_task

    tok = toy_tokenizer()
    a, b = bridge_from_hf(tiny_gpt2_hf(seed=5)), bridge_from_hf(tiny_gpt2_hf(seed=6))  # same width, other weights
    exs = get_task("coinflip", rendering="toy", fmt="direct").examples(30, 0, (1, 4))
    harvest(a, tok, exs, "resid_post", "all", str(tmp_path / "s"))
    store = ActivationStore.open(str(tmp_path / "s"))
    from_store = fit_all_layers(store, "state")
    assert from_store.meta["harvest_config"]["checkpoint_hash"] and from_store.meta["store_hash"] == store.hash
    X = torch.randn(len(from_store.hooks), 200, 32)
    from_arrays = fit_all_layers(X, (X[0, :, 0] > 0).long(), hooks=from_store.hooks, model=a)
    for probe in (from_store, from_arrays):
        assert trajectory(a, tok, probe, exs[0]).p.shape[0] == len(probe.hooks)
        with pytest.raises(ValueError, match="checkpoint hash"):
            trajectory(b, tok, probe, exs[0])
    assert np.isfinite(trajectory(b, tok, fit_all_layers(X, (X[0, :, 0] > 0).long(), hooks=from_store.hooks),
                                  exs[0]).p).all()  # no identity given: nothing to check against


def test_load_model_takes_an_hf_model_object():
    """Before: `load_model(hf_model)` failed with "'Qwen2ForCausalLM' object has no attribute 'startswith'"."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from beliefscope.models.load import load_model
    from beliefscope.models.tokenizer import toy_tokenizer

    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    x = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        want = hf.eval()(x).logits
    bridge, tok = load_model(hf.train(), tokenizer=toy_tokenizer())
    assert tok is not None and not hf.training
    with torch.no_grad():
        torch.testing.assert_close(bridge(x, return_type="logits"), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="got int"):
        load_model(7)
    with pytest.raises(ValueError, match="wrapped where it is"):
        load_model(hf, device="cpu")


def test_capture_without_a_trace_is_refused_with_the_fix():
    """Before: `SpecConfig(capture=...)` without `trace=True` raised "'NoneType' object has no attribute 'captures'"
    mid-run."""
    with pytest.raises(ValueError, match=r"pass trace=True as well"):
        SpecConfig(capture=("blocks.0.hook_resid_post",))
    bridge = bridge_from_hf(tiny_gpt2_hf(seed=3))
    gen = generate(bridge, [5, 6], SpecConfig(max_new_tokens=2, stop_at_eos=False, trace=True,
                                              capture=("blocks.0.hook_resid_post",)))
    assert gen.trace is not None and len(gen.tokens) == 2


def test_load_data_takes_a_field_name_as_a_string():
    """Before: `bs.load_data(path, label_field="truth")` iterated the string's letters ("no field 't'")."""
    import beliefscope as bs
    from beliefscope.tasks.records import example_path

    data = bs.load_data(example_path("cities.jsonl"), label_field="truth")
    assert data.label_names == ["truth"] and data.classes["truth"] == ["false", "true"]
    both = bs.load_data(example_path("locations.jsonl"), events_field="location", label_field="negated")
    assert both.label_names == ["location", "negated"]
    with pytest.raises(TypeError, match=r"unknown settings \['label'\]"):
        bs.load_data(example_path("cities.jsonl"), label="truth")


def test_capture_to_a_device_this_torch_lacks_is_refused():
    """Before: `capture(device="cuda")` on a CPU build raised a bare AssertionError inside a forward."""
    from beliefscope.hooks import capture

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for builds without it")
    bridge = bridge_from_hf(tiny_gpt2_hf(seed=3))
    with pytest.raises(ValueError, match="no usable CUDA device"):
        with capture(bridge, ["blocks.0.hook_resid_post"], device="cuda"):
            bridge(torch.tensor([[5, 6]]), return_type=None)
    with capture(bridge, ["blocks.0.hook_resid_post"], device="cpu") as cap:
        bridge(torch.tensor([[5, 6]]), return_type=None)
    assert cap.records["blocks.0.hook_resid_post"][0].act.shape[-2] == 2


def test_the_main_command_under_torchrun_refuses_what_it_cannot_shard(tmp_path, monkeypatch, capsys):
    """Before: `torchrun ... -m beliefscope harvest` made both ranks write every record ("store ... holds some
    prompts twice"). Now `harvest` shards by rank as `-m beliefscope.probes.harvest` does (test_data_chain's
    torchrun test, row for row), and any other command refuses before any work, saying to run it in one process."""
    import os

    from beliefscope.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    out = tmp_path / "probes"
    assert main(["probe", "--acts", str(tmp_path / "acts"), "--out", str(out), "--quiet"]) == 2
    assert "run it in one process (only `harvest` shards" in capsys.readouterr().err
    assert not os.path.exists(out)


