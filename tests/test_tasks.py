"""Tasks: per-token labels against hand-computed expectations, for word-level and BPE tokenizers."""

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from beliefscope.models.tokenizer import toy_tokenizer
from beliefscope.tasks import CoinFlip, Cups, Event, Example, get_task, parse_events_range
from beliefscope.tasks.coinflip import (
    NATURAL_FLIPS,
    NATURAL_INTROS,
    NATURAL_NAMES,
    NATURAL_STAYS,
    sample_prompts,
)
from beliefscope.tasks.parse import parse_prompt


def toy_example():
    # "A coin is heads . Alice flips . Bob stays . State ? tails" built by hand
    prompt = "A coin is heads . Alice flips . Bob stays . State ?"
    ev1 = (prompt.index("Alice"), prompt.index("flips .") + len("flips ."))
    ev2 = (prompt.index("Bob"), prompt.index("stays .") + len("stays ."))
    return Example("coinflip", "toy", "direct", prompt, " tails", ("heads", "tails"), 0,
                   (Event(ev1, "flip", 1), Event(ev2, "stay", 1)), (len(prompt) + 1, len(prompt) + 6))


def test_generator_matches_hand_built_example():
    ex = CoinFlip("toy").example(seed=0, n_events=2)
    assert ex.prompt.endswith("State ?")
    # recompute the state by reading the words, independently of the generator
    words = ex.text.split()
    state = words[3]
    for verb in words[4:]:
        if verb == "flips":
            state = {"heads": "tails", "tails": "heads"}[state]
    assert ex.answer == state == words[-1]


def test_word_level_labels_hand_computed():
    ex = toy_example()
    lab = ex.labels(toy_tokenizer())
    words = ex.text.split()
    assert len(lab.input_ids) == len(words)
    # hand labels: state is heads until Alice's event ends at its ".", then tails
    #            A  coin is heads .  Alice flips .  Bob stays .  State ?  tails
    state =     [0, 0,   0, 0,    0, 0,    0,    1, 1,   1,    1, 1,    1, 1]
    events =    [0, 0,   0, 0,    0, 0,    0,    1, 1,   1,    2, 2,    2, 2]
    boundary =  [0, 0,   0, 0,    0, 0,    0,    1, 0,   0,    1, 0,    0, 0]
    parity =    [0, 0,   0, 0,    0, 0,    0,    1, 1,   1,    1, 1,    1, 1]
    assert lab.state.tolist() == state
    assert lab.events_so_far.tolist() == events
    assert lab.is_event_boundary.astype(int).tolist() == boundary
    assert lab.parity.tolist() == parity
    assert lab.in_answer.tolist() == [False] * 13 + [True]


def test_parity_differs_from_state_when_starting_tails():
    ex = CoinFlip("toy").example(seed=5, n_events=6)
    lab = ex.labels(toy_tokenizer())
    last = len(lab.state) - 1
    assert lab.state[last] == (ex.initial + lab.parity[last]) % 2


