"""A tuned lens trained from an activation store (`probes.tuned_lens_store`) against one trained from the texts.

The reference: `train_tuned_lens` on the same texts, captured in memory. A float32 store harvested one prompt per
forward holds exactly the residuals `hooks.capture` gives (checked first: max |delta| = 0), the split is by prompt
with the same seed, the rows are taken in the same order, and the final distribution is the stored last residual
through the model's own decoder, which equals the model's logits exactly on the toy target (tests/test_lens.py).
Identical float32 inputs through the same deterministic CPU operations in the same order give identical bits, so
the tolerance is 0: the two lenses and their held-out KL tables must be equal, not close.
"""

from __future__ import annotations

import pytest
import torch

import beliefscope as bs
from beliefscope.probes.harvest import harvest
from beliefscope.probes.lens import residuals
from beliefscope.probes.store import ActivationStore
from beliefscope.probes.tuned_lens import TunedLensConfig, train_tuned_lens
from beliefscope.probes.tuned_lens_store import check_store, train_tuned_lens_from_store


@pytest.fixture(scope="module")
def target():
    return bs.load_model("target")


@pytest.fixture(scope="module")
def examples():
    return bs.get_task("coinflip", rendering="toy").examples(14, 5, (1, 5))


@pytest.fixture(scope="module")
def store(target, examples, tmp_path_factory):
    model, tok = target
    out = str(tmp_path_factory.mktemp("acts") / "target")
    harvest(model, tok, examples, "resid_post", "all", out, batch_size=1, shard_rows=64)
    return ActivationStore.open(out)


def test_store_training_equals_text_training(target, examples, store):
    model, tok = target
    texts = [ex.text for ex in examples]
    lab = store.load_labels(["prompt_id", "position", "token_id"])
    hooks = [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]
    for j in (0, 7):  # the store holds the tokens train_tuned_lens reads, and their residuals exactly
        rows = (lab["prompt_id"] == j).nonzero()[0]
        rows = rows[lab["position"][rows].argsort()]
        ids = tok(texts[j])["input_ids"]
        assert lab["token_id"][rows].tolist() == ids
        resid, _ = residuals(model, torch.tensor([ids]), list(range(model.cfg.n_layers)))  # [L, 1, T, d]
        stored = torch.stack([store.load_hook(h)[torch.as_tensor(rows)] for h in hooks])  # [L, T, d]
        assert float((stored - resid[:, 0]).abs().max()) == 0.0
    cfg = TunedLensConfig(steps=12, batch_tokens=48, seed=3, max_tokens=150)
    ref = train_tuned_lens(model, tok, texts, cfg)
    got = train_tuned_lens_from_store(model, store, cfg)
    assert got.meta["train_tokens"] == ref.meta["train_tokens"] == 150
    assert got.meta["n_heldout_texts"] == ref.meta["n_heldout_texts"] == 3
    assert got.meta["heldout_tokens"] == ref.meta["heldout_tokens"]
    assert torch.equal(got.A, ref.A) and torch.equal(got.b, ref.b)
    assert float(got.A.abs().max()) > 0  # it trained
    assert got.meta["heldout_kl"] == ref.meta["heldout_kl"]
    assert sum(got.meta["heldout_kl"]["tuned"]) < sum(got.meta["heldout_kl"]["logit"])
    assert got.meta["store"] == store.path


def test_store_of_another_model_or_without_every_block_is_refused(target, examples, store, tmp_path):
    model, tok = target
    draft, _ = bs.load_model("draft")
    with pytest.raises(ValueError, match=r"harvested from .*checkpoint hash.*pass --model .*beliefscope harvest "
                                         r"--model draft --hooks resid_post --layers all"):
        check_store(draft, store, "draft")
    out = str(tmp_path / "last")
    harvest(model, tok, examples[:3], "resid_post@-1", "all", out)
    with pytest.raises(ValueError, match=r"lacks 3 of the 4 blocks' residuals \(e.g. blocks.0.hook_resid_post\).*"
                                         r"--layers all"):
        train_tuned_lens_from_store(model, out, TunedLensConfig(steps=1))


def test_cli_lens_train_from_a_store(store, tmp_path, capsys, monkeypatch):
    from beliefscope.analyses import lens_train
    from beliefscope.cli import main

    assert main(["lens-train", "--model", "target", "--acts", store.path, "--steps", "3", "--batch-tokens", "32",
                 "--out", str(tmp_path / "tuned"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "11 texts" in out and "held-out KL(final || lens)" in out and "(read " in out
    monkeypatch.setattr(lens_train, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(["lens-train", "--model", "target", "--acts", store.path, "--data", "x.txt",
                 "--out", str(tmp_path / "o")]) == 2
    assert "trains on the store's prompts: leave out --data and --n" in capsys.readouterr().err
    none = str(tmp_path / "none")
    assert main(["lens-train", "--model", "target", "--acts", none, "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
