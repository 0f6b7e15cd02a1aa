"""decoding.lists: the numbered-list counter, against hand-computed next tokens and a real tokenizer,
and inside the store drafter (chains and trees)."""

import pytest
import torch

from beliefscope.decoding.config import SpecConfig, TreeConfig
from beliefscope.decoding.datastore import NGramStore, StoreDraftConfig, StoreDrafter
from beliefscope.decoding.lists import ListCounter

NL, DOT = 9, 5  # a newline token and "."
COUNTER = ListCounter(newline={NL, 19}, numbers={1: [1, DOT], 2: [2, DOT], 3: [3, DOT], 10: [1, 0, DOT],
                                                   11: [1, 1, DOT]})  # 19: a second newline token ("\n\n")


@pytest.mark.parametrize("seq, want", [
    ([1, DOT, 7, 7, NL], 2),                      # "1. x x\n" -> "2"
    ([1, DOT, 7, NL, 2, DOT, 7, NL], 3),          # -> "3"
    ([1, DOT, 7, NL, 2], DOT),                    # inside "2." -> "."
    ([1, DOT, 7, NL, 2, DOT], None),              # "2." is complete: the tables take over
    ([1, DOT, 7, NL, 3], None),                   # the line opened with a number other than the next one
    ([1, DOT, 7, NL, 19, NL], 2),                 # blank lines between items are skipped
    ([7, 7, NL], None),                           # the previous line is not a numbered item
    ([1, DOT, 7], None),                          # no line break yet
    ([NL], None),                                 # no previous line
    ([3, DOT, 7, NL, 3, 7, NL], None),            # the previous line opened with "3" but not "3."
    ([1, 0, DOT, 7, NL], 1),                      # "10." -> "11.": first token "1"
    ([1, 0, DOT, 7, NL, 1], 1),                   # ... second token "1"
    ([1, 0, DOT, 7, NL, 1, 1], DOT),              # ... then "."
])
def test_next_token(seq, want):
    assert COUNTER.next_token(seq) == want


def test_meta_round_trip():
    back = ListCounter.from_meta(COUNTER.to_meta())
    assert back.newline == COUNTER.newline and back.numbers == COUNTER.numbers
    assert ListCounter.from_meta(None) is None


@pytest.mark.slow
def test_from_a_real_tokenizer():
    """The ids read off SmolLM2's tokenizer decode to exactly "k." and the newline tokens end in a line break."""
    from beliefscope.benchmarks.common import smollm2_available

    if not smollm2_available():
        pytest.skip("SmolLM2 is not installed (the real extra)")
    from transformers import AutoTokenizer

    from beliefscope.models.load import SMOLLM2_GGUF, smollm2_folder

    tok = AutoTokenizer.from_pretrained(smollm2_folder(), gguf_file=SMOLLM2_GGUF)
    c = ListCounter.from_tokenizer(tok, max_number=20)
    assert sorted(c.numbers) == list(range(1, 21))
    for k, ids in c.numbers.items():
        assert tok.decode(ids) == f"{k}."
    assert all(tok.decode([t]).endswith("\n") for t in c.newline)
    text = "Steps:\n1. Open the box.\n2. Take the coin.\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode([c.next_token(ids)]) == "3"


def _drafter(list_counter=True):
    store = NGramStore(max_n=3, meta={"list_counter": COUNTER.to_meta()})
    store.add([1, DOT, 7, 8, NL, 2, DOT, 7, 8, NL, 3, DOT, 7, 8, NL])  # items "k. 7 8"
    d = StoreDrafter(store, StoreDraftConfig(list_counter=list_counter))
    return d


def test_store_drafter_opens_the_next_item():
    history = torch.tensor([1, DOT, 7, 8, NL, 2, DOT, 7, 8, NL])  # two items written; the third is next
    d = _drafter()
    d.start(None, history, None, SpecConfig())
    assert d.propose(history, 6, SpecConfig())[0].tolist()[:5] == [3, DOT, 7, 8, NL]
    # without the counter the tables guess the number from the n-gram "8 \n", which was followed by 2 and 3
    plain = _drafter(list_counter=False)
    plain.start(None, history, None, SpecConfig())
    assert plain.propose(history, 6, SpecConfig())[0].tolist()[:1] != [3]


def test_store_tree_leads_with_the_next_item():
    history = torch.tensor([1, DOT, 7, 8, NL, 2, DOT, 7, 8, NL])
    d = _drafter()
    d.start(None, history, None, SpecConfig())
    tree = d.propose_tree(history, TreeConfig(nodes=6, depth=5, branch=2), SpecConfig())
    first = [i for i, p in enumerate(tree.parents) if p == -1]
    assert tree.tokens[first[0]] == 3
    assert [tree.tokens[i] for i in tree.path(max(range(len(tree)), key=lambda i: tree.depths()[i]))][:3] == [3, DOT, 7]
