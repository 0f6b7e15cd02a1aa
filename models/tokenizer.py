"""Word-level tokenizer for the toy grammars, wrapped as a Hugging Face fast tokenizer.

>>> tok = toy_tokenizer()
>>> tok.decode(tok("A coin is heads .")["input_ids"])
'A coin is heads .'
"""

from __future__ import annotations

from beliefscope.tasks import toy_vocabulary
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

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
