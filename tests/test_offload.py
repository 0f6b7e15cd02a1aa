"""A model placed over the CPU and disk by `accelerate` (``--device-map`` with ``--offload-folder``) computes what
the model in one piece computes: logits, captures, the KV cache, greedy and speculative decoding, harvest."""

import json

import numpy as np
import pytest
import torch

from .helpers import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")

PATH = f"{ROOT}/checkpoints/coinflip-direct-rope"  # a toy Llama with RoPE, 4 blocks
SPLIT = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "disk",
         "model.layers.3": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}
STORY = "A coin is heads . Alice flips . Bob stays . Carol flips . State ?"


@pytest.fixture(scope="module")
def whole_and_split(tmp_path_factory):
    from beliefscope.models.load import load_model, model_defaults

    whole = load_model(PATH, device="cpu")
    with model_defaults(device_map=SPLIT, offload_folder=str(tmp_path_factory.mktemp("offload"))):
        split = load_model(PATH)
    return whole, split


def test_the_split_model_really_is_split(whole_and_split):
    from beliefscope.models.profile import hf_of

    hf = hf_of(whole_and_split[1][0])
    assert set(hf.hf_device_map.values()) == {"cpu", "disk"}
    assert hf.model.layers[1].self_attn.q_proj.weight.device.type == "meta"  # on disk until its forward


def test_logits_captures_and_greedy_tokens_equal_the_model_in_one_piece(whole_and_split):
    from beliefscope.decoding import SpecConfig, make_drafter, speculative_generate
    from beliefscope.decoding.loop import generate
    from beliefscope.hooks import capture

    (whole, tok), (split, _) = whole_and_split
    ids = torch.tensor([tok(STORY)["input_ids"]])
    names = [f"blocks.{i}.hook_resid_post" for i in range(whole.cfg.n_layers)]
    with torch.no_grad(), capture(whole, names) as a:
        ref = whole(ids)
    with torch.no_grad(), capture(split, names) as b:
        out = split(ids)
    assert torch.equal(ref, out)
    for n in names:
        assert torch.equal(a.stacked(n), b.stacked(n)), n
    cfg = SpecConfig(max_new_tokens=32, stop_at_eos=False)
    greedy = generate(whole, ids[0], cfg).tokens
    assert len(greedy) == 32 and generate(split, ids[0], cfg).tokens == greedy
    spec = speculative_generate(split, make_drafter("ngram:2", split), ids[0],
                                SpecConfig(gamma=3, max_new_tokens=32, stop_at_eos=False)).tokens
    assert spec == greedy


def test_forced_answers_with_the_forked_cache_equal_the_whole_model(whole_and_split):
    from beliefscope.analyses.forced import forced_answers
    from beliefscope.tasks import get_task

    (whole, tok), (split, _) = whole_and_split
    for ex in get_task("coinflip", fmt="direct").examples(3, seed=7, events=(2, 5)):
        a, b = forced_answers(whole, tok, ex), forced_answers(split, tok, ex)
        assert (a.p_state == b.p_state).all()


@pytest.mark.slow
def test_harvest_with_a_device_map_equals_the_whole_model(tmp_path):
    from beliefscope.cli import main
    from beliefscope.probes.store import ActivationStore

    common = ["--model", PATH, "--n", "6", "--events", "1-4", "--quiet"]
    assert main(["harvest", *common, "--out", str(tmp_path / "one"), "--device", "cpu"]) == 0
    assert main(["harvest", *common, "--out", str(tmp_path / "split"), "--device-map", json.dumps(SPLIT),
                 "--offload-folder", str(tmp_path / "off")]) == 0
    one, split = ActivationStore.open(str(tmp_path / "one")), ActivationStore.open(str(tmp_path / "split"))
    for h in one.hooks:
        assert torch.equal(one.load_hook(h), split.load_hook(h)), h
    assert one.manifest["checkpoint_hash"] == split.manifest["checkpoint_hash"]  # offloaded weights were read
    twin_one, twin_split = (ActivationStore.open(str(tmp_path / d / "random_init")) for d in ("one", "split"))
    assert torch.equal(twin_one.load_hook(one.hooks[-1]), twin_split.load_hook(one.hooks[-1]))


def test_device_map_flags_are_checked_before_loading(tmp_path):
    from beliefscope.cli import main

    assert main(["eval", "--model", PATH, "--n", "2", "--device-map", "everywhere"]) == 2
    assert main(["eval", "--model", PATH, "--n", "2", "--device-map", json.dumps(SPLIT)]) == 2  # disk, no folder
    assert main(["eval", "--model", PATH, "--n", "2", "--max-memory", "cpu=2GiB"]) == 2  # no --device-map
    assert main(["eval", "--model", PATH, "--n", "2", "--device-map", "auto", "--max-memory", "gpu=lots"]) == 2
    assert main(["eval", "--model", "thinking", "--n", "2", "--device-map", "auto"]) == 2  # composed at load time


def test_the_logit_lens_of_the_split_model_equals_the_model_in_one_piece(whole_and_split):
    """The lens reads every block through the model's own final norm and lm_head, here on disk until used: every
    block's distribution equals the model in one piece's, and the last block is the split model's own logits."""
    from beliefscope.probes.lens import logit_lens

    (whole, tok), (split, _) = whole_and_split
    ids = tok(STORY)["input_ids"]
    a, b = logit_lens(whole, ids, tok=tok, classes=("heads", "tails")), logit_lens(split, ids, tok=tok,
                                                                                   classes=("heads", "tails"))
    assert np.array_equal(a.top_id, b.top_id) and np.array_equal(a.class_p, b.class_p) and np.array_equal(a.kl, b.kl)
    assert b.max_delta < 1e-5  # the split model's last block through the lens is its own logits
