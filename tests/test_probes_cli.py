"""CLI (harvest -> probe -> steer JSON), steering vs a hand-added vector, and the 2-process torchrun
harvest against a single-process harvest of the same prompts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from beliefscope.cli import main
from beliefscope.models.load import bridge_from_hf
from beliefscope.models.tokenizer import toy_tokenizer
from beliefscope.probes.linear import LinearProbe
from beliefscope.probes.steering import SteerConfig, steer_experiment
from beliefscope.probes.store import ActivationStore
from beliefscope.tasks import get_task

from .helpers import ROOT, tiny_gpt2_hf


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("ckpt"))
    tiny_gpt2_hf(seed=5).save_pretrained(folder)
    toy_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def harvested(ckpt, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("acts") / "s")
    assert main(["harvest", "--model", ckpt, "--n", "40", "--events", "1-10", "--out", out, "--no-progress"]) == 0
    return out


@pytest.fixture(scope="module")
def probes_dir(harvested, tmp_path_factory):
    pdir = str(tmp_path_factory.mktemp("probes"))
    assert main(["probe", "--acts", harvested, "--out", pdir, "--folds", "2", "--max-iter", "50",
                 "--no-random-init", "--no-progress"]) == 0
    return pdir


def test_probe_json_has_the_promised_fields(harvested, tmp_path, capsys):
    capsys.readouterr()
    pdir = str(tmp_path / "probes")
    assert main(["probe", "--acts", harvested, "--label", "parity", "--out", pdir, "--folds", "3",
                 "--max-iter", "50", "--json", "--no-progress"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [r["layer"] for r in rep["layers"]] == [0, 1]
    for r in rep["layers"]:
        assert {"layer", "accuracy", "control_accuracy", "selectivity", "random_init_accuracy"} <= set(r)
        assert r["selectivity"] == pytest.approx(r["accuracy"] - r["control_accuracy"], abs=1e-4)
        assert r["heldout_length_accuracy"] is not None  # prompts with 9-10 events were held out
    assert rep["best_layer"] == max(rep["layers"], key=lambda r: r["accuracy"])["layer"]
    assert 0 <= rep["embedding_accuracy"] <= 1 and 0 <= rep["majority_accuracy"] <= 1
    assert rep["heldout_lengths"]["test_prompts"] > 0
    assert json.loads(Path(pdir, "report.json").read_text())["store_hash"] == rep["store_hash"]
    assert main(["probe", "--acts", harvested, "--label", "flips"]) == 2  # unknown label: clear error
    assert "label 'flips' does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_steer_cli_and_zero_alpha(probes_dir, ckpt, capsys):
    pdir = probes_dir
    capsys.readouterr()
    assert main(["steer", "--model", ckpt, "--probes", pdir, "--layer", "1", "--alpha", "0,50", "--n", "12",
                 "--json", "--no-progress"]) == 0
    sweep = json.loads(capsys.readouterr().out)["sweep"]
    zero, big = sweep
    assert zero["flip_rate"] == 0 and zero["random"]["mean"] == 0 and zero["random"]["n"] == 10
    assert big["added_norm"] == pytest.approx(
        50 * LinearProbe.load(pdir).meta["resid_norm"]["blocks.1.hook_resid_post"], rel=1e-4)
    assert main(["steer", "--model", ckpt, "--probes", pdir, "--layer", "7", "--json"]) == 2


def test_steering_adds_the_scaled_direction_after_the_last_event(probes_dir):
    """Hand check: a probe direction added at `alpha` x norm changes the answer exactly as the same
    vector added by a hand-written hook at the same positions."""
    probe = LinearProbe.load(probes_dir)
    hf = tiny_gpt2_hf(seed=5)
    model, tok = bridge_from_hf(hf, toy_tokenizer()), toy_tokenizer()
    ex = get_task("coinflip", rendering="toy").example(seed=11, n_events=3)
    res = steer_experiment(model, tok, probe, [ex], SteerConfig(layer=1, alpha=30.0, n_random=0))
    # reference: HF forward with a plain torch hook on block 1's output
    lab = ex.labels(tok, text=ex.prompt)
    ids = torch.as_tensor(lab.input_ids)[None]
    first = int(np.nonzero(lab.is_event_boundary)[0][-1])
    ans = [tok(" heads", add_special_tokens=False)["input_ids"][0],
           tok(" tails", add_special_tokens=False)["input_ids"][0]]
    with torch.no_grad():
        h = hf(ids, output_hidden_states=True).hidden_states[2][0, -1]
    belief = int(probe.predict(h[None], "blocks.1.hook_resid_post"))
    v = probe.direction("blocks.1.hook_resid_post", toward=1 - belief, away=belief) * res["added_norm"]

    def add(mod, inp, out):
        hidden = out[0] if isinstance(out, tuple) else out  # [batch, pos, d_model]
        hidden[:, first:] += v
        return out

    base = int(hf(ids).logits[0, -1, ans].argmax())
    handle = hf.transformer.h[1].register_forward_hook(add)
    try:
        steered = int(hf(ids).logits[0, -1, ans].argmax())
    finally:
        handle.remove()
    assert res["flip_rate"] == float(steered != base)
    assert res["probe_agrees_with_answer"] == float(belief == base)


@pytest.mark.slow
def test_torchrun_two_ranks_equal_one_process(ckpt, tmp_path):
    common = ["--model", ckpt, "--n-prompts", "24", "--events", "1-6", "--no-random-init", "--no-progress",
              "--shard-rows", "60", "--batch-size", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = str(tmp_path / "two")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    r = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", "29517", "-m", "beliefscope.probes.harvest",
                        *common, "--out", two], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    one = str(tmp_path / "one")
    assert main(["harvest", *common, "--out", one]) == 0
    a, b = ActivationStore.open(two), ActivationStore.open(one)
    assert {s.rank for s in a.shards} == {0, 1} and a.hash == b.hash and a.n_rows == b.n_rows
    la, lb = a.load_labels(), b.load_labels()
    oa = np.lexsort((la["position"], la["prompt_id"]))
    ob = np.lexsort((lb["position"], lb["prompt_id"]))
    for k in la:
        np.testing.assert_array_equal(la[k][oa], lb[k][ob], err_msg=k)
    # The ranks batch other prompts together, so float32 sums round in another order (about eps * sqrt(d) per
    # block, relative to the residual's size), and a stored value can then round to the neighbouring value of the
    # store's dtype (float16 here): one unit in the last place, eps(dtype) relative. Both bounds come from the
    # formats, not from a machine (a CPU without AVX kernels flips one float16 value in 20,480).
    stored = torch.finfo(getattr(torch, a.manifest["dtype"])).eps
    for h in a.hooks:
        x, y = a.load_hook(h)[oa], b.load_hook(h)[ob]
        depth = int(h.split(".")[1]) + 1
        summed = 4 * torch.finfo(torch.float32).eps * x.shape[1] ** 0.5 * depth * max(1.0, float(y.abs().max()))
        torch.testing.assert_close(x, y, atol=summed, rtol=stored)
