"""A tiny random Llama checkpoint folder, built from a config with a byte-level BPE tokenizer trained on the
given texts: a model that is not SmolLM2 and not a shipped checkpoint, for the data chain's tests."""

from __future__ import annotations

import os

import torch


def tiny_llama_folder(path: str, texts: list[str], *, seed: int = 0, layers: int = 2, width: int = 32,
                      vocab: int = 300) -> str:
    """Write a random ``LlamaForCausalLM`` (``layers`` blocks of width ``width``) and its tokenizer to `path`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = __import__("tokenizers").decoders.ByteLevel()
    core.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["[UNK]", "<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
