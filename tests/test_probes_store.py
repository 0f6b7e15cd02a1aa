"""Activation store and harvest: rows against HF hidden states and hand labels, kill-and-resume,
config refusal, checksums, and every bad-input error."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from beliefscope.models.load import bridge_from_hf
from beliefscope.models.tokenizer import toy_tokenizer
from beliefscope.probes.harvest import EMBED_HOOK, harvest
from beliefscope.probes.store import ActivationStore
from beliefscope.tasks import get_task

from .helpers import ROOT, tiny_gpt2_hf

PY = sys.executable


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A 2-layer random GPT-2 checkpoint folder with the toy tokenizer (loadable by subprocesses)."""
    folder = str(tmp_path_factory.mktemp("ckpt"))
    tiny_gpt2_hf(seed=3).save_pretrained(folder)
    toy_tokenizer().save_pretrained(folder)
    return folder


def small_harvest(out, n=12, seed=0, **kw):
    hf = tiny_gpt2_hf(seed=3)
    model = bridge_from_hf(hf, toy_tokenizer())
    exs = get_task("coinflip", rendering="toy").examples(n, seed=seed, events="1-5")
    return harvest(model, toy_tokenizer(), exs, "resid_post", "all", str(out), config={"n": n, "seed": seed},
                   batch_size=4, shard_rows=kw.pop("shard_rows", 40), **kw), exs


def rows_by_prompt(store, hooks):
    """{prompt_id: {"pos": [...], hook: [T, d], label: [T]}} from a store, sorted by position."""
    lab = store.load_labels()
    acts = {h: store.load_hook(h) for h in hooks}
    out = {}
    for p in np.unique(lab["prompt_id"]):
        rows = np.nonzero(lab["prompt_id"] == p)[0]
        rows = rows[np.argsort(lab["position"][rows])]
        out[int(p)] = {**{k: v[rows] for k, v in lab.items()}, **{h: acts[h][rows] for h in hooks}}
    return out


