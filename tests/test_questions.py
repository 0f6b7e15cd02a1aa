"""Questions as people ask them: varied question forms (train / held-out halves, before or after the
story, with or without "A:"), stories inside a chat template, the composed "people" wordings and the
hand-written free-wording stories. Every event span must still cover its sentence, so that token
labels and gold thoughts stay right whatever surrounds the story."""

import json
import re

import pytest

from beliefscope.models.tokenizer import toy_tokenizer
from beliefscope.tasks import get_task
from beliefscope.tasks.coinflip import STATES
from beliefscope.tasks.coinflip_free import free_examples, free_path, story_example
from beliefscope.tasks.questions import QUESTION_FORMS, in_chat


def _spans_hold(ex):
    for e in ex.events:
        sentence = ex.prompt[e.span[0]: e.span[1]]
        assert sentence.endswith(".") and sentence.count(".") == 1 and not sentence.startswith(" "), sentence
    assert ex.text[ex.answer_span[0]: ex.answer_span[1]] == ex.answer


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_varied_questions_keep_spans_and_halves(split):
    task = get_task("coinflip", rendering="natural", split=split, wordings="people" if split == "train" else "basic",
                    questions="varied")
    exs = task.examples(300, seed=5, events=(1, 6))
    half = QUESTION_FORMS[: len(QUESTION_FORMS) // 2] if split == "train" else QUESTION_FORMS[len(QUESTION_FORMS) // 2:]
    for ex in exs:
        _spans_hold(ex)
        q = ex.meta["question"].removesuffix("A:").strip()
        assert q in half, (q, split)
    first = [ex.meta["question_first"] for ex in exs]
    cue = [ex.prompt.endswith("A:") for ex in exs]
    assert 0.15 < sum(first) / len(exs) < 0.45 and 0.3 < sum(cue) / len(exs) < 0.7


def test_fixed_questions_are_unchanged_by_the_new_settings():
    """The held-out bands every model card reports draw the same stories as before."""
    a = get_task("coinflip", rendering="natural", split="heldout").examples(20, 12345, (1, 8))
    b = get_task("coinflip", rendering="natural", split="heldout", questions="fixed").examples(20, 12345, (1, 8))
    assert [x.prompt for x in a] == [x.prompt for x in b] and all(x.prompt.endswith("A:") for x in a)


def test_people_wordings_compose_past_tense_and_unrelated_sentences():
    exs = get_task("coinflip", rendering="natural", split="train", wordings="people").examples(400, 1, (3, 6))
    text = " ".join(ex.prompt for ex in exs)
    from beliefscope.tasks.coinflip_people import FILLERS

    assert "flipped" in text, "past-tense stories are composed"
    assert any(f[0].format(n="") in text or f[1].format(n="") in text for f in FILLERS if "{n}" not in f[0])
    for ex in exs:
        _spans_hold(ex)
        # the state after each event follows from its kind alone (flip changes it, stay keeps it)
        state = ex.initial
        for e in ex.events:
            state ^= int(e.kind == "flip")
            assert e.state_after == state


def test_story_in_a_chat_template_moves_every_span():
    tok = toy_tokenizer()
    tok.chat_template = "{% for m in messages %}<u> {{ m['content'] }} </u>{% endfor %} <a>"
    ex = get_task("coinflip", rendering="natural", split="heldout", questions="varied").example(3, 4)
    chat = in_chat(ex, tok)
    assert chat.prompt.startswith("<u> ") and chat.prompt.endswith("<a>") and chat.completion == ex.completion
    assert [chat.prompt[e.span[0]: e.span[1]] for e in chat.events] == [ex.prompt[e.span[0]: e.span[1]]
                                                                        for e in ex.events]
    _spans_hold(chat)
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        in_chat(ex, tok)


def test_free_wording_stories_by_hand():
    exs = {ex.meta["id"]: ex for ex in free_examples()}
    assert len(exs) >= 100
    for ex in exs.values():
        _spans_hold(ex)
    # free-004: "tails side pressed against the table" -> heads up; flip, flip back, nobody -> heads
    ex = exs["free-004"]
    assert STATES[ex.initial] == "heads" and ex.states_after_events == ["tails", "heads", "heads"]
    assert ex.prompt.endswith("What's facing up at the end, heads or tails?") and ex.answer == "heads"
    # free-034 asks first: "Heads or tails? Coin on heads. Rex flips it. ..." -> 3 flips -> tails
    ex = exs["free-034"]
    assert ex.prompt.startswith("Heads or tails? Coin on heads.") and ex.answer == "tails"
    assert ex.prompt[ex.events[0].span[0]: ex.events[0].span[1]] == "Rex flips it."


def test_free_story_errors_name_the_value(tmp_path):
    good = {"id": "x", "initial": "heads", "opening": "Heads up.",
            "events": [{"sentence": "Bo flips it.", "flip": True}], "question": "Which side?", "question_first": False}
    for bad, match in ((dict(good, initial="edge"), "initial 'edge'"),
                       (dict(good, opening="Dr. Li sets it heads up."), "only '.'"),
                       (dict(good, events=[{"sentence": "Bo flips it.", "flip": "yes"}]), "flip 'yes'"),
                       (dict(good, question="Which side."), "must be a question")):
        with pytest.raises(ValueError, match=match):
            story_example(bad)
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(ValueError, match="appears twice"):
        free_examples(str(path))


def test_people_wordings_share_no_sentence_with_the_free_set():
    """The training pools teach kinds of sentence the free-wording set showed were misread; none of the
    free set's own sentences (openings or events) is composed for training, except the plainest flips
    ("<name or pronoun> flips it [again].", which no wording can avoid)."""
    free = {ex.prompt[e.span[0]: e.span[1]] for ex in free_examples() for e in ex.events}
    free |= {json.loads(line)["opening"] for line in open(free_path()) if line.strip()}
    exs = get_task("coinflip", rendering="natural", split="train", wordings="people").examples(3000, 7, (1, 8))
    composed = {ex.prompt[e.span[0]: e.span[1]] for ex in exs for e in ex.events}
    composed |= {ex.prompt[: ex.events[0].span[0]].strip() for ex in exs}
    assert len(composed) > 2000
    shared = {t for t in composed & free if not re.fullmatch(r"\w+ flips it( again)?\.", t)}
    assert not shared, sorted(shared)[:5]
