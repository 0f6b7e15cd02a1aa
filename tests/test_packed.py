"""models.packed: oneDNN-packed linear weights give HF's logits, row-wise batch invariance,
exact speculative decoding, autograd through the fallback, and a clean way back."""

import pytest
import torch

from beliefscope.models.packed import (
    PackedLinear,
    is_packed,
    pack_linears,
    packing_available,
    packing_disabled,
    unpack_linears,
)

from .helpers import tiny_gpt2_hf, tiny_llama_hf

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN weight packing")


def _packed_layer(n_in: int, n_out: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(n_in, n_out))
    pack_linears(net)
    return net


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits  # [b, n, vocab]


@pytest.mark.parametrize("make", [tiny_llama_hf, tiny_gpt2_hf], ids=["llama-linear", "gpt2-conv1d"])
def test_packed_logits_match_hf(make):
    model = make()
    ids = torch.randint(0, 60, (2, 17))
    ref = _logits(model, ids)
    n = pack_linears(model)
    assert n > 0 and is_packed(model)
    kinds = {type(m).__name__ for m in model.modules() if isinstance(m, PackedLinear)}
    assert kinds == ({"PackedLinear", "_Conv1DPacked"} if make is tiny_gpt2_hf else {"PackedLinear"})
    torch.testing.assert_close(_logits(model, ids), ref, atol=1e-5, rtol=1e-5)


def test_rows_are_bitwise_batch_invariant():
    """Row i of a packed layer's output is the same bits whether computed alone or with up to 63 others
    (what makes a verify forward see a decode step's linear-layer numbers)."""
    net = _packed_layer(576, 1536)
    lin = net[0]
    x = torch.randn(64, 576)
    with torch.no_grad():
        alone = torch.cat([net(x[i:i + 1]) for i in range(8)])  # [8, 1536] one row per call
        for m in (2, 3, 5, 8, 9, 16, 33, 64):
            together = net(x[:m])  # [m, 1536]
            k = min(m, 8)
            assert torch.equal(together[:k], alone[:k]), f"rows differ when {m} rows run together"
        torch.testing.assert_close(net(x), torch.nn.functional.linear(x, lin.weight, lin.bias), atol=1e-4, rtol=1e-5)


def test_speculative_greedy_on_packed_model_equals_plain_greedy():
    from beliefscope.decoding import SpecConfig, generate, make_drafter, speculative_generate

    model = tiny_llama_hf()
    pack_linears(model)
    torch.manual_seed(1)
    for _ in range(6):
        base = torch.randint(2, 60, (6,))
        prompt = torch.cat([base, base, base[:3]])  # repeats, so prompt lookup drafts something
        plain = generate(model, prompt, SpecConfig(max_new_tokens=20, stop_at_eos=False)).tokens
        for gamma, fixed in ((4, True), (7, False)):
            cfg = SpecConfig(gamma=gamma, max_new_tokens=20, stop_at_eos=False, fixed_window=fixed)
            got = speculative_generate(model, make_drafter("ngram:2", model), prompt, cfg)
            assert got.tokens == plain
            assert got.drafted > 0


