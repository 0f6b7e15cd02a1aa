"""The instrument on any state: n-way probes and confusion, replayed counterfactuals for the causal
check, and the state a thought names for a multi-variable question."""

import numpy as np

from beliefscope.analyses.causal import _other_state, _replay, causal_check
from beliefscope.analyses.instrument import agreement
from beliefscope.models.thinking.data import thought_state
from beliefscope.tasks import get_task
from beliefscope.tasks.parse import parse_prompt


def test_replay_from_the_true_state_gives_the_story_back():
    for task in ("coinflip", "cups", "variables"):
        for ex in get_task(task).examples(40, seed=5, events="2-9"):
            start = ex.initial_values if ex.initial_values else ex.initial
            after = [e.values if ex.initial_values else e.state_after for e in ex.events]
            assert _replay(ex, 0, start) == after
            assert _replay(ex, 2, after[1]) == after[2:]


def test_replayed_counterfactual_by_hand():
    # the ball is moved to the right cup after the first swap; the later swap (left, right) takes it left
    ex = parse_prompt("A ball is under left . Bob swaps left middle . Eve swaps left right . Where ?", task="cups")
    assert _replay(ex, 1, 2) == [0]
    # a = 3 . b = a . c = b . : had b been 7 after two statements, c copies 7
    ex = parse_prompt("a = 3 . b = a . c = b . c ?", task="variables")
    seven = ex.state_names.index("7")
    assert _replay(ex, 2, (ex.state_names.index("3"), seven, 0)) == [(ex.state_names.index("3"), seven, seven)]


def test_other_state_differs_where_the_question_looks():
    import random

    rng = random.Random(0)
    ex = parse_prompt("a = 3 . b = a . b ?", task="variables")
    for _ in range(20):
        new = _other_state(ex, ex.events[-1].values, rng)
        assert new[1] != ex.events[-1].values[1] and new[1] != 0 and new[0] == ex.events[-1].values[0]
    ex = get_task("cups").example(seed=1, n_events=3)
    assert {_other_state(ex, 0, rng) for _ in range(30)} == {1, 2}


def test_thought_state_reads_the_queried_variable():
    ex = parse_prompt("a = 3 . b = a . a = 5 . b ?", task="variables")
    words = list(range(100, 100 + len(ex.state_names)))  # stand-in token ids of the state words
    three, five = words[ex.state_names.index("3")], words[ex.state_names.index("5")]
    assert thought_state(ex, [five, three, words[0], 1], words) == ex.state_names.index("3")  # b is 2nd
    assert thought_state(ex, [five], words) == -1


def test_agreement_confusion_counts_three_classes():
    cols = {"truth": np.array([0, 1, 2, 2]), "forced": np.array([0, 1, 1, 2]), "thought": np.array([-1] * 4)}
    out = agreement(cols, np.array([0, 2, 2, 2]), 3)
    assert out["probe_confusion"] == [[1, 0, 0], [0, 0, 1], [0, 0, 2]]
    assert out["probe_accuracy"] == 0.75 and out["forced_accuracy"] == 0.75


def test_causal_check_on_thinking_follows_the_replayed_state():
    from beliefscope.models.load import load_model

    model, tok = load_model("thinking")
    res = causal_check(model, tok, 6, seed=7)
    assert res["answer_follows_swap"] == 1.0 and res["downstream_thoughts_follow_swap"] == 1.0
    assert res["answer_follows_random"] < 1.0
