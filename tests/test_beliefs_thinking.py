"""`beliefscope beliefs` on a Thinking States model draws its own beliefs without a probe: the
thoughts it reports are the ones `decoding.thinking.run_thinking` writes (an independent path, with
the KV cache), the truth is counted here by hand, and a model without thoughts still needs a probe."""

import os

import pytest

from beliefscope.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "A coin is heads . Alice flips . Bob stays . Carol flips . Dave flips . State ?"


def test_thinking_beliefs_without_probe(tmp_path, capsys):
    import json

    from beliefscope.decoding.thinking import run_thinking
    from beliefscope.models.load import load_model

    out = tmp_path / "b.png"
    assert main(["beliefs", "--model", "thinking", "--prompt", PROMPT, "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    state, truth = 0, []
    for kind in ("flips", "stays", "flips", "flips"):  # heads, then each event by hand
        state ^= kind == "flips"
        truth.append(("heads", "tails")[state])
    assert res["truth_at_boundaries"] == truth and res["answer"] == truth[-1]
    model, tok = load_model("thinking", device="cpu")
    run = run_thinking(model, tok(PROMPT)["input_ids"], max_new_tokens=2)
    written = [tok.decode(z[:1]).strip() for _, z in run.thoughts]  # first word of each chunk's thought
    assert written[0] == "heads"  # the intro's chunk: the initial state
    written = written[1:]  # one per event
    assert res["thoughts"] == written and len(written) == 4
    assert res["thought_accuracy"] == sum(a == b for a, b in zip(written, truth)) / 4
    lens = str(tmp_path / "b-lens.png")  # the logit lens at every block and token (analyses.lens_readable)
    assert os.path.getsize(out) > 10_000 and res["files"] == [str(out), lens] and os.path.getsize(lens) > 10_000
    # the lens at the last block and the answer position is the model's answer, read there in place; the forced
    # answer after the last event runs the same prompt chunk by chunk (`thinking_readouts`): the two agree
    assert res["lens"][-1][-1] == res["forced"][-1] and len(res["lens"]) == len(res["tokens"])
    assert res["lens_readable_from"][-1] is not None


def test_model_without_thoughts_needs_a_probe(tmp_path, capsys):
    assert main(["beliefs", "--model", "target", "--prompt", PROMPT, "--out", str(tmp_path / "b.png")]) == 2
    assert "writes no thoughts" in capsys.readouterr().err and not os.listdir(tmp_path)
