"""The logit lens and the tuned lens against references: the HF model's own logits (an uncached forward of the
plain HF model, before any wrapping) and its own hidden states decoded by hand; bad input refused before any
forward, naming the fix."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

import beliefscope as bs
from beliefscope.hooks.names import hf_of
from beliefscope.models.testing import tiny_gpt2
from beliefscope.probes.lens import LensDecoder, class_token_ids, logit_lens, read_residuals, residuals
from beliefscope.probes.tuned_lens import TunedLens, TunedLensConfig, train_tuned_lens
from beliefscope.probes.twin import checkpoint_hash
from tests.architectures import configs, tokenizer

TOL = 1e-5
IDS = [[1, 5, 7, 3, 9, 11, 2, 8, 4, 6, 10, 12, 3, 5]]


def _hf(arch: str, seed: int = 0, **override):
    cfg_cls, model_cls, kw = configs()[arch]
    torch.manual_seed(seed)
    return model_cls(cfg_cls(**{**kw, **override})).eval()


def _hand(hf, h: torch.Tensor) -> torch.Tensor:
    """The HF model's own final norm and unembedding on ``h``, and the softcap written out by hand."""
    base = hf.base_model
    norm = getattr(base, "norm", None) or base.ln_f
    z = hf.lm_head(norm(h))
    cap = getattr(hf.config, "final_logit_softcapping", None)
    return cap * torch.tanh(z / cap) if cap else z


@pytest.mark.parametrize("arch,override", [("GPT-2", {}), ("Qwen2", {}), ("Llama", {}),
                                           ("Gemma2 (sliding)", {"final_logit_softcapping": 0.05})])
def test_last_layer_is_the_model_and_every_layer_its_hidden_state(arch, override):
    hf = _hf(arch, **override)
    ids = torch.tensor(IDS)
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)  # the plain HF model, uncached, before any wrapping
        hand = [_hand(hf, h) for h in ref.hidden_states[1:-1]]  # blocks 0..L-2: their outputs, decoded by hand
    model, _ = bs.load_model(copy.deepcopy(hf), tokenizer=tokenizer())
    L = model.cfg.n_layers
    resid, logits = residuals(model, ids, list(range(L)))
    dec = LensDecoder(model)
    with torch.no_grad():
        last = dec(resid[L - 1])
        assert float((last - ref.logits).abs().max()) < TOL
        assert float((logits - ref.logits).abs().max()) < TOL
        for layer, want in enumerate(hand):
            assert float((dec(resid[layer]) - want).abs().max()) < TOL
    r = logit_lens(model, ids[0], layers="all")
    assert r.max_delta < TOL and float(np.abs(r.kl[-1]).max()) < 1e-5
    assert (r.top_id[-1] == ref.logits[0].argmax(-1).numpy()).all()


def test_gemma2_softcap_is_applied():
    """A cap of 0.05 squeezes every logit into (-0.05, 0.05): the lens is right only because it applies it."""
    hf = _hf("Gemma2 (sliding)", final_logit_softcapping=0.05)
    ids = torch.tensor(IDS)
    with torch.no_grad():
        ref = hf(ids).logits
    model, _ = bs.load_model(copy.deepcopy(hf), tokenizer=tokenizer())
    resid, _ = residuals(model, ids, [model.cfg.n_layers - 1])
    dec = LensDecoder(model)
    assert dec.softcap == 0.05
    with torch.no_grad():
        uncapped = dec.unembed(dec.norm(resid[0]))
        assert float((uncapped - ref).abs().max()) > 0.1  # without the cap the last layer would be wrong
        assert float((dec(resid[0]) - ref).abs().max()) < TOL


