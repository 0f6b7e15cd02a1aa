"""Your own data end to end from the command line, on a tiny random Llama folder built from a config (not
SmolLM2, not a shipped checkpoint): harvest, probe, beliefs, forced, instrument and view; the numbers are
checked against scikit-learn and against the JSON each command prints; bad input leaves nothing on disk."""

import json
import os

import numpy as np
import pytest

from beliefscope.cli import main as cli

from .tiny_llama import tiny_llama_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tasks", "data", "locations.jsonl")
Q = " Where is it now? It is in the"


def _run(capsys, *argv) -> dict:
    capsys.readouterr()
    assert cli([*argv, "--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The tiny model, a store of every record with two labels, and a location probe."""
    tmp = tmp_path_factory.mktemp("chain")
    texts = [json.loads(line)["text"] for line in open(DATA)]
    model = tiny_llama_folder(str(tmp / "tiny"), texts)
    acts, probes = str(tmp / "acts"), str(tmp / "probes")
    assert cli(["harvest", "--model", model, "--data", DATA, "--events-field", "location", "--label-field", "negated",
                "--out", acts, "--quiet"]) == 0
    assert cli(["probe", "--acts", acts, "--label", "location", "--out", probes, "--quiet"]) == 0
    return tmp, model, acts, probes


@pytest.mark.slow
def test_store_keeps_names_and_labels(chain):
    from beliefscope.probes.store import ActivationStore
    from beliefscope.tasks.records import load_data

    _, _, acts, _ = chain
    store = ActivationStore.open(acts)
    rooms = ["bedroom", "garden", "hall", "kitchen"]
    assert store.manifest["label_classes"] == {"location": rooms, "negated": ["no", "yes"],
                                               "location_last_named": rooms, "negated_last_named": ["no", "yes"]}
    data = load_data(DATA, events_field=("location",), label_field=("negated",))
    lab = store.load_labels(["prompt_id", "location", "negated", "state"])
    assert (lab["state"] == lab["location"]).all()  # the first label is the store's state
    # per record: every event's state appears at its completing token; a per-text label on exactly one token
    for pid in (0, 7, 33):
        rows = lab["prompt_id"] == pid
        assert (lab["negated"][rows] >= 0).sum() == 1
        rec = json.loads(open(DATA).readlines()[pid])
        assert lab["negated"][rows][-1] == data.classes["negated"].index(rec["negated"])
        want = [data.classes["location"].index(e["state"]) for e in rec["location"]]
        loc = lab["location"][rows]
        seen = [v for k, v in enumerate(loc) if v >= 0 and (k == 0 or loc[k - 1] != v)]
        assert seen == [w for k, w in enumerate(want) if k == 0 or want[k - 1] != w]
    twin = ActivationStore.open(os.path.join(acts, "random_init"))
    assert twin.manifest["config"]["random_init_seed_used"] == 1  # the tiny model is seed 0: its twin must not be
    assert twin.manifest["checkpoint_hash"] != store.manifest["checkpoint_hash"]


@pytest.mark.slow
def test_probe_on_data_matches_sklearn(chain, capsys):
    """The batched torch trainer's per-layer out-of-fold accuracy equals scikit-learn's (±0.01)."""
    _, _, acts, _ = chain
    t = _run(capsys, "probe", "--acts", acts, "--label", "location", "--no-random-init")
    s = _run(capsys, "probe", "--acts", acts, "--label", "location", "--no-random-init", "--trainer", "sklearn")
    assert t["class_names"] == ["bedroom", "garden", "hall", "kitchen"] and t["positions"] == "labelled"
    for a, b in zip(t["layers"], s["layers"], strict=True):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=0.01)
        assert a["control_accuracy"] == pytest.approx(b["control_accuracy"], abs=0.01)
    assert "heldout_split_accuracy" in t["layers"][0]  # the split field's test records
    one = _run(capsys, "probe", "--acts", acts, "--label", "negated", "--layers", "1", "--no-random-init")
    assert [r["layer"] for r in one["layers"]] == [1] and one["n_rows"] == 160  # one token per training record


@pytest.mark.slow
def test_beliefs_accuracy_is_the_argmax_over_every_class(chain, capsys):
    tmp, model, _, probes = chain
    res = _run(capsys, "beliefs", "--model", model, "--probes", probes, "--data", DATA, "--index", "5",
               "--out", str(tmp / "b.png"))
    assert res["state_names"] == ["bedroom", "garden", "hall", "kitchen"] and res["label"] == "location"
    pos = [p for p in res["positions"] if "truth" in p]
    hand = np.mean([p["pred"] == p["truth"] for p in pos])
    # "pred" is the argmax of the unrounded distribution; where the rounded one has a unique maximum it agrees
    for p in pos:
        if sorted(p["p"])[-1] > sorted(p["p"])[-2]:
            assert p["pred"] == res["state_names"][int(np.argmax(p["p"]))]
    assert res["accuracy_at_layer"] == pytest.approx(hand, abs=1e-4) and len(pos) == res["scored_tokens"] > 0
    free = _run(capsys, "beliefs", "--model", model, "--probes", probes, "--prompt", "The hat is in the den.",
                "--out", str(tmp / "b2.png"))
    assert free["accuracy_at_layer"] is None and all("truth" not in p for p in free["positions"])
    # the wrong truth for this probe is refused, before anything is written
    assert cli(["beliefs", "--model", model, "--probes", probes, "--task", "coinflip", "--out", str(tmp / "b3.png"),
                "--prompt", "A coin's state is heads. Alice flips the coin. What's the state? A:", "--quiet"]) == 2
    assert "states" in capsys.readouterr().err and not os.path.exists(tmp / "b3.png")


@pytest.mark.slow
def test_forced_instrument_and_view_on_data(chain, capsys):
    tmp, model, _, probes = chain
    f = _run(capsys, "forced", "--model", model, "--probes", probes, "--data", DATA, "--events-field", "location",
             "--question", Q, "--n", "12")
    assert f["n_prompts"] == 12 and f["state_names"] == ["bedroom", "garden", "hall", "kitchen"]
    assert 0 <= f["forced_accuracy"] <= 1 and sum(f["by_event"]["n"]) == f["n_boundaries"]
    # the probe was fitted on these records: each is read by the fold probe that did not see it (it was the final
    # probe, fitted on all of them, before)
    held = sum(json.loads(line).get("split") == "test" for line in open(DATA).readlines()[:12])
    assert held > 0 and f["scored_on"] == {"out-of-fold": 12 - held, "held-out": held}
    inst = _run(capsys, "instrument", "--models", model, "--data", DATA, "--events-field", "location",
                "--question", Q, "--out", str(tmp / "inst"))
    m = inst["models"][model]
    band = m["bands"]["all"]
    assert {"probe_accuracy", "forced_accuracy", "control_accuracy", "majority_accuracy"} <= set(band)
    assert m["random_init_probe_accuracy"] is not None and m["verdict"].startswith(model)
    assert os.path.exists(tmp / "inst" / "instrument.md")
    v = _run(capsys, "view", "--model", model, "--probes", probes, "--data", DATA, "--events-field", "location",
             "--question", Q, "--n", "3", "--out", str(tmp / "view.html"))
    assert v["n_stories"] == 3 and os.path.getsize(tmp / "view.html") > 10_000


@pytest.mark.slow
def test_bad_input_writes_nothing(chain, tmp_path, capsys):
    _, model, _, _ = chain
    cases = {
        "missing.jsonl": (None, "does not exist"),
        "nofield.jsonl": ([{"body": "x"}], "no text field 'text'"),
        "late.jsonl": ([{"text": "abc", "events": [{"end": 9, "state": "a"}]}], "past the end"),
        "dup.jsonl": ([{"id": 1, "text": "a", "events": [{"end": 1, "state": "x"}]},
                       {"id": 1, "text": "b", "events": [{"end": 1, "state": "x"}]}], "share the id"),
        "long.jsonl": ([{"text": "The key is in the hall. " * 200, "events": [{"end": 23, "state": "hall"}]},
                        {"text": "The key is in the den.", "events": [{"end": 22, "state": "den"}]}],
                       "more than the model's context of 512"),
    }
    for name, (rows, words) in cases.items():
        path = tmp_path / name
        if rows is not None:
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = tmp_path / f"out-{name}"
        assert cli(["harvest", "--model", model, "--data", str(path), "--out", str(out), "--quiet"]) == 2, name
        assert words in capsys.readouterr().err, name
        assert not out.exists(), name
    for flag, key in (("--skip-long", "skipped"), ("--truncate", "truncated")):
        res = _run(capsys, "harvest", "--model", model, "--data", str(tmp_path / "long.jsonl"), "--no-random-init",
                   "--out", str(tmp_path / key), flag)
        (r,) = res.values()
        assert r[key] == 1 and r["records"] == (1 if key == "skipped" else 2) and r["complete"]


def test_python_reads_refuse_another_model(chain):
    from beliefscope.analyses.beliefs import trajectory
    from beliefscope.analyses.common import load_probe
    from beliefscope.models.load import load_model

    tmp, _, _, probes = chain
    texts = [json.loads(line)["text"] for line in open(DATA)]
    other = tiny_llama_folder(str(tmp / "other"), texts, seed=3)  # same width and hooks, other weights
    bridge, tok = load_model(other)
    with pytest.raises(ValueError, match="checkpoint hash"):
        trajectory(bridge, tok, load_probe(probes), "The key is in the hall.")


@pytest.mark.slow
def test_store_round_trips_through_a_hf_dataset(chain, tmp_path):
    from beliefscope.probes.store import ActivationStore, from_hf_dataset, to_hf_dataset

    _, _, acts, _ = chain
    store = ActivationStore.open(acts)
    back = from_hf_dataset(to_hf_dataset(store), str(tmp_path / "back"))
    assert back.hash == store.hash and back.n_rows == store.n_rows
    h = store.hooks[-1]
    np.testing.assert_array_equal(back.load_hook(h).numpy(), store.load_hook(h).numpy())
    np.testing.assert_array_equal(back.load_label("location"), store.load_label("location"))


@pytest.mark.slow
@pytest.mark.parametrize("entry", [["beliefscope.probes.harvest"], ["beliefscope", "harvest"]], ids=["module", "main"])
def test_torchrun_harvest_of_your_own_data_equals_one_process(chain, entry):
    """`torchrun --nproc-per-node 2 -m beliefscope.probes.harvest --data ...` and the main command `-m beliefscope
    harvest` (gloo on the CPU): the merged store holds the one-process store's rows, labels and activations, row for
    row (before, the main command made both ranks write every record)."""
    import subprocess
    import sys
    import time

    import torch

    from beliefscope.probes.store import ActivationStore

    tmp, model, acts, _ = chain
    two = str(tmp / f"acts-2ranks-{entry[0]}")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    t = time.perf_counter()
    port = "29519" if len(entry) == 1 else "29521"
    r = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", port, "-m", *entry,
                        "--model", model, "--data", DATA, "--events-field", "location", "--label-field", "negated",
                        "--out", two, "--no-progress", "--shard-rows", "400", "--device", "cpu"], cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    print(f"torchrun, 2 ranks: {time.perf_counter() - t:.1f} s")
    for sub in ("", "random_init"):
        a, b = ActivationStore.open(os.path.join(two, sub)), ActivationStore.open(os.path.join(acts, sub))
        assert {s.rank for s in a.shards} == {0, 1} and a.hash == b.hash and a.n_rows == b.n_rows
        la, lb = a.load_labels(), b.load_labels()
        oa, ob = np.lexsort((la["position"], la["prompt_id"])), np.lexsort((lb["position"], lb["prompt_id"]))
        for k in la:
            np.testing.assert_array_equal(la[k][oa], lb[k][ob], err_msg=k)
        for h in a.hooks:
            torch.testing.assert_close(a.load_hook(h)[oa], b.load_hook(h)[ob], atol=1e-5, rtol=1e-5)