def _bpe_tokenizer():
    texts = [ex.text for ex in CoinFlip("natural", split="all").examples(300, seed=1, events=(1, 6))]
    core = Tokenizer(models.BPE(unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=core)


def test_bpe_labels_follow_characters():
    tok = _bpe_tokenizer()
    ex = CoinFlip("natural", split="all").example(seed=11, n_events=4)
    lab = ex.labels(tok)
    assert len(lab.input_ids) > len(ex.text.split())  # sub-word pieces, not words
    # Hand rule on characters: a token at character end c has seen every event ending <= c.
    ends = [e.span[1] for e in ex.events]
    for (s, e), st, n in zip(lab.offsets, lab.state, lab.events_so_far):
        seen = sum(e >= end for end in ends)
        assert n == seen
        expected = ex.initial if seen == 0 else ex.events[seen - 1].state_after
        assert st == expected
    # exactly one boundary token per event, and it is the token covering the event's last char
    assert lab.is_event_boundary.sum() == ex.n_events
    for ev in ex.events:
        i = int(np.nonzero(lab.offsets[:, 1] >= ev.span[1])[0][0])
        assert lab.is_event_boundary[i]


def test_bpe_hand_sentence():
    tok = _bpe_tokenizer()
    text_prompt = "A coin's state is heads. Alice flips the coin. What's the state? A:"
    s = text_prompt.index("Alice")
    ex = Example("coinflip", "natural", "direct", text_prompt, " tails", ("heads", "tails"), 0,
                 (Event((s, s + len("Alice flips the coin.")), "flip", 1),),
                 (len(text_prompt) + 1, len(text_prompt) + 6))
    lab = ex.labels(tok)
    pieces = [ex.text[a:b] for a, b in lab.offsets]
    # every piece up to and including the final "." of Alice's sentence is heads, after it tails
    dot = s + len("Alice flips the coin.")
    for piece, (a, b), st in zip(pieces, lab.offsets, lab.state):
        assert st == (1 if b >= dot else 0), (piece, a, b)


def test_natural_splits_hold_out_templates_and_names():
    train = CoinFlip("natural", split="train").examples(200, seed=0, events=(2, 4))
    held = CoinFlip("natural", split="heldout").examples(200, seed=0, events=(2, 4))
    train_names = {n for e in train for n in e.meta["names"]}
    held_names = {n for e in held for n in e.meta["names"]}
    assert train_names and held_names and not train_names & held_names
    assert {e.meta["intro"] for e in train} <= set(range(len(NATURAL_INTROS) // 2))
    flips_train = {t.split("{n}")[1] for t in NATURAL_FLIPS[: len(NATURAL_FLIPS) // 2]}
    assert any(f.strip(" .") in e.text for e in train for f in flips_train)
    assert len(NATURAL_NAMES) == 16 and len(NATURAL_STAYS) == 4


@pytest.mark.parametrize("wordings", ["wider", "widest"])
def test_wider_wordings_stay_in_the_train_split(wordings):
    """wordings="wider" / "widest": their extra sentences appear in train stories, never in held-out
    ones, and no held-out sentence appears in a train story; the labels still follow flips and stays."""
    import re

    from beliefscope.tasks.coinflip import (
        NATURAL_FLIPS_MORE,
        NATURAL_FLIPS_MOST,
        NATURAL_STAYS_MORE,
        NATURAL_STAYS_MOST,
    )

    def pattern(t):  # a template as a regex over whole sentences, any name
        return re.compile(r"(?:^|\. )" + re.escape(t).replace(re.escape("{n}"), r"[A-Z][a-z]+"))

    most = NATURAL_FLIPS_MOST + NATURAL_STAYS_MOST if wordings == "widest" else ()
    more = [pattern(t) for t in NATURAL_FLIPS_MORE + NATURAL_STAYS_MORE + most]
    train = CoinFlip("natural", split="train", wordings=wordings).examples(400, seed=0, events=(4, 8))
    held = CoinFlip("natural", split="heldout", wordings=wordings).examples(300, seed=0, events=(4, 8))
    assert all(any(m.search(e.text) for e in train) for m in more)
    assert not any(m.search(e.text) for e in held for m in more)
    held_only = [pattern(t) for t in NATURAL_FLIPS[2:] + NATURAL_STAYS[2:]]
    assert not any(h.search(e.text) for e in train for h in held_only)
    from beliefscope.tasks.coinflip import NATURAL_FLIPS_EXTRA, NATURAL_STAYS_EXTRA

    kind_of = {t.format(n="NAME"): "flip" for t in NATURAL_FLIPS[:2] + NATURAL_FLIPS_EXTRA + NATURAL_FLIPS_MORE
               + NATURAL_FLIPS_MOST}
    kind_of |= {t.format(n="NAME"): "stay" for t in NATURAL_STAYS[:2] + NATURAL_STAYS_EXTRA + NATURAL_STAYS_MORE
                + NATURAL_STAYS_MOST}
    for e in train[:50]:  # e.g. "... but never flips it." is a stay: the state after it is unchanged
        state = e.initial
        for ev, name in zip(e.events, e.meta["names"]):
            sentence = e.text[ev.span[0]: ev.span[1]].strip().replace(name, "NAME")
            state ^= int(kind_of[sentence] == "flip")  # the hand-written template decides, not the generator
            assert ev.state_after == state, sentence
    with pytest.raises(ValueError, match="'wildest' is unknown.*'widest'"):
        CoinFlip("natural", wordings="wildest")


def test_cups_three_way_labels():
    ex = Cups("toy").example(seed=3, n_events=5)
    lab = ex.labels(toy_tokenizer())
    assert set(lab.state.tolist()) <= {0, 1, 2}
    # replay the swaps from the words
    words = ex.prompt.split()
    ball = words[4]
    i = 6
    while words[i] not in ("Where",):
        if words[i + 1] == "swaps":
            a, b = words[i + 2], words[i + 3]
            ball = b if ball == a else a if ball == b else ball
            i += 5
        else:
            i += 3
    assert ball == ex.answer
    assert ex.state_names[lab.state[-1]] == ex.answer


def test_sample_prompts_and_lengths():
    ps = sample_prompts(20, seed=4, events=(9, 16))
    assert len(ps) == 20 and all(p.endswith("State ?") for p in ps)
    counts = [p.count(" .") - 1 for p in ps]
    assert min(counts) >= 9 and max(counts) <= 16
    assert sample_prompts(5, seed=4) == sample_prompts(5, seed=4)
    assert sample_prompts(5, seed=4) != sample_prompts(5, seed=5)
    assert all(p.endswith("A:") for p in sample_prompts(3, 0, rendering="natural"))


def test_bad_task_and_range_errors():
    with pytest.raises(ValueError, match="coinflp.*Did you mean 'coinflip'"):
        get_task("coinflp")
    with pytest.raises(ValueError, match="9-3"):
        parse_events_range("9-3")
    with pytest.raises(ValueError, match="LO-HI"):
        parse_events_range("many")
    with pytest.raises(ValueError, match="rendering"):
        CoinFlip(rendering="klingon")


def test_parse_prompt_round_trips_generated_examples():
    from beliefscope.tasks.parse import parse_prompt

    for rendering, split in (("toy", "train"), ("natural", "all")):
        for ex in CoinFlip(rendering, split=split).examples(40, seed=2, events=(1, 9)):
            got = parse_prompt(ex.prompt)
            assert got.prompt == ex.prompt and got.events == ex.events and got.answer == ex.answer
    for ex in Cups("toy").examples(20, seed=2, events=(1, 6)):
        got = parse_prompt(ex.prompt, task="cups")
        assert got.events == ex.events and got.answer == ex.answer


def test_parse_prompt_rejects_unparseable_text():
    from beliefscope.tasks.parse import parse_prompt

    with pytest.raises(ValueError, match="character 17.*Bob flips"):
        parse_prompt("A coin is heads . Alice jumps . State ?")
    with pytest.raises(ValueError, match="opening"):
        parse_prompt("Once upon a time there was a coin.")


def test_cups_labels_by_hand_on_a_written_story():
    # ball under left; swap left/middle moves it to middle; a stay; swap left/right leaves it in the middle
    ex = parse_prompt("A ball is under left . Bob swaps left middle . Eve stays . Ivan swaps left right . Where ?",
                      task="cups")
    tok = toy_tokenizer()
    lab = ex.labels(tok)
    words = tok.convert_ids_to_tokens(lab.input_ids.tolist())
    # 6 words of setup, then "Bob swaps left middle" (left) and its "." (middle), then 3 + 5 + 2 words and the answer
    by_hand = ["left"] * 6 + ["left"] * 4 + ["middle"] + ["middle"] * (3 + 5 + 2 + 1)
    assert len(words) == len(by_hand)
    assert [ex.state_names[s] for s in lab.state] == by_hand
    assert ex.answer == "middle" and [e.kind for e in ex.events] == ["swap", "stay", "swap"]
    assert lab.parity.tolist()[-1] == 0  # two swaps: an even permutation


BAD_STORIES = [
    ("cups", "A ball is under left . Bob swaps left top . Where ?", "cup 'top'.*does not exist"),
    ("cups", "A ball is under left . Bob swaps left left . Where ?", "with itself"),
    ("variables", "a = 3 . b = c . b ?", "reads 'c', which is not assigned yet"),
    ("variables", "a = 3 . d = 1 . a ?", "'d', which is not a variable"),
    ("variables", "a = 3 . b ?", "asks for 'b', which the program never assigns"),
]


@pytest.mark.parametrize("task, text, match", BAD_STORIES)
def test_bad_stories_name_the_offending_word(task, text, match):
    with pytest.raises(ValueError, match=match):
        parse_prompt(text, task=task)


def test_variables_labels_by_hand():
    # a = 3 . b = a . a = 5 . c = b . c ?  ->  c is 3 (b copied a's 3 before a became 5)
    ex = parse_prompt("a = 3 . b = a . a = 5 . c = b . c ?", task="variables")
    tok = toy_tokenizer()
    lab = ex.labels(tok)
    assert ex.answer == "3" and [e.kind for e in ex.events] == ["set", "copy", "set", "copy"]
    names = ex.state_names
    every = [[names[v] for v in row] for row in lab.values]  # per token: a, b, c
    after = {0: ["_", "_", "_"], 1: ["3", "_", "_"], 2: ["3", "3", "_"], 3: ["5", "3", "_"], 4: ["5", "3", "3"]}
    # each statement is 4 words and completes at its '.'; the question and answer follow the last one
    by_hand = [after[0]] * 3 + [after[1]] * 4 + [after[2]] * 4 + [after[3]] * 4 + [after[4]] * 4
    assert every == by_hand
    assert [names[s] for s in lab.state] == [row[2] for row in by_hand]  # the queried variable is c
    assert lab.is_event_boundary.nonzero()[0].tolist() == [3, 7, 11, 15]


def test_variables_generator_resolves_copies_and_reads_only_assigned():
    task = get_task("variables")
    for ex in task.examples(200, seed=3, events="1-12"):
        values = {}
        for e in ex.events:  # re-execute the program from its text, independently of the generator
            target, _, source, _ = ex.text[e.span[0]: e.span[1]].split()
            values[target] = values[source] if source in values else source
            assert source.isdigit() or source in values
        query = ex.prompt.split()[-2]
        assert ex.answer == values[query]


def test_variables_exist_in_the_toy_grammar_only():
    with pytest.raises(ValueError, match="rendering 'natural' is not available"):
        get_task("variables", rendering="natural")


def test_variables_chain_of_thought_lists_every_state():
    ex = parse_prompt("a = 3 . b = a . b ? Think :", task="variables")
    assert ex.completion == " 3 _ _ ; 3 3 _ . 3"
    assert ex.text[ex.answer_span[0]: ex.answer_span[1]] == "3"


def test_natural_chain_of_thought_lists_each_state_then_the_answer():
    """The natural-English chain of thought (the smollm2-cot baseline's format): the states after
    each event, counted here by hand from the events' kinds, then ``A: <answer>``."""
    from beliefscope.tasks import get_task

    for seed in range(20):
        ex = get_task("coinflip", rendering="natural", fmt="cot", split="heldout").example(seed, 1 + seed % 6)
        state, want = ex.initial, []
        for e in ex.events:
            state ^= e.kind == "flip"
            want.append(("heads", "tails")[state])
        assert ex.prompt.endswith(" Step by step:") and " A:" not in ex.prompt
        assert ex.completion == " " + ", ".join(want) + f". A: {want[-1]}"
        assert ex.answer == want[-1] and ex.text[ex.answer_span[0]:ex.answer_span[1]] == want[-1]
