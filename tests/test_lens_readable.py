"""When the answer becomes readable through the lens (`analyses.lens_readable`), checked against references:
the logit lens read by `probes.lens.logit_lens`, the HF model's own logits, the forced answers of
`analyses.forced`, a case summarised by hand, and the two ground-truth models (the lazy toy target: readable only
at the answer position, in its last block; the Thinking States model: at the event boundaries, from block 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import beliefscope as bs
from beliefscope.analyses.forced import forced_answers
from beliefscope.analyses.lens_readable import instrument_lens, lens_answers, readable_from, summarise, tuned_lenses
from beliefscope.hooks.names import hf_of
from beliefscope.probes.lens import class_token_ids, logit_lens

pytestmark = pytest.mark.usefixtures("one_thread")


def test_summary_by_hand():
    # two stories, 3 blocks; kind 0 = boundary, 1 = answer position; the model answers 1,1 | 0 ; 1 | 1
    s1 = {"logit": np.array([[0, 1, 1], [1, 1, 0], [1, 1, 0]]), "answer": np.array([1, 1, 0]),
          "kind": np.array([0, 0, 1])}
    s2 = {"logit": np.array([[0, 1], [1, 1], [1, 1]]), "answer": np.array([1, 1]), "kind": np.array([0, 1])}
    res = summarise([s1, s2], "logit", 3)
    b, a = res["kinds"]["boundary"], res["kinds"]["answer"]
    assert b["n"] == 3 and b["agreement"] == [round(1 / 3, 4), 1.0, 1.0] and b["majority"] == 1.0
    assert b["readable_from"] is None  # agreeing always is no better than naming the model's usual answer
    # the answer positions: s1 reads 1, 0, 0 against its answer 0; s2 reads 1, 1, 1 against 1; majority 1 of 2
    assert a["n"] == 2 and a["agreement"] == [0.5, 1.0, 1.0] and a["majority"] == 0.5
    assert a["interval"][1] == [1.0, 1.0] and a["interval"][0][0] == 0.0 and a["readable_from"] == 1
    assert res["sentence"] == ("the answer becomes readable through the logit lens from layer 1 at the answer "
                               "position, after the question (agreeing with the model's own answer at 1.00 of 2, "
                               "majority 0.50)")
    assert readable_from(s1["logit"], s1["answer"]) == [1, 0, 1]
    assert readable_from(s1["logit"], np.array([1, -1, 1])) == [1, None, None]  # unknown; the last block disagrees


@pytest.fixture(scope="module")
def target():
    return bs.load_model("target")


def test_lens_answers_are_the_logit_lens_and_the_models_answers(target):
    model, tok = target
    ex = bs.get_task("coinflip").example(seed=5, n_events=4)
    r = lens_answers(model, tok, ex)
    ref = logit_lens(model, ex.prompt, tok=tok, classes=ex.state_names)
    np.testing.assert_array_equal(r["logit"], ref.class_share.argmax(-1))
    fa = forced_answers(model, tok, ex)
    assert r["boundaries"] == fa.positions.tolist()
    np.testing.assert_array_equal(r["answer"][fa.positions], fa.p_state.argmax(-1))
    ids = torch.tensor([tok(ex.prompt)["input_ids"]])
    with torch.no_grad():
        own = hf_of(model)(ids).logits[0, -1, class_token_ids(tok, ex.state_names)]
    assert r["answer"][-1] == int(own.argmax()) == int(r["logit"][-1, -1])  # the last block is the model
    off = np.ones(len(r["answer"]), bool)
    off[fa.positions], off[-1] = False, False
    assert (r["answer"][off] == -1).all() and all(r["readable_from"][i] is None for i in np.nonzero(off)[0])


@pytest.mark.parametrize("name,where,layer", [("target", "answer", 3), ("thinking", "boundary", 1)])
def test_ground_truth_models(name, where, layer):
    model, tok = bs.load_model(name)
    exs = bs.get_task("coinflip", fmt="direct").examples(24, 7, (2, 8))
    res = instrument_lens(model, tok, exs)
    kinds = res["logit"]["kinds"]
    assert kinds[where]["readable_from"] == layer
    if name == "target":  # lazy: never at the boundaries; at the question only in the last block
        assert kinds["boundary"]["readable_from"] is None
        assert res["sentence"].startswith("the answer becomes readable through the logit lens from layer 3 at the "
                                          "answer position")
    else:
        assert res["sentence"].startswith("the answer becomes readable through the logit lens from layer 1 at the "
                                          "event boundaries")


def test_tuned_lens_folders_checked_before_any_model(tmp_path):
    with pytest.raises(ValueError, match="--tuned gives 1 folders for 2 models"):
        tuned_lenses(("target", "thinking"), (str(tmp_path),))
    with pytest.raises(ValueError, match=r"--tuned names \['draft'\], not among --models"):
        tuned_lenses(("target", "thinking"), ("draft=x",))
    assert tuned_lenses(("target", "thinking"), ("-", "-")) == {} == tuned_lenses(("target",), ())
    with pytest.raises(FileNotFoundError, match="beliefscope lens-train --model M"):
        tuned_lenses(("target",), (str(tmp_path / "none"),))


def test_viewer_panel_carries_every_layer_lens_answer(target):
    from beliefscope.analyses.view import fit_here, story_panel

    model, tok = target
    ex = bs.get_task("coinflip").example(seed=9, n_events=3)
    probe, rows, _, _ = fit_here(model, tok, "target", "coinflip", 24, 1)
    panel = story_panel(model, tok, probe, rows, ex)
    ref = logit_lens(model, ex.prompt, tok=tok, classes=ex.state_names).class_share.argmax(-1)  # [L, T]
    assert panel["lens"] == ref.T.tolist()
    assert panel["lens_from"] == lens_answers(model, tok, ex)["readable_from"]
