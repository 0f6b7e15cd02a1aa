"""One hook-spec grammar for `capture`, `steer`, `harvest` and the CLI's ``--hooks`` (`hooks.names.parse_hooks`).

References: hand-written name lists for the grammar, full-name captures and an HF ``output_hidden_states`` forward
for `capture`, a plain PyTorch forward hook on the HF decoder layer for `steer`, and the store's own hook list for
`harvest` and the CLI."""

import json

import pytest
import torch

from beliefscope.cli import main
from beliefscope.hooks import capture, hook_names, parse_hooks, steer
from beliefscope.models.load import bridge_from_hf
from beliefscope.models.tokenizer import toy_tokenizer
from beliefscope.probes.harvest import EMBED_HOOK, harvest
from beliefscope.tasks import get_task

from .helpers import tiny_gpt2_hf, tiny_llama_hf

N = 4  # layers of the grammar cases


@pytest.mark.parametrize("spec, layers, want", [
    ("resid_post@3", "all", ["blocks.3.hook_resid_post"]),
    ("resid_post@-1", "all", ["blocks.3.hook_resid_post"]),
    ("resid_post@-4", "all", ["blocks.0.hook_resid_post"]),
    ("attn_out@1-2", "all", ["blocks.1.hook_attn_out", "blocks.2.hook_attn_out"]),
    ("resid_post@0,2,k@1", "all", ["blocks.0.hook_resid_post", "blocks.2.hook_resid_post", "blocks.1.attn.hook_k"]),
    ("resid_post", "all", [f"blocks.{i}.hook_resid_post" for i in range(N)]),
    ("resid_post", "1,3", ["blocks.1.hook_resid_post", "blocks.3.hook_resid_post"]),
    ("resid_post", 2, ["blocks.2.hook_resid_post"]),
    (["mlp_out@all"], "all", [f"blocks.{i}.hook_mlp_out" for i in range(N)]),
    ("embed,blocks.2.attn.hook_z,hook_embed", "all", ["hook_embed", "blocks.2.attn.hook_z"]),
    ("ln_final.hook_scale,unembed.hook_in", "all", ["ln_final.hook_scale", "unembed.hook_in"]),
    ("resid_post@1,resid_post@1", "all", ["blocks.1.hook_resid_post"]),
])
def test_the_grammar_against_hand_written_names(spec, layers, want):
    assert parse_hooks(spec, N, layers) == want


@pytest.mark.parametrize("spec, says", [
    ("resid_post@4", "out of range; this model has layers 0..3"),
    ("resid_post@-5", "out of range"),
    ("resid_post@2-1", "is not N, -N, A-B or all"),
    ("resid_post@x", "is not N, -N, A-B or all"),
    ("resid_psot@1", "closest: ['resid_post'"),
    ("resid_post,,attn_out", "empty item"),
])
def test_bad_specs_are_refused_naming_the_value_and_the_fix(spec, says):
    with pytest.raises(ValueError) as err:
        parse_hooks(spec, N)
    msg = str(err.value)
    assert says in msg, msg
    assert repr(spec) in msg or repr(spec.split("@")[0]) in msg, msg  # the value refused is named


def test_capture_reads_the_grammar_and_equals_hf_hidden_states():
    hf = tiny_llama_hf()
    bridge = bridge_from_hf(hf)
    n = bridge.cfg.n_layers
    x = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        hs = hf(x, output_hidden_states=True).hidden_states  # embeddings, then each block (the last one normed)
        with capture(bridge, "resid_post@0,resid_pre@-1") as cap:
            bridge(x)
    assert cap.names == ["blocks.0.hook_resid_post", f"blocks.{n - 1}.hook_resid_pre"]
    torch.testing.assert_close(cap.stacked("resid_post@0"), hs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cap.stacked("resid_pre@-1"), hs[n - 1], atol=1e-5, rtol=1e-5)
    with pytest.raises(KeyError, match="was not captured"):
        cap.stacked("resid_post@-1")


@pytest.mark.parametrize("layer", ["resid_post@1", "resid_post@-1", "blocks.1.hook_resid_post", 1])
def test_steer_by_spec_equals_a_plain_forward_hook(layer):
    hf = tiny_llama_hf(seed=3)
    bridge = bridge_from_hf(hf)
    assert bridge.cfg.n_layers == 2  # so resid_post@-1 is block 1
    x = torch.randint(0, 64, (1, 9))
    d = torch.randn(32)

    def add(module, args, output):  # the reference: the decoder layer's output plus 3 d, at every position
        return (output[0] + 3.0 * d,) + tuple(output[1:]) if isinstance(output, tuple) else output + 3.0 * d

    handle = hf.model.layers[1].register_forward_hook(add)
    try:
        with torch.no_grad():
            want = hf(x).logits
    finally:
        handle.remove()
    with torch.no_grad(), steer(bridge, layer, d, 3.0):
        got = bridge(x, return_type="logits")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_steer_refuses_a_spec_naming_several_hooks_or_a_bad_layer():
    bridge = bridge_from_hf(tiny_gpt2_hf())
    with pytest.raises(ValueError, match="names 2"):
        with steer(bridge, "resid_post@0-1", torch.randn(32), 1.0):
            pass
    with pytest.raises(ValueError, match="out of range"):
        with steer(bridge, 7, torch.randn(32), 1.0):
            pass
    with pytest.raises(TypeError, match="an int or a hook spec"):
        with steer(bridge, 1.0, torch.randn(32), 1.0):
            pass


def test_harvest_and_the_cli_store_the_hooks_the_spec_names(tmp_path):
    bridge = bridge_from_hf(tiny_gpt2_hf(seed=5))
    tok = toy_tokenizer()
    examples = get_task("coinflip").examples(3, 0, (1, 3))
    store = harvest(bridge, tok, examples, "resid_post@-1,attn_out@0", "all", tmp_path / "api")
    assert store.hooks == [EMBED_HOOK, "blocks.1.hook_resid_post", "blocks.0.hook_attn_out"]
    assert store.hooks == [EMBED_HOOK, *hook_names(bridge, "resid_post@-1,attn_out@0")]
    ckpt = tmp_path / "ckpt"
    tiny_gpt2_hf(seed=5).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    out = tmp_path / "cli"
    assert main(["harvest", "--model", str(ckpt), "--n", "3", "--hooks", "resid_post@-1,attn_out@0", "--out", str(out),
                 "--quiet"]) == 0
    assert json.loads((out / "manifest.json").read_text())["hooks"] == store.hooks
    bad = tmp_path / "bad"
    assert main(["harvest", "--model", str(ckpt), "--n", "3", "--hooks", "resid_post@9", "--out", str(bad),
                 "--quiet"]) == 2
    assert not bad.exists()  # refused before anything is written