@pytest.mark.parametrize("make", [tiny_llama_hf, tiny_gpt2_hf], ids=["llama-linear", "gpt2-conv1d"])
def test_gradients_flow_through_the_fallback(make):
    ref_model, model = make(), make()
    pack_linears(model)
    ids = torch.randint(0, 60, (1, 9))
    ref_model(ids).logits.logsumexp(-1).sum().backward()
    model(ids).logits.logsumexp(-1).sum().backward()
    for (name, a), (_, b) in zip(ref_model.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_in_place_weight_edit_is_repacked():
    net = _packed_layer(16, 8)
    x = torch.randn(3, 16)
    with torch.no_grad():
        before = net(x)
        net[0].weight.mul_(-2.0)  # e.g. an edit of the layer under no_grad
        after = net(x)
    torch.testing.assert_close(after, torch.nn.functional.linear(x, net[0].weight, net[0].bias), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(after, before)


def test_state_dict_unchanged_and_unpack_restores_modules():
    model = tiny_llama_hf()
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    originals = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    n = pack_linears(model)
    assert set(model.state_dict()) == set(keys)
    assert unpack_linears(model) == n and not is_packed(model)
    for name, m in originals.items():
        assert model.get_submodule(name) is m
    for k, v in model.state_dict().items():
        assert torch.equal(v, keys[k])


def test_packing_disabled_runs_default_kernels_and_restores():
    model = tiny_llama_hf()
    pack_linears(model)
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    calls = []
    layers[0].register_forward_hook(lambda *_: calls.append(layers[0].enabled))
    ids = torch.randint(0, 60, (1, 5))
    with packing_disabled(model):
        _logits(model, ids)
    _logits(model, ids)
    assert calls == [False, True]
    assert all(m.enabled for m in layers)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="batch_hint=0"):
        pack_linears(torch.nn.Sequential(torch.nn.Linear(2, 2)), batch_hint=0)
    from beliefscope.models.load import load_hf

    with pytest.raises(ValueError,
                       match="packed linears need float32 weights on the CPU; this model is torch.bfloat16"):
        load_hf("target", "cpu", "bfloat16", packed=True)


def test_spec_bench_times_default_kernels_beside_packed():
    """On a packed target the benchmark adds plain greedy with the default kernels, paired by prompt, and
    reports the packing gain beside the speedups (which stay against packed plain greedy)."""
    from beliefscope.benchmarks.spec import DEFAULT_KERNELS, SpecBenchConfig, bench_model

    model = tiny_llama_hf()
    pack_linears(model)
    torch.manual_seed(2)
    prompts = [(torch.randint(2, 60, (5,)).repeat(3)).tolist() for _ in range(3)]
    cfg = SpecBenchConfig(n_prompts=3, max_new_tokens=12, gammas=(3,), stop_at_eos=False)
    res = bench_model("tiny", model, lambda p: {"input_ids": p}, None, prompts, ("ngram:2",), cfg)
    rows = res["methods"]
    assert list(rows)[:2] == ["ours plain greedy", DEFAULT_KERNELS]
    assert rows[DEFAULT_KERNELS]["kind"] == "plain-default" and rows[DEFAULT_KERNELS]["n_prompts"] == 3
    k = res["kernels"]
    assert k["packed_linears"] is True and k["best_over_default_kernels_plain"]["n"] == 3
    assert k["default_kernels_identical_to_plain"] == rows[DEFAULT_KERNELS]["identical_to_plain"]
    assert "default_kernels" in res["verify_cost_profile"]
    assert rows["ours ngram:2 g=3"]["identical_to_plain"] == 3
    assert all(m.enabled for m in model.modules() if isinstance(m, PackedLinear))


def test_generate_cli_packed_gives_the_same_tokens(capsys):
    import json

    from beliefscope.cli import main

    line = ["generate", "--model", "target", "--drafter", "ngram:3", "--gamma", "4", "--max-new-tokens", "16",
            "--prompt", "A coin is heads . Alice flips . Bob stays . Think :", "--json", "--quiet"]
    outs = []
    for extra in ([], ["--packed"]):
        assert main(line + extra) == 0
        outs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert outs[1]["tokens"] == outs[0]["tokens"] and outs[0]["tokens"]


def test_copies_repack_and_the_bf16_drafter_runs_on_a_packed_target():
    """The bf16 drafter deep-copies the target: the copy carries no oneDNN tensor, re-packs (float32) or falls back
    to F.linear (bfloat16), and speculative decoding stays equal to plain greedy."""
    import copy

    from beliefscope.decoding import SpecConfig, generate, make_drafter, speculative_generate

    model = tiny_llama_hf()
    pack_linears(model)
    ids = torch.randint(2, 60, (1, 8))
    twin = copy.deepcopy(model)
    assert torch.equal(_logits(twin, ids), _logits(model, ids))
    prompt = ids[0]
    plain = generate(model, prompt, SpecConfig(max_new_tokens=12, stop_at_eos=False)).tokens
    got = speculative_generate(model, make_drafter("bf16", model), prompt,
                               SpecConfig(gamma=3, max_new_tokens=12, stop_at_eos=False, fixed_window=False))
    assert got.tokens == plain and got.drafted > 0


@pytest.mark.parametrize("n_in, n_out", [(1536, 576), (3072, 768), (576, 1536)])
def test_a_lone_row_has_the_bits_it_has_among_others(n_in, n_out):
    """oneDNN may compute one row with another kernel than 2+ rows (SmolLM2's down_proj, 1536 inputs,
    did: up to 1e-5 apart); a packed layer keeps a row's bits whether it is alone or among 2-16 rows."""
    if not packing_available():
        pytest.skip("this torch build cannot pack weights (oneDNN)")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(n_in, n_out))
    pack_linears(net)
    x = torch.randn(16, n_in)
    with torch.no_grad():
        among = net(x[None])[0]  # [16, out]
        for i in range(4):
            assert torch.equal(net(x[None, i: i + 1])[0, 0], among[i])
        for m in (2, 3, 8):
            assert torch.equal(net(x[None, :m])[0], among[:m])
