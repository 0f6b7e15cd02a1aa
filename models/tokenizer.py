"""Word-level tokenizer for the toy grammars, wrapped as a Hugging Face fast tokenizer.

>>> tok = toy_tokenizer()
>>> tok.decode(tok("A coin is heads .")["input_ids"])
'A coin is heads .'
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from ..tasks import toy_vocabulary

SPECIALS = ("<pad>", "<eos>", "<unk>")


def toy_tokenizer(words: list[str] | None = None) -> PreTrainedTokenizerFast:
    """Build the shared word-level tokenizer; ids 0/1/2 are pad/eos/unk, then the words."""
    if words is None:

        words = toy_vocabulary()
    vocab = {w: i for i, w in enumerate([*SPECIALS, *words])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
        padding_side="left", clean_up_tokenization_spaces=False,
    )


def answer_token_ids(tok, names) -> list[int]:
    """The first token of " <name>" (the word as it follows a prompt) for each answer word: what a direct answer,
    a forced answer or a steering flip is read from. Two words that share it could not be told apart, so that is
    refused, naming them.

    >>> answer_token_ids(toy_tokenizer(), ["heads", "tails"]) == [toy_tokenizer().convert_tokens_to_ids(w)
    ...                                                           for w in ("heads", "tails")]
    True
    """
    ids = [tok(" " + n, add_special_tokens=False)["input_ids"][0] for n in names]
    first: dict = {}
    for name, i in zip(names, ids):
        if i in first:
            raise ValueError(f"answer words {first[i]!r} and {name!r} share their first token {tok.decode([i])!r} "
                             "under this tokenizer, so an answer read from it cannot tell them apart: pass answer "
                             "words that start differently (--answers)")
        first[i] = name
    return ids


def tokenizer_adds_bos(tok) -> bool:
    """Whether ``tok(text)`` (HF's ``add_special_tokens=True`` default) starts with the tokenizer's BOS of itself.

    beliefscope's BOS rule: a text is the tokens its model's own tokenizer gives, ``tok(text)["input_ids"]``,
    and nothing is added or removed. `load_model`'s bridge follows the same rule (its
    ``cfg.default_prepend_bos`` is set from this), so ``bridge.to_tokens(text)`` equals ``tok(text)``.

    >>> tokenizer_adds_bos(toy_tokenizer())
    False
    """
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        return False
    ids = tok("a")["input_ids"]
    return len(ids) > len(tok("a", add_special_tokens=False)["input_ids"]) and ids[0] == bos
