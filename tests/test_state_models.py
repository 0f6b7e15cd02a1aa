"""The shipped state-tracking models beyond one bit (three cups, variables): answers and thoughts
against the task's own labels, at the trained lengths and far past them."""

import pytest

from beliefscope.models.evaluate import evaluate
from beliefscope.models.load import SHIPPED

THINKING = [name for name in ("thinking-cups", "thinking-variables") if name in SHIPPED]


# per model: (answer, thought) floors on the first band, and the answer floor on the second-longest band.
# Measured on 200 prompts per band (model cards): thinking-cups 1.00 everywhere; thinking-variables (9000
# steps) 1.00 answers and thoughts at 1-10, 10-25, 25-50 and 50-100 updates (chance 0.1).
FLOORS = {"thinking-cups": (0.97, 0.97, 0.85), "thinking-variables": (0.97, 0.97, 0.9)}


@pytest.mark.slow
@pytest.mark.parametrize("name", THINKING)
def test_thinking_answers_and_thoughts_far_past_training(name):
    task = name.split("-")[1]
    from beliefscope.tasks import get_task

    bands = get_task(task).bands
    answer, thought, far = FLOORS[name]
    short = evaluate(name, task, bands[0], n=30, seed=7)
    long = evaluate(name, task, bands[-2], n=6, seed=7)  # 17-32 swaps, or 25-50 updates (seeded: no flakes)
    assert short["answer_accuracy"] >= answer and short["thought_accuracy"] >= thought
    assert long["answer_accuracy"] >= far


# the chain-of-thought baselines, the answer after their own chain against the task's label: right at the
# trained lengths (on 200 per band: cot-cups 0.69, cot-variables 1.00; on these 30 prompts 0.73 and 1.00)
COT_FLOORS = {"cot-cups": 0.5, "cot-variables": 0.9}


@pytest.mark.parametrize("name", [n for n in COT_FLOORS if n in SHIPPED])
def test_cot_baseline_answers_after_its_own_chain(name):
    task = name.split("-")[1]
    from beliefscope.tasks import get_task

    res = evaluate(name, task, get_task(task).bands[0], n=30, seed=7, formats=("cot",))
    assert res["cot_answer_accuracy"] >= COT_FLOORS[name], res
