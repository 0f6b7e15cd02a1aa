"""Attention to the evidence: the spans against a story worked by hand, the masses against HF's own eager
attention weights (``output_attentions``), which never pass through our hooks."""

from __future__ import annotations

import numpy as np
import torch

import beliefscope as bs
from beliefscope.analyses.lens_attention import evidence_and_distractor, evidence_attention
from beliefscope.models.hf_load import load_hf
from beliefscope.tasks.records import load_data

TEXT = "Box A holds the key. Box B holds the pen. Move the key from Box A to Box C. Move the pen from Box B to Box A."


def test_spans_by_hand():
    rows = [{"text": TEXT, "box": [{"end": 20, "state": "A"}, {"end": 41, "state": "A"}, {"end": 75, "state": "C"},
                                   {"end": len(TEXT), "state": "C"}],
             "question": " Where is the key now? It is in Box"},
            {"text": TEXT, "box": [{"end": 41, "state": "B"}, {"end": 75, "state": "B"},
                                   {"end": len(TEXT), "state": "A"}],
             "question": " Where is the pen now? It is in Box"}]
    data = load_data(rows, events_field=("box",), classes="box=A,B,C")
    ev, di, truth, named = evidence_and_distractor(data.example(0, "box"))
    # the key moved to C in the third sentence; the box named last is A (the fourth sentence names it last)
    assert TEXT[ev[0]:ev[1]].strip() == "Move the key from Box A to Box C."
    assert TEXT[di[0]:di[1]].strip() == "Move the pen from Box B to Box A." and (truth, named) == (2, 0)
    ev, di, truth, named = evidence_and_distractor(data.example(1, "box"))
    assert di is None and truth == named == 0  # the answer is the box named last: nothing to contrast


def test_masses_equal_hf_eager_attention():
    model, tok = bs.load_model("target")
    examples = bs.get_task("coinflip").examples(6, seed=7, events=(2, 5))
    res = evidence_attention(model, tok, examples)
    hf, _ = load_hf("target", "cpu", torch.float32)
    hf.set_attn_implementation("eager")
    ev, di = [], []
    for ex in examples:
        e, d, _, _ = evidence_and_distractor(ex)
        if d is None:
            continue
        enc = tok(ex.prompt, return_offsets_mapping=True)
        off = np.asarray(enc["offset_mapping"])
        with torch.no_grad():
            att = hf(torch.tensor([enc["input_ids"]]), output_attentions=True).attentions  # L x [1, H, T, T]
        last = np.stack([a[0, :, -1].numpy() for a in att])  # [L, H, T]
        inside = [(off[:, 0] < s[1]) & (off[:, 1] > s[0]) & (np.arange(len(off)) > 0) for s in (e, d)]
        ev.append(last[..., inside[0]].sum(-1))
        di.append(last[..., inside[1]].sum(-1))
    assert res["n_scored"] == len(ev) > 0 and res["n_skipped"] == len(examples) - len(ev)
    np.testing.assert_allclose(res["evidence_mass"], np.mean(ev, 0).mean(1), atol=1e-4)
    np.testing.assert_allclose(res["distractor_mass"], np.mean(di, 0).mean(1), atol=1e-4)


def test_tracking_attention_set_is_scorable_and_stratified(tmp_path):
    """tasks/data/tracking_attention.jsonl is what its generator writes, and every story is scored: the evidence is
    not the last sentence, the box named last is not the answer, the evidence's position and the answers vary."""
    import importlib.util
    import os
    from collections import Counter

    from beliefscope.analyses.forced import split_story
    from beliefscope.analyses.lens_attention import sentences_after
    from tests.helpers import ROOT

    spec = importlib.util.spec_from_file_location("gen", os.path.join(ROOT, "docs", "examples",
                                                                      "make_tracking_attention.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    shipped = os.path.join(ROOT, "tasks", "data", "tracking_attention.jsonl")
    with open(gen.main(str(tmp_path / "t.jsonl"))) as a, open(shipped) as b:
        assert a.read() == b.read()  # seeded: byte-identical
    data = load_data(shipped, events_field=("box",))
    assert len(data) == 200 and data.label_names == ["box"]
    after, answers = Counter(), Counter()
    for i in range(len(data)):
        ex = data.example(i, "box")
        evidence, distractor, truth, named = evidence_and_distractor(ex)
        story = split_story(ex)[0]
        assert distractor is not None and named != truth and distractor[1] == len(story)  # the last sentence
        after[sentences_after(story, evidence[1])] += 1
        answers[truth] += 1
    assert set(after) == {1, 2, 3} and min(after.values()) >= 40, after
    assert max(answers.values()) / len(data) < 0.34, answers