def test_rows_equal_hf_hidden_states_and_task_labels(tmp_path):
    store, exs = small_harvest(tmp_path / "s")
    assert store.hooks == [EMBED_HOOK, "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    hf = tiny_gpt2_hf(seed=3)
    got = rows_by_prompt(ActivationStore.open(str(tmp_path / "s")), store.hooks)
    assert sorted(got) == list(range(len(exs)))
    for pid, ex in enumerate(exs):
        lab = ex.labels(toy_tokenizer())
        r = got[pid]
        np.testing.assert_array_equal(r["position"], np.arange(len(lab.input_ids)))
        for name, ref in [("token_id", lab.input_ids), ("state", lab.state), ("parity", lab.parity),
                          ("events_so_far", lab.events_so_far), ("is_event_boundary", lab.is_event_boundary),
                          ("in_prompt", lab.in_prompt), ("in_answer", lab.in_answer)]:
            np.testing.assert_array_equal(r[name], ref.astype(np.int64), err_msg=name)
        assert (r["n_events"] == ex.n_events).all()
        with torch.no_grad():
            hs = hf(torch.as_tensor(lab.input_ids)[None], output_hidden_states=True).hidden_states
        torch.testing.assert_close(r[EMBED_HOOK], hs[0][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(r["blocks.0.hook_resid_post"], hs[1][0], atol=1e-5, rtol=1e-5)
    m = store.manifest
    assert m["complete"] and m["n_rows"] == sum(m["prompt_lengths"])
    assert sorted(p for s in m["shards"] for p, _ in s["prompts"]) == list(range(len(exs)))


def test_float16_store_holds_the_float32_rows_rounded(tmp_path):
    a, _ = small_harvest(tmp_path / "f32")
    b, _ = small_harvest(tmp_path / "f16", dtype="float16", shard_rows=17)  # other shard boundaries too
    ra, rb = rows_by_prompt(a, a.hooks), rows_by_prompt(b, b.hooks)  # store order follows the shards
    assert sorted(ra) == sorted(rb)
    for p in ra:
        np.testing.assert_array_equal(ra[p]["position"], rb[p]["position"])
        for h in a.hooks:  # load_hook returns float32; float16 -> float32 is exact
            assert torch.equal(ra[p][h].to(torch.float16).float(), rb[p][h])


def run_harvest_cli(ckpt, out, extra=()):
    args = [PY, "-m", "beliefscope.probes.harvest", "--model", ckpt, "--n", "30", "--events", "1-6", "--out", out,
            "--no-random-init", "--no-progress", "--batch-size", "2", *extra]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_resume_after_sigkill_loses_and_duplicates_nothing(ckpt, tmp_path):
    out = str(tmp_path / "killed")
    proc = run_harvest_cli(ckpt, out, ["--shard-rows", "1", "--pause-after-shard", "0.2"])
    journal = os.path.join(out, "journal-rank0.json")
    deadline = time.time() + 60
    n_before = 0
    while time.time() < deadline:
        if os.path.exists(journal):
            n_before = len(json.loads(Path(journal).read_text())["shards"])
            if n_before >= 3:
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 3 <= n_before < 30, "the harvest must be killed mid-way"
    with pytest.raises(ValueError, match="incomplete"):
        ActivationStore.open(out)
    # a shard written but never journaled (killed between rename and journal) must be replaced
    n_now = len(json.loads(Path(journal).read_text())["shards"])
    Path(out, f"shard-r0-{n_now:05d}.safetensors").write_bytes(b"half-written garbage")
    assert run_harvest_cli(ckpt, out, ["--shard-rows", "1"]).wait() == 0
    fresh = str(tmp_path / "fresh")
    assert run_harvest_cli(ckpt, fresh, ["--shard-rows", "50"]).wait() == 0
    a, b = ActivationStore.open(out), ActivationStore.open(fresh)
    assert a.hash == b.hash and a.n_rows == b.n_rows == sum(a.manifest["prompt_lengths"])
    a.verify()
    ids = [p for s in a.shards for p, _ in s.prompts]
    assert sorted(ids) == list(range(30))  # none lost, none twice
    ra, rb = rows_by_prompt(a, a.hooks), rows_by_prompt(b, b.hooks)
    for p in range(30):
        for k in ["state", "position", "token_id"]:
            np.testing.assert_array_equal(ra[p][k], rb[p][k])
        for h in a.hooks:
            torch.testing.assert_close(ra[p][h], rb[p][h], atol=1e-5, rtol=1e-5)


def test_other_config_is_refused(tmp_path):
    small_harvest(tmp_path / "s", n=6)
    with pytest.raises(ValueError, match="different config.*n: 6 -> 7"):
        small_harvest(tmp_path / "s", n=7)
    small_harvest(tmp_path / "s", n=6)  # the same config reopens (nothing left to do)


def test_corrupted_and_truncated_shards_fail_checksum(tmp_path):
    store, _ = small_harvest(tmp_path / "s")
    path = os.path.join(store.path, store.shards[0].file)
    data = bytearray(Path(path).read_bytes())
    data[-3] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted.*sha256"):
        ActivationStore.open(store.path).load_hook(EMBED_HOOK)
    Path(path).write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ValueError, match="truncated"):
        ActivationStore.open(store.path).load_label("state")


def test_bad_stores_and_names_fail_clearly(tmp_path):
    store, _ = small_harvest(tmp_path / "s")
    with pytest.raises(KeyError, match="label 'stat' does not exist.*state"):
        store.load_label("stat")
    with pytest.raises(KeyError, match="hook 'blocks.7.hook_resid_post' is not in store"):
        store.load_hook("blocks.7.hook_resid_post")
    os.unlink(os.path.join(store.path, "manifest.json"))
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        ActivationStore.open(store.path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ActivationStore.open(str(tmp_path / "nowhere"))
    empty = ActivationStore.create(str(tmp_path / "empty"), {"config": {"x": 1}, "model": {}, "hooks": [],
                                                             "n_prompts": 0})
    empty.finalize()
    with pytest.raises(ValueError, match="empty"):
        ActivationStore.open(empty.path)


def test_max_gb_guard(tmp_path):
    with pytest.raises(ValueError, match=r"needs about .* GB.*--max-gb"):
        small_harvest(tmp_path / "s", max_gb=1e-6)
    assert not os.path.exists(tmp_path / "s" / "manifest.json")