def test_toy_target_and_class_words():
    model, tok = bs.load_model("target")
    text = "A coin is heads . Alice flips . Bob stays . State ?"
    ids = tok(text)["input_ids"]
    r = logit_lens(model, ids, tok=tok, classes=["heads", "tails"])
    with torch.no_grad():
        logits = model(torch.tensor([ids]), return_type="logits")[0]  # [T, V]
    ans = [tok.convert_tokens_to_ids(w) for w in ("heads", "tails")]
    want = torch.softmax(logits[:, ans], -1).numpy()  # what a forced answer reads at every position
    assert r.max_delta < TOL
    np.testing.assert_allclose(r.class_share[-1], want, atol=1e-5)
    np.testing.assert_allclose(r.class_p[-1], torch.softmax(logits, -1)[:, ans].numpy(), atol=1e-6)
    assert r.class_names[int(r.class_share[-1, -1].argmax())] == "tails"


def _forwards(model):
    count = [0]
    handle = hf_of(model).register_forward_pre_hook(lambda *a: count.__setitem__(0, count[0] + 1))
    return count, handle


def test_bad_input_refused_before_any_forward(tmp_path):
    model, tok = bs.load_model("target")
    count, handle = _forwards(model)
    try:
        with pytest.raises(ValueError, match=r"layers \[4\] out of range: this model has blocks 0..3.*pass layers"):
            logit_lens(model, [1, 2, 3], layers=[4])
        with pytest.raises(ValueError, match="class word 'heads tails' is 2 tokens.*one token each"):
            logit_lens(model, [1, 2, 3], tok=tok, classes=["heads tails", "tails"])
        other = tiny_gpt2(seed=1, n_embd=128, n_layer=4, vocab=32)
        lens = TunedLens(A=torch.zeros(4, 128, 128), b=torch.zeros(4, 128),
                         meta={"model": "tiny", "checkpoint_hash": checkpoint_hash(other)})
        lens.save(str(tmp_path / "lens"))
        with pytest.raises(ValueError, match="trained on tiny .*beliefscope lens-train --model"):
            logit_lens(model, [1, 2, 3], lens=TunedLens.load(str(tmp_path / "lens")))
        wide = TunedLens(A=torch.zeros(2, 32, 32), b=torch.zeros(2, 32), meta={"model": "tiny"})
        with pytest.raises(ValueError, match="2 blocks of width 32"):
            logit_lens(model, [1, 2, 3], lens=wide)
    finally:
        handle.remove()
    assert count[0] == 0


def test_tuned_lens_translates_then_decodes_and_round_trips(tmp_path):
    model, tok = bs.load_model("target")
    ids = torch.tensor([tok("A coin is tails . Alice flips . State ?")["input_ids"]])
    L, d = model.cfg.n_layers, model.cfg.d_model
    zero = TunedLens(A=torch.zeros(L, d, d), b=torch.zeros(L, d), meta={})
    a, b = logit_lens(model, ids[0], lens=zero), logit_lens(model, ids[0])
    np.testing.assert_array_equal(a.kl, b.kl)  # the identity translator is the logit lens
    g = torch.Generator().manual_seed(0)
    lens = TunedLens(A=0.05 * torch.randn(L, d, d, generator=g), b=0.1 * torch.randn(L, d, generator=g), meta={})
    lens.save(str(tmp_path))
    back = TunedLens.load(str(tmp_path))
    assert torch.equal(back.A, lens.A) and torch.equal(back.b, lens.b)
    r = logit_lens(model, ids[0], lens=back, layers=[1])
    resid, logits = residuals(model, ids, list(range(L)))
    with torch.no_grad():
        h = resid[1, 0]
        lq = torch.log_softmax(LensDecoder(model)(h + h @ lens.A[1] + lens.b[1]), -1)  # by hand
        lp = torch.log_softmax(logits[0], -1)
    np.testing.assert_allclose(r.kl[0], (lp.exp() * (lp - lq)).sum(-1).numpy(), atol=1e-5)
    assert r.tuned


def test_training_lowers_heldout_kl_at_every_layer():
    model, tok = bs.load_model("target")
    texts = [bs.get_task("coinflip").example(seed=s, n_events=5).prompt for s in range(30)]
    lens = train_tuned_lens(model, tok, texts, TunedLensConfig(steps=60, batch_tokens=128, seed=1))
    kl = lens.meta["heldout_kl"]
    assert all(t < 0.5 * g for t, g in zip(kl["tuned"][:-1], kl["logit"][:-1])), kl
    assert kl["tuned"][-1] == kl["logit"][-1] == 0.0  # the last block is the final distribution
    assert lens.meta["n_heldout_texts"] == 6 and lens.meta["checkpoint_hash"] == checkpoint_hash(model)
    # held out by text: the KL table re-read from the held-out texts agrees with the one stored
    lens.check_model(model)
    stats = read_residuals(LensDecoder(model), *_one(model, tok, texts[0]), list(range(4)), lens=lens)
    assert stats["kl"].shape[0] == 4


