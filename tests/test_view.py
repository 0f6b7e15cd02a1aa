"""The viewer without a browser: the page holds exactly the data it was built from, names nothing
outside itself, agrees with the probe and forced answers it reads, and refuses input that does not
belong to the model."""

import json
import os
import re

import numpy as np
import pytest
import torch

from .viewpages import page

pytestmark = pytest.mark.usefixtures("one_thread")

# Anything that would make a browser reach outside the file: a URL scheme, a protocol-relative
# reference, a stylesheet import or an external src/href.
EXTERNAL = re.compile(r"(?:https?|ftp|wss?)://|(?:src|href)\s*=\s*['\"]?(?!#|data:)[^'\" >]"
                      r"|@import|url\(\s*['\"]?(?!data:)", re.IGNORECASE)


@pytest.mark.slow
def test_page_has_no_external_reference_and_embeds_its_data():
    data, text = page()
    from beliefscope.analyses.view_page import page_data

    assert EXTERNAL.findall(text) == []
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert page_data(text) == json.loads(json.dumps(data))
    assert len(text.encode()) < 2_000_000


@pytest.mark.slow
def test_page_numbers_are_the_probe_and_forced_answers():
    """Recompute one story's readout with the library's own pieces and compare with the page's data."""
    from beliefscope.analyses.forced import forced_answers
    from beliefscope.analyses.view import fit_here, readout
    from beliefscope.models.load import load_model
    from beliefscope.tasks import get_task

    data, _ = page()
    ex = get_task("coinflip", fmt="direct").examples(2, data["seed"], (3, 5))[1]
    assert ex.prompt == data["stories"][1]["prompt"]
    for m in data["models"]:
        model, tok = load_model(m["name"])
        probe, rows, best, _ = fit_here(model, tok, m["name"], "coinflip", 40, data["seed"] + 1)
        panel = data["stories"][1]["models"][m["name"]]
        assert best == m["best"] and [r[0] for r in rows] == m["layers"]
        np.testing.assert_allclose(panel["p"], readout(model, probe, rows, tok(ex.prompt)["input_ids"]), atol=6e-4)
        fa = forced_answers(model, tok, ex)
        assert panel["boundaries"] == fa.positions.tolist()
        np.testing.assert_allclose(panel["forced"], fa.p_state, atol=6e-4)
        assert panel["truth"] == ex.labels(tok, text=ex.prompt).state.tolist()
        assert ("thought" in panel) == m["thinking"]
        if m["thinking"]:
            assert panel["thought"] == fa.thought_state.tolist()


def test_decode_trace_matches_the_cache():
    data, _ = page()
    dec = data["decode"]
    assert dec["model"] == "target"  # the first model that writes no thoughts
    for r in dec["stories"]:
        n = r["prompt_len"]
        assert set(r["provenance"][:n]) == {0}  # the prompt: prefill
        assert set(r["provenance"][n:]) <= {2, 4}  # every committed decoded position: the verifier's or accepted
        assert r["provenance"].count(4) == sum(len(st["committed"]) - 1 for st in r["steps"])  # accepted drafts
        for st in r["steps"]:
            assert st["accepted"] + len(st["rejected"]) == len(st["drafted"])
            assert st["committed"][:st["accepted"]] == st["drafted"][:st["accepted"]]
        # the first decoded token is the prefill's prediction; every later one was committed by a verify step
        assert 1 + sum(len(st["committed"]) for st in r["steps"]) == len(r["tokens"]) - n
        assert r["step_of"][:n + 1] == [-1] * (n + 1) and min(r["step_of"][n + 1:]) >= 0


@pytest.mark.slow
def test_n_way_page_has_every_state():
    data, text = page("cups")
    assert data["state_names"] == ["left", "middle", "right"]
    assert len(data["state_colours"]) == 3 and len(set(data["state_colours"])) == 3
    p = np.asarray(data["stories"][0]["models"]["thinking-cups"]["p"])
    assert p.shape[-1] == 3 and np.allclose(p.sum(-1), 1, atol=3e-3)
    assert EXTERNAL.findall(text) == []


def test_refuses_stories_of_another_task():
    from beliefscope.analyses.view import ViewConfig, build

    with pytest.raises(ValueError, match="trained on the 'coinflip' task, not 'cups'"):
        build(ViewConfig(models=("thinking",), task="cups"))


def _foreign_probe(folder, d_model=128, hash_="0" * 16, rendering="toy", names=("heads", "tails")):
    from beliefscope.probes.linear import LinearProbe

    hooks = ["hook_embed", "blocks.0.hook_resid_post"]
    k = len(names)
    LinearProbe(hooks=hooks, mean=torch.zeros(2, d_model), std=torch.ones(2, d_model),
                W=torch.zeros(2, d_model, 1 if k == 2 else k), b=torch.zeros(2, 1 if k == 2 else k), n_classes=k,
                meta={"model": "another model", "state_names": list(names),
                      "harvest_config": {"checkpoint_hash": hash_, "rendering": rendering}}).save(str(folder))
    return str(folder)


def test_refuses_a_probe_of_another_model_rendering_or_task(tmp_path):
    from beliefscope.analyses.view import ViewConfig, build
    from beliefscope.models.load import load_model
    from beliefscope.probes.harvest import checkpoint_hash

    cfg = {"models": ("target",), "n": 1, "events": "2-3", "decode": ""}
    with pytest.raises(ValueError, match="checkpoint hash"):
        build(ViewConfig(**cfg, probes=(_foreign_probe(tmp_path / "a"),)))
    own = checkpoint_hash(load_model("target")[0])
    with pytest.raises(ValueError, match="'natural' rendering"):
        build(ViewConfig(**cfg, probes=(_foreign_probe(tmp_path / "b", hash_=own, rendering="natural"),)))
    with pytest.raises(ValueError, match="reads states"):
        build(ViewConfig(**cfg, probes=(_foreign_probe(tmp_path / "c", hash_=own, names=("a", "b", "c")),)))
    with pytest.raises(ValueError, match="one per model"):
        build(ViewConfig(models=("target", "thinking"), probes=("x",)))


def test_cli_writes_the_page_from_another_folder(tmp_path, monkeypatch, capsys):
    from beliefscope.cli import main

    monkeypatch.chdir(tmp_path)
    rc = main(["view", "--model", "target", "--task", "coinflip", "--events", "2-3", "--n", "1", "--n-train", "30",
               "--max-new-tokens", "6", "--out", "view.html", "--json", "--no-progress"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert os.path.getsize(tmp_path / "view.html") == res["bytes"]
    assert EXTERNAL.findall((tmp_path / "view.html").read_text()) == []


def test_summary_names_the_event_counts_of_the_stories_shown():
    """The heading counts the events of the stories on the page: a --data run's stories are not the
    requested --events band (it once read "9-16 events" over stories of 3-6)."""
    from beliefscope.analyses.view_page import summary_sentence

    data = {"task": "data:location", "events": "9-16", "stories": [{"n_events": 3}, {"n_events": 6}],
            "models": [{"name": "m", "layers": [27], "best": 0, "probe_accuracy_at_best": 0.65}]}
    assert summary_sentence(data).startswith("Over 2 data:location stories (3-6 events), m's probe at layer 27 "
                                             "follows the truth on 65%")
