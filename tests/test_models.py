"""Models: bridge vs HF logits, the shipped checkpoints, load errors, SmolLM2 offline."""

import json
import os

import pytest
import torch

from beliefscope.models.evaluate import evaluate
from beliefscope.models.load import ModelLoadError, bridge_from_hf, load_hf, load_model

from .helpers import DRAFT, TARGET, copy_of, tiny_gpt2_hf, tiny_llama_hf


@pytest.mark.parametrize("make", [tiny_gpt2_hf, tiny_llama_hf], ids=["gpt2", "llama"])
def test_bridge_logits_equal_hf_tiny_random(make):
    hf = make()
    ref = copy_of(hf)
    bridge = bridge_from_hf(hf)
    x = torch.randint(0, 64, (3, 17))
    with torch.no_grad():
        diff = (bridge(x, return_type="logits") - ref(x).logits).abs().max().item()
    assert diff <= 1e-5


def test_bridge_logits_equal_hf_toy_target():
    bridge, tok = load_model(TARGET)
    hf, _ = load_hf(TARGET)
    ids = tok(["A coin is heads . Alice flips . Bob stays . State ?"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        diff = (bridge(ids, return_type="logits") - hf(ids).logits).abs().max().item()
    assert diff <= 1e-5


def test_shipped_checkpoints_small_and_carded():
    cards = {}
    for path in (TARGET, DRAFT):
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        assert size < 10 * 2**20, f"{path} is {size / 2**20:.1f} MB"
        with open(os.path.join(path, "model_card.json")) as f:
            cards[path] = json.load(f)
        assert set(cards[path]["eval"]) == {"1-8", "9-16"}  # trained lengths and held-out lengths
    assert cards[TARGET]["eval"]["1-8"]["exact_match"] >= 0.99
    assert cards[DRAFT]["eval"]["1-8"]["exact_match"] < cards[TARGET]["eval"]["1-8"]["exact_match"]
    with open(os.path.join(DRAFT, "config.json")) as f:
        assert json.load(f)["n_layer"] <= 2


@pytest.mark.slow
def test_target_meets_accuracy_and_draft_is_weaker():
    tgt = evaluate(TARGET, "coinflip", "1-8", n=200, seed=777)
    drf = evaluate(DRAFT, "coinflip", "1-8", n=200, seed=777)
    assert tgt["exact_match"] >= 0.99 and tgt["answer_accuracy"] >= 0.99
    assert drf["answer_accuracy"] < tgt["answer_accuracy"] - 0.05


def test_unknown_model_path_is_clear():
    with pytest.raises(ModelLoadError, match="no checkpoint folder at.*shipped names: target"):
        load_model("/no/such/model/folder")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(os.path.dirname(TARGET))


def test_hub_name_offline_fails_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE is set; shipped names"):
        load_model("no-such-org/no-such-model-xyz")


@pytest.mark.slow
def test_smollm2_offline_greedy_matches_raw_hf(smollm2):
    bridge, tok = smollm2
    raw, _ = load_hf("smollm2")
    prompt = "A coin's state is heads. Alice flips the coin. What's the state? A:"
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = raw.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
        out = ids
        for _ in range(8):  # plain greedy through the bridge, uncached
            nxt = bridge(out, return_type="logits")[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
        diff = (bridge(ids, return_type="logits") - raw(ids).logits).abs().max().item()
    assert out[0, ids.shape[1]:].tolist() == ref.tolist()
    assert diff <= 1e-3
    assert bridge.cfg.n_layers == 30


def test_eval_split_needs_natural_stories(capsys):
    import pytest

    from beliefscope.cli import main

    with pytest.raises(ValueError, match="split='train' needs natural English"):
        evaluate(TARGET, "coinflip", "1-2", n=2, split="train")
    assert main(["eval", "--model", "target", "--split", "train", "--n", "2"]) != 0
    assert "--split train needs natural English stories" in capsys.readouterr().err


def test_eval_reports_progress_for_every_prompt():
    seen = []
    evaluate(TARGET, "coinflip", "1-3", n=6, batch_size=4, progress=seen.append)
    assert sum(seen) == 12 and len(seen) == 4  # 6 direct + 6 CoT prompts, in batches of 4 and 2
    seen.clear()
    evaluate("thinking", "coinflip", "1-3", n=5, batch_size=4, progress=seen.append)
    assert sum(seen) == 5


def test_eval_misses_lists_exactly_the_stories_with_a_wrong_answer_or_thought(capsys):
    """A Thinking States model whose state projection is negated reads chunks wrongly: every story it
    gets wrong (answer or any thought) is listed, chunk by chunk, and no other; a right model lists none."""
    from beliefscope.cli import main

    model, tok = load_model("thinking")
    clean: list = []
    res = evaluate(model, "coinflip", "9-16", n=12, tokenizer=tok, misses=clean)
    assert res["answer_accuracy"] == 1.0 and res["thought_exact"] == 1.0 and clean == []
    with torch.no_grad():
        model.out_proj.weight.mul_(-1.0)  # S now points at the other state: thoughts after the first go wrong
    misses: list = []
    res = evaluate(model, "coinflip", "9-16", n=12, tokenizer=tok, misses=misses)
    # at least every story with a wrong thought, at most every story
    assert round(12 * (1 - res["thought_exact"])) <= len(misses) <= 12 and res["thought_exact"] < 1
    for m in misses:
        assert m["answer"] != m["truth"] or not all(c["ok"] for c in m["chunks"])
        assert "".join(c["text"] for c in m["chunks"]).replace(" ", "") in m["prompt"].replace(" ", "")
        assert all(c["ok"] == c["got"].startswith(c["gold"]) or not c["ok"] for c in m["chunks"])
    # the CLI refuses what cannot be read before any forward (a plain model has no thoughts to list)
    assert main(["eval", "--model", "target", "--misses", "m.jsonl"]) != 0
    assert "not a Thinking States model" in capsys.readouterr().err
    assert main(["eval", "--model", "thinking", "--into-card"]) != 0
    assert "add --table" in capsys.readouterr().err
    assert main(["eval", "--model", "thinking", "--table"]) != 0
    assert "--table asks natural-English coin stories" in capsys.readouterr().err


def test_card_with_table_sets_the_template_bands_and_keeps_the_rest():
    from beliefscope.models.evaluate_free import card_with_table

    full = {"template 1-8": {"answer_accuracy": 0.5, "n": 2, "events": "1-8", "answer_accuracy_by_events": {}},
            "free": {"answer_accuracy": 0.25, "n": 4}}
    table = {"template 1-8": {"answer_accuracy": 0.5, "n": 2}, "free": {"answer_accuracy": 0.25, "n": 4}}
    card = {"steps": 7, "eval": {"1-8": {"answer_accuracy": 1.0}, "9-16": {"answer_accuracy": 0.9}}}
    out = card_with_table(card, table, full)
    assert out["steps"] == 7 and out["eval_questions"] == table
    assert out["eval"] == {"1-8": {"answer_accuracy": 0.5, "n": 2, "events": "1-8"}, "9-16": {"answer_accuracy": 0.9}}


@pytest.mark.parametrize("name", ["target", "thinking"])
def test_a_small_checkpoint_loads_without_transformers_bar_and_a_big_one_keeps_it(name, capfd, monkeypatch):
    """transformers' "Loading weights" bar littered the demo's display eight times; a shipped toy loads without
    it, the bar's switch is left as it was, and weights past the threshold (set to 0 here) keep the bar."""
    from transformers.utils import logging as hf_logging

    import beliefscope.models.hf_load as hf_load

    assert hf_logging.is_progress_bar_enabled()
    capfd.readouterr()
    load_model(name)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
    monkeypatch.setattr(hf_load, "SMALL_WEIGHTS_BYTES", 0)
    load_model(name)
    assert "Loading weights" in capfd.readouterr().err


def test_direct_answers_read_the_last_logits_of_the_bare_model_as_hf_computes_them():
    """`direct_answers` runs the bare HF tree with ``logits_to_keep=1``: its answers and top words are those of
    an untouched HF copy's full forward (every position's logits, the last row read), over padded batches."""
    from beliefscope.models.evaluate import direct_answers
    from beliefscope.models.tokenizer import answer_token_ids
    from beliefscope.tasks import get_task

    bridge, tok = load_model(TARGET)
    ref = copy_of(load_hf(TARGET)[0]).eval()
    exs = get_task("coinflip").examples(24, 3, (1, 8))  # several lengths: left padding in every batch
    top1: list = []
    got = direct_answers(bridge.original_model, tok, exs, batch_size=8, top1=top1)
    names, ids = exs[0].state_names, torch.tensor(answer_token_ids(tok, exs[0].state_names))
    want, want_top = [], []
    for i in range(0, len(exs), 8):
        enc = tok([e.prompt for e in exs[i: i + 8]], return_tensors="pt", padding=True)
        pos = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = ref(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], position_ids=pos).logits
        want += [names[j] for j in logits[:, -1, ids].argmax(-1).tolist()]
        want_top += [tok.decode([t]).strip() for t in logits[:, -1].argmax(-1).tolist()]
    assert got == want and top1 == want_top
    assert len(set(len(tok(e.prompt)["input_ids"]) for e in exs)) > 1


def test_answer_words_that_share_a_first_token_are_refused_naming_them():
    """Direct answers, forced answers and steering flips read one token per answer word; two words that begin
    with the same token would be scored as one (eval had no such check). Under the toy word-level tokenizer
    every unknown word is the one <unk> token."""
    from beliefscope.models.tokenizer import answer_token_ids, toy_tokenizer

    tok = toy_tokenizer()
    assert answer_token_ids(tok, ["heads", "tails"]) == [tok.convert_tokens_to_ids(w) for w in ("heads", "tails")]
    with pytest.raises(ValueError, match=r"'bedroom' and 'bathroom' share their first token '<unk>'"):
        answer_token_ids(tok, ["heads", "bedroom", "bathroom"])
