"""The shipped state-tracking models beyond one bit (three cups, variables): answers and thoughts
against the task's own labels, at the trained lengths and far past them."""

import pytest
from beliefscope.models.evaluate import evaluate
from beliefscope.models.load import SHIPPED

THINKING = [name for name in ("thinking-cups", "thinking-variables") if name in SHIPPED]


@pytest.mark.parametrize("name", THINKING)
def test_thinking_answers_and_thoughts_far_past_training(name):
    task = name.split("-")[1]
    from beliefscope.tasks import get_task

    bands = get_task(task).bands
    short = evaluate(name, task, bands[0], n=40, seed=7)
    long = evaluate(name, task, bands[-1], n=8, seed=7)  # 33-64 swaps, or 50-100 updates
    assert short["answer_accuracy"] >= 0.97 and short["thought_accuracy"] >= 0.97
    assert long["answer_accuracy"] >= 0.85 and long["thought_accuracy"] >= 0.9
