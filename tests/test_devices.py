"""Device plumbing without a GPU: library objects follow the model's device, never a hidden "cpu".

A model moved to the ``meta`` device computes shapes only, so any tensor the cache, the capture or
the slot cache builds on a hard-coded CPU meets a meta tensor and fails (or shows up on the wrong
device below). The CLI's ``--device`` / ``--dtype`` reach the loader.
"""

from __future__ import annotations

import ast
import os

import pytest
import torch

from beliefscope.cache import KVCache
from beliefscope.decoding.slots import slot_cache
from beliefscope.decoding.tree import TokenTree, tree_forward_kwargs
from beliefscope.hooks import capture
from beliefscope.models.testing import tiny_gpt2, tiny_llama

META = torch.device("meta")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = ("cache", "hooks", "models", "decoding", "probes", "analyses", "tasks", "beliefscope")


@pytest.mark.parametrize("make", [tiny_gpt2, tiny_llama])
def test_cache_capture_and_masks_follow_a_meta_model(make):
    model = make().to(META)
    cache = KVCache.for_model(model, batch=1, capacity=16)
    hook = "blocks.0.hook_resid_post"
    with capture(model, [hook], cache=cache) as cap:
        out = model(torch.tensor([[1, 2, 3]], device=META), past_key_values=cache, return_type="logits")
    assert out.device == META and cache.seq_len == 3
    assert cap.records[hook][0].act.device == META  # kept where the model computed it
    assert cache.keys(0).device == META
    cache.rollback(2)
    kw = cache.forward_kwargs(2)
    assert kw["attention_mask"].device == META and kw["position_ids"].device == META
    with cache.fork(at=1) as branch:
        kw = branch.forward_kwargs(2)
        assert kw["attention_mask"].device == META and kw["position_ids"].device == META
    tree = TokenTree(tokens=[4, 5, 6], parents=[-1, 0, -1])
    kw = tree_forward_kwargs(cache, tree, 4, model)
    assert kw["attention_mask"].device == META and kw["position_ids"].device == META


def test_slot_cache_follows_a_meta_model():
    slots = slot_cache(tiny_llama().to(META), slots=2, capacity=8)
    slots.layout.lengths[:] = [2, 3]  # as if rows held 2 and 3 positions
    kw = slots.forward_kwargs(3)
    assert kw["attention_mask"].device == META and kw["position_ids"].device == META
    assert slots.layout.write_positions([0, 1], 3).device == META
    assert slots.layers[0].keys.device == META


def _cpu_literals(path: str) -> list[int]:
    with open(path) as f:
        tree = ast.parse(f.read())
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value == "cpu"]


def test_no_hard_coded_cpu_in_the_library():
    # The one place "cpu" may appear: the loader's fallback when no GPU is available.
    allowed = {os.path.join("models", "devices.py"),  # resolves --device, names the host
               os.path.join("models", "packed.py")}  # oneDNN CPU kernels: falls back to F.linear off the CPU
    found = []
    for pkg in LIBRARY:
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)
                if f.endswith(".py") and rel not in allowed:
                    found += [f"{rel}:{line}" for line in _cpu_literals(os.path.join(ROOT, rel))]
    assert not found, f'hard-coded "cpu" (use the model\'s or the cache\'s device): {found}'


def test_cli_device_and_dtype_reach_the_loader(monkeypatch, capsys):
    from beliefscope.cli import main
    from beliefscope.models import load

    seen = []
    real = load.load_hf

    def spy(name, device=None, dtype=None, **kw):
        seen.append((load.default_device(device), load.resolve_dtype(dtype)))
        return real(name, device, dtype, **kw)

    monkeypatch.setattr(load, "load_hf", spy)
    rc = main(["generate", "--model", "target", "--prompt", "A coin is heads . State ?", "--max-new-tokens", "2",
               "--device", "cpu", "--dtype", "bfloat16", "--json", "--quiet"])
    assert rc == 0 and seen == [(torch.device("cpu"), torch.bfloat16)]
    assert load.resolve_dtype(None) == torch.float32  # the CLI's defaults end with the command


def test_cli_every_model_command_takes_device_and_dtype():
    from beliefscope.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    loading = [name for name, p in sub.choices.items() if {a.dest for a in p._actions} & {"model", "models"}]
    assert {"eval", "generate", "harvest", "steer", "beliefs", "forced", "trace", "demo", "instrument"} <= set(loading)
    for name in loading:
        flags = {s for a in sub.choices[name]._actions for s in a.option_strings}
        assert {"--device", "--dtype", "--quiet"} <= flags, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a missing GPU")
def test_cli_refuses_a_device_the_machine_lacks(capsys, tmp_path):
    from beliefscope.cli import main

    out = tmp_path / "acts"
    assert main(["harvest", "--model", "target", "--n", "2", "--out", str(out), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "device 'cuda' is not available" in err and "--device cpu" in err
    assert os.listdir(tmp_path) == []  # refused before anything was written
