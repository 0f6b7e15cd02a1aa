"""Deterministic requests: identical verified output across batch compositions and arrival orders."""

import random

import pytest
import torch

from decoding import SpecConfig, generate
from decoding.scheduler import Request, Scheduler, SchedulerConfig
from tests.test_decoding import _toy
from tests.conftest import TARGET


def determinism_sweep(model, prompts, others_prompts, others=(0, 1, 3, 7, 15), orders=3, window=4,
                      max_new_tokens=12, fast_dtype=torch.float32, deterministic=True, eos=None):
    """Outputs of every measured prompt for every (others, order): {prompt index: set of outputs}."""
    seen = {i: set() for i in range(len(prompts))}
    sched = Scheduler(model, SchedulerConfig(window=window, fast_dtype=fast_dtype, eos_token_id=eos))
    for k in others:
        for order in range(orders):
            reqs = [Request(list(p), max_new_tokens, deterministic=deterministic) for p in prompts]
            n_others = 0 if k == 0 else len(prompts) // 2
            rng = random.Random(f"{k}/{order}")
            reqs += [Request(list(rng.choice(others_prompts)), rng.randint(4, 2 * max_new_tokens))
                     for _ in range(n_others)]
            idx = list(range(len(reqs)))
            if order == 1:
                idx.reverse()
            elif order == 2:
                rng.shuffle(idx)
            for rank, i in enumerate(idx):  # arrival: a few requests per round
                reqs[i].arrival = rank // 3
            sched.cfg.max_batch = k + 1
            outs = sched.run(reqs)
            for i in range(len(prompts)):
                seen[i].add(tuple(outs[i]))
    return seen


@pytest.fixture(scope="module")
def setup():
    from models.tokenizer import toy_tokenizer
    from tasks import get_task

    tok = toy_tokenizer()
    model = _toy("target", TARGET)
    exs = get_task("coinflip", fmt="cot", split="heldout").examples(80, seed=99, events=(1, 8))
    ps = [tok(e.prompt)["input_ids"] for e in exs]
    return model, ps[:50], ps[50:]


@pytest.mark.slow
def test_deterministic_requests_identical_across_batches(setup):
    model, prompts, others = setup
    seen = determinism_sweep(model, prompts, others)
    assert max(len(v) for v in seen.values()) == 1
    cfg = SpecConfig(gamma=3, max_new_tokens=12, stop_at_eos=False)
    for i, p in enumerate(prompts):  # and it is the fixed-shape reference output
        assert seen[i] == {tuple(generate(model, p, cfg, window=4).tokens)}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