def _one(model, tok, text):
    resid, logits = residuals(model, torch.tensor([tok(text)["input_ids"]]), list(range(4)))
    return resid[:, 0], logits[0]


def test_class_token_ids_needs_one_token_each():
    tok = tokenizer()
    assert class_token_ids(tok, ["heads", "tails"]) == [tok.convert_tokens_to_ids(w) for w in ("heads", "tails")]
    with pytest.raises(ValueError, match="share a token"):
        class_token_ids(tok, ["heads", "heads"])


def test_cli_lens_and_lens_train(tmp_path, capsys):
    from beliefscope.cli import main

    out = tmp_path / "tuned"
    assert main(["lens-train", "--model", "target", "--n", "20", "--steps", "20", "--batch-tokens", "64",
                 "--out", str(out), "--no-progress"]) == 0
    assert "held-out KL(final || lens)" in capsys.readouterr().out
    assert main(["lens", "--model", "target", "--n", "6", "--tuned", str(out), "--out", str(tmp_path / "lens"),
                 "--json", "--no-progress"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res["in_place"]) == {"logit", "tuned"} and res["in_place"]["logit"]["answer"][-1] == 1.0
    assert res["forced"]["logit"][-1] == 1.0  # the forced answer at the last layer is the model's (right) answer
    assert main(["lens", "--model", "draft", "--n", "2", "--tuned", str(out), "--no-progress"]) == 2
    assert "beliefscope lens-train --model draft" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_last_layer_is_the_model():
    model, tok = bs.load_model("smollm2")
    text = "Box A holds the key. Move the key from Box A to Box C. Where is the key now? It is in Box"
    r = logit_lens(model, text, tok=tok, classes=["A", "B", "C"])
    assert r.max_delta < TOL
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        ref = hf_of(model)(ids).logits[0, -1]
    assert r.class_names[int(r.class_share[-1, -1].argmax())] == ["A", "B", "C"][int(ref[class_token_ids(
        tok, ["A", "B", "C"])].argmax())]
    with pytest.raises(ValueError, match=r"class word .Zorblaxian. is 5 tokens.*one token each"):
        logit_lens(model, text, tok=tok, classes=["Zorblaxian", "A"])


def test_forms_at_needs_the_last_layer_beyond_the_majority_and_its_interval():
    from beliefscope.analyses.lens import forms_at

    assert forms_at([0.5, 0.6, 0.7, 1.0], 0.6, 1.0) == 3  # only the last layer is within 0.05 of 1.0
    assert forms_at([0.9, 0.98, 0.97, 1.0], 0.6, 1.0) == 1
    assert forms_at([0.6, 0.6, 0.5, 0.65], 0.5, 0.45) is None  # the interval reaches the majority
    assert forms_at([0.5, 0.5, 0.5, 0.52], 0.5, 0.5) is None  # never beyond the majority


@pytest.mark.parametrize("argv,fragment", [
    (["--steps", "0"], "steps (--steps) must be at least 1, got 0"),
    (["--heldout", "1.5"], "heldout (--heldout) must be a share between 0 and 1"),
    (["--n", "1"], "--n 1: a tuned lens needs at least 2 texts"),
    (["--data", "no-such.txt"], "--data no-such.txt does not exist"),
])
def test_lens_train_refuses_before_loading(argv, fragment, tmp_path, capsys, monkeypatch):
    from beliefscope.analyses import lens_train
    from beliefscope.cli import main

    monkeypatch.setattr(lens_train, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(["lens-train", "--model", "target", "--out", str(tmp_path / "o"), *argv]) == 2
    assert fragment in capsys.readouterr().err
