"""One vocabulary of results: the CLI's JSON carries the Python objects' names, types and None (null)."""

from __future__ import annotations

import json

import pytest
import torch

from beliefscope.cache import Provenance
from beliefscope.cli import main as cli

PROMPT = "A coin is heads . Alice flips . Bob stays . Think :"


def _json(capsys, *argv) -> dict:
    capsys.readouterr()
    assert cli([*argv, "--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_is_the_generation_summary(capsys, target):
    from beliefscope.decoding import SpecConfig, make_drafter, speculative_generate

    bridge, tok = target
    ids = torch.tensor(tok(PROMPT)["input_ids"])
    gen = speculative_generate(bridge, make_drafter("ngram:3", bridge), ids, SpecConfig(gamma=4, max_new_tokens=12))
    res = _json(capsys, "generate", "--model", "target", "--drafter", "ngram:3", "--gamma", "4",
                "--max-new-tokens", "12", "--prompt", PROMPT)
    assert res["tokens"] == gen.tokens and res["tokens_per_step"] == gen.tokens_per_step  # a list in both
    assert isinstance(res["tokens_per_step"], list) and res["mean_tokens_per_step"] == gen.mean_tokens_per_step
    assert res["gamma"] == 4 and isinstance(res["gamma"], int)
    assert res["alpha"] == gen.alpha and res["gammas"] == gen.gammas


def test_nothing_drafted_is_null_in_json_and_none_in_python(capsys, target):
    from beliefscope.decoding import SpecConfig, make_drafter, speculative_generate

    bridge, tok = target
    gen = speculative_generate(bridge, make_drafter("none", bridge), torch.tensor(tok(PROMPT)["input_ids"]),
                               SpecConfig(max_new_tokens=4))
    res = _json(capsys, "generate", "--model", "target", "--max-new-tokens", "4", "--prompt", PROMPT)
    assert gen.alpha is None and res["alpha"] is None and res["tokens"] == gen.tokens


def test_eval_by_event_tables_share_their_event_counts(capsys):
    res = _json(capsys, "eval", "--model", "target", "--n", "12", "--events", "1-8")
    assert set(res["answer_accuracy_by_events"]) == set(res["exact_match_by_events"])
    # hand check: the counts come from the 12 prompts' own stories
    from beliefscope.tasks import get_task

    assert set(res["answer_accuracy_by_events"]) == {str(e.n_events) for e in
                                                     get_task("coinflip").examples(12, res["seed"], (1, 8))}


def test_trace_timeline_cells_agree_with_the_step(target):
    from beliefscope.analyses.spec_trace import timeline_stages
    from beliefscope.decoding import SpecConfig, make_drafter, speculative_generate

    bridge, tok = target
    ids = tok("A coin is heads . Alice flips . Bob flips . Carol flips . Dan stays . Think :")["input_ids"]
    gen = speculative_generate(bridge, make_drafter("draft:draft", bridge), torch.tensor(ids),
                               SpecConfig(gamma=4, max_new_tokens=24, trace=True, keep_rejected=True))
    assert any(st.accepted < len(st.proposals) for st in gen.trace.steps)  # some drafts were rolled back
    for i, st in enumerate(gen.trace.steps):
        rows, _ = timeline_stages(tok, gen, ids, i)
        drafted = rows[1][2].count(int(Provenance.DRAFT))
        rolled = rows[2][2].count(int(Provenance.REJECTED))
        assert drafted == len(st.proposals) and rolled == len(st.proposals) - st.accepted, (i, rows)


@pytest.mark.slow
def test_json_is_pure_and_quiet_is_silent(tmp_path):
    """In a fresh process: stdout is exactly one JSON object, and --quiet leaves stderr empty (no loading
    bars or warnings); without --quiet the progress goes to stderr, never stdout (a shipped toy loads without
    transformers' bar: `models.hf_load.no_bar_if_small`)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "beliefscope", "harvest", "--model", "target", "--n", "3", "--out", "acts", "--json"]
    quiet = subprocess.run([*cmd, "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert set(json.loads(quiet.stdout)) == {"acts", os.path.join("acts", "random_init")}
    loud = subprocess.run([*cmd[:-2], "acts2", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert loud.returncode == 0 and json.loads(loud.stdout) and "acts2: about" in loud.stderr  # its size estimate
