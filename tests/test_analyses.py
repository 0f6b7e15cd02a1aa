"""Analyses on the shipped toy checkpoints: forced answers through forks vs from scratch, probe/model
checks, clear failures that leave nothing behind, and a reduced demo whose summary.json agrees with
the individual commands (`beliefscope eval --json`, `beliefscope probe --json`, `beliefscope beliefs --json`)."""

import json
import os

import numpy as np
import pytest
import torch

from beliefscope.cli import main as cli

from .helpers import DRAFT, TARGET

pytestmark = pytest.mark.usefixtures("one_thread")


def _run_cli(capsys, *argv) -> dict:
    capsys.readouterr()
    assert cli(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


# ------------------------------------------------------------------------------ forced answers
def test_forced_answers_through_fork_equal_recomputation(target):
    from beliefscope.analyses.forced import forced_answers
    from beliefscope.tasks import get_task

    bridge, tok = target
    for ex in get_task("coinflip").examples(4, 99, (3, 10)):
        scratch = forced_answers(bridge, tok, ex, use_fork=False)
        # one fork per boundary, and ragged batches of forks (3 rows: several batches per story)
        for fork in (forced_answers(bridge, tok, ex, use_fork=True, batch_size=1),
                     forced_answers(bridge, tok, ex, use_fork=True, batch_size=3)):
            assert len(fork.positions) == ex.n_events
            np.testing.assert_array_equal(fork.positions, scratch.positions)
            np.testing.assert_allclose(fork.p_state, scratch.p_state, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(fork.true_state, [e.state_after for e in ex.events])


def test_forced_answer_after_last_event_is_the_models_answer(target):
    """The last fork (story + question) is the whole prompt: its argmax is the model's direct answer."""
    from beliefscope.analyses.forced import forced_answers
    from beliefscope.models.evaluate import direct_answers
    from beliefscope.tasks import get_task

    bridge, tok = target
    exs = get_task("coinflip").examples(6, 5, (2, 8))
    answers = direct_answers(bridge.original_model, tok, exs)
    last = [ex.state_names[int(np.argmax(forced_answers(bridge, tok, ex).p_state[-1]))] for ex in exs]
    assert last == answers


# ------------------------------------------------------------------------------ reduced demo
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from beliefscope.analyses.demo import DemoConfig, main

    for path in (TARGET, DRAFT):
        if not os.path.isdir(path):
            pytest.fail(f"{path} is missing: the toy checkpoints are shipped in the repo")
    out = tmp_path_factory.mktemp("demo") / "report"
    torch.manual_seed(0)
    summary = main(DemoConfig(out=str(out), quick=True, progress=False))
    return out, summary


@pytest.mark.slow
def test_demo_writes_report_summary_and_figures(demo):
    out, summary = demo
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    for key in ("eval", "harvest", "probe", "draft_probe", "beliefs", "forced", "trace", "determinism", "steering",
                "timings_seconds", "files"):
        assert key in on_disk, key
    for f in on_disk["files"]:
        assert (out / f).stat().st_size > 1000, f
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len([f for f in on_disk["files"] if f.endswith(".png")])
    assert "src='figures/" not in html and "http" not in html  # self-contained
    # readings are computed from the numbers: the probe reading quotes the best layer's accuracy
    best = next(r for r in on_disk["probe"]["layers"] if r["layer"] == on_disk["probe"]["best_layer"])
    assert f"{100 * best['accuracy']:.1f}%" in html
    assert not [p for p in os.listdir(out.parent) if p.startswith(".report.")]  # no temp folders left


@pytest.mark.slow
def test_demo_summary_matches_eval_and_probe_commands(demo, capsys):
    out, summary = demo
    ev = summary["eval"]
    cli_ev = _run_cli(capsys, "eval", "--model", "target", "--events", ev["events"], "--n", str(ev["n"]),
                      "--seed", str(ev["seed"]), "--json")
    assert {k: ev[k] for k in cli_ev} == cli_ev
    rep = summary["probe"]
    cli_rep = _run_cli(capsys, "probe", "--acts", str(out / "acts" / "target"), "--label", "state",
                       "--folds", str(rep["folds"]), "--train-events", rep["heldout_lengths"]["train_events"],
                       "--no-progress", "--json")
    assert cli_rep["best_layer"] == rep["best_layer"]
    assert cli_rep["store_hash"] == rep["store_hash"]
    for a, b in zip(cli_rep["layers"], rep["layers"], strict=True):
        for k in ("layer", "accuracy", "control_accuracy", "selectivity", "random_init_accuracy"):
            assert a[k] == pytest.approx(b[k], abs=2e-3), (k, a, b)
    assert cli_rep["embedding_accuracy"] == pytest.approx(rep["embedding_accuracy"], abs=2e-3)


@pytest.mark.slow
def test_demo_beliefs_match_the_beliefs_command(demo, capsys, tmp_path):
    out, summary = demo
    b = summary["beliefs"]
    res = _run_cli(capsys, "beliefs", "--model", "target", "--probes", str(out / "probes" / "target"),
                   "--prompt", b["prompt"], "--out", str(tmp_path / "b.png"), "--json")
    assert res["layer"] == b["layer"] == summary["probe"]["best_layer"]
    np.testing.assert_allclose(res["p_state0"], b["p_state0"], atol=1e-3)
    assert res["true_state"] == b["true_state"]
    assert os.path.getsize(tmp_path / "b.png") > 1000 and os.path.getsize(tmp_path / "b-line.png") > 1000


@pytest.mark.slow
def test_demo_numbers_are_internally_consistent(demo):
    _, s = demo
    f = s["forced"]
    assert sum(f["by_event"]["n"]) == f["n_boundaries"]
    t = s["trace"]
    assert t["accepted"] <= t["drafted"] and t["acceptance"] == pytest.approx(t["accepted"] / t["drafted"], abs=1e-4)
    steps = t["featured"]["steps"]
    assert all(len(st["committed"]) == st["accepted"] + 1 or st is steps[-1] for st in steps)
    assert all(st["rejected"] == st["proposals"][st["accepted"]:] for st in steps)
    # the timeline the JSON records is the featured step: its verify row keeps `accepted` drafts as ACCEPTED (4)
    # (or, with none accepted, the verifier's own pending token as VERIFIED, 2) and shows the rejected ones as
    # REJECTED (3) after them
    tl, st = t["featured"]["timeline"], steps[t["featured"]["timeline_step"]] if steps else None
    if st is not None and st["rejected"]:
        name, toks, codes = tl["rows"][2]
        assert name == "verify + rollback" and len(toks) == len(codes)
        before = codes[-len(st["rejected"]) - 1]
        assert codes[-len(st["rejected"]):] == [3] * len(st["rejected"]) and before == (4 if st["accepted"] else 2)
    d = s["determinism"]
    if "skipped" not in d:
        assert d["verified_unique_max"] == 1


# ------------------------------------------------------------------------------ bad input
@pytest.mark.slow  # the demo fixture: the quick demo, about 40 s
def test_probe_from_another_model_is_refused_and_nothing_is_written(demo, tmp_path):
    from beliefscope.analyses.beliefs import BeliefsConfig, main

    out, summary = demo
    draft_probe = str(out / "probes" / "draft")  # fitted on the draft model (d_model 64)
    with pytest.raises(ValueError, match="trained on .*d_model 64"):
        main(BeliefsConfig(model="target", probes=draft_probe, prompt=summary["beliefs"]["prompt"],
                           out=str(tmp_path / "b.png")))
    assert not os.listdir(tmp_path)


@pytest.mark.slow  # the demo fixture: the quick demo, about 40 s
def test_probe_of_same_shape_other_weights_is_refused(demo, target):
    from beliefscope.analyses.common import check_probe_matches, load_probe
    from beliefscope.probes.harvest import random_init_like

    out, _ = demo
    probe = load_probe(str(out / "probes" / "target"))
    check_probe_matches(probe, target[0], "target")  # its own model passes
    twin = random_init_like(target[0], seed=3)  # same shape, other weights
    with pytest.raises(ValueError, match="checkpoint hash"):
        check_probe_matches(probe, twin, "random twin")


def test_unparsable_prompt_fails_clearly_before_loading(tmp_path, capsys):
    rc = cli(["beliefs", "--model", "target", "--task", "coinflip", "--probes", str(tmp_path / "none"), "--prompt",
              "A coin is heads . Alice juggles . State ?", "--out", str(tmp_path / "b.png")])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot parse the prompt at character 17" in err and "Traceback" not in err
    assert not os.listdir(tmp_path)


def test_unwritable_output_folder_fails_before_any_work(tmp_path, capsys, monkeypatch):
    from beliefscope.analyses import demo

    (tmp_path / "file.txt").write_text("x")
    monkeypatch.setattr(demo, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    rc = cli(["demo", "--out", str(tmp_path / "file.txt" / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "file.txt is a file, not a folder" in err
    assert sorted(os.listdir(tmp_path)) == ["file.txt"]


def test_demo_failing_midway_leaves_no_partial_report(tmp_path, monkeypatch):
    from beliefscope.analyses import demo
    from beliefscope.analyses.demo import DemoConfig, main

    def broken(*a, **k):
        raise RuntimeError("simulated failure in eval")

    monkeypatch.setattr(demo, "evaluate", broken)  # the name demo calls
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "old.txt").write_text("previous run")
    with pytest.raises(RuntimeError, match="simulated"):
        main(DemoConfig(out=str(tmp_path / "report"), quick=True, progress=False))
    assert sorted(os.listdir(tmp_path)) == ["report"]  # no temp folder left
    assert os.listdir(tmp_path / "report") == ["old.txt"]  # the previous report is untouched


@pytest.mark.slow
def test_sigterm_during_a_staged_run_leaves_nothing(tmp_path):
    import subprocess
    import sys
    import time

    code = ("import time, sys\nfrom beliefscope.analyses.common import staged_output\n"
            f"with staged_output({str(tmp_path / 'out')!r}) as tmp:\n"
            "    open(tmp + '/partial.txt', 'w').write('x'); print('ready', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.stdout.readline().strip() == "ready"
    assert len(os.listdir(tmp_path)) == 1  # the temporary folder exists while the run is going
    proc.terminate()
    proc.wait(timeout=20)
    time.sleep(0.1)
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_demo_leads_with_thinking_and_links_the_viewer(demo):
    """Sections: the validated instrument on thinking first, the lazy target, decoding, the viewer last;
    the viewer's page sits beside the report, self-contained, and its sentence quotes its numbers."""
    import re

    from beliefscope.analyses.view_page import page_data

    out, summary = demo
    html = (out / "report.html").read_text()
    titles = re.findall(r"<h2 id='s\d+'>(.*?)</h2>", html)
    assert titles[0].startswith("The validated instrument: thinking") and titles[-1].startswith("The belief viewer")
    assert titles.index("Speculative decoding: draft, verify, rollback") > max(
        titles.index(t) for t in titles if t.startswith(("Linear probes", "Belief trajectory", "Forced answers")))
    c = summary["thinking_instrument"]["models"]["thinking"]["causal"]
    assert f"{100 * c['answer_flip_rate_swap']:.1f}%" in html
    page = (out / "view.html").read_text()
    assert not re.search(r"(?:https?|wss?|ftp)://", page) and summary["view"]["bytes"] == len(page.encode())
    data = page_data(page)
    assert [m["name"] for m in data["models"]] == ["thinking", "target"]
    for m in data["models"]:
        assert f"{100 * m['probe_accuracy_at_best']:.1f}%" in html
