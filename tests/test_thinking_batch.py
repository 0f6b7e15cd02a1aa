"""Batched Thinking States inference gives every story the thoughts and answer it gets alone
(`decoding.thinking.run_thinking`, chunk by chunk, one story), in batches that mix stories of 1 to
32 events, with empty thoughts or without, when decoding goes on past the answer, and with
far fewer forwards than one story at a time."""

import pytest
import torch
from beliefscope.decoding.thinking import run_thinking
from beliefscope.decoding.thinking_batch import run_thinking_batch
from beliefscope.models.load import load_model
from beliefscope.tasks import get_task


@pytest.fixture(scope="module", params=["thinking", "thinking-empty"])
def model(request):
    return load_model(request.param, device="cpu")


def _mixed_prompts(tok, n=12, seed=9):
    task = get_task("coinflip", fmt="direct")
    exs = [task.example(seed * 1000 + i, n_events) for i, n_events in
           enumerate([1, 32, 2, 17, 8, 3, 24, 5, 12, 1, 9, 4][:n])]
    return [tok(e.prompt)["input_ids"] for e in exs], exs


def test_batch_equals_each_story_alone(model):
    m, tok = model
    prompts, exs = _mixed_prompts(tok)
    out = run_thinking_batch(m, prompts, max_new_tokens=1)
    right = 0
    for b, p in enumerate(prompts):
        alone = run_thinking(m, p, max_new_tokens=1)
        assert out.thoughts[b] == alone.thoughts, b
        assert out.tokens[b] == alone.tokens, b
        right += tok.decode(out.tokens[b]).strip() == exs[b].answer
    assert right == len(prompts)  # and the answers are the labels (the shipped models are exact here)
    steps = max(len(m.spans(p)) for p in prompts)
    assert out.backbone_forwards == steps and out.think_calls <= steps  # one forward per chunk index


def test_decoding_past_the_answer_matches_alone(model):
    """Three new tokens: the answer, then tokens fed back (a chunk may complete while decoding)."""
    m, tok = model
    prompts, _ = _mixed_prompts(tok, n=4, seed=3)
    out = run_thinking_batch(m, prompts, max_new_tokens=3, stop_at_eos=False)
    for b, p in enumerate(prompts):
        alone = run_thinking(m, p, max_new_tokens=3, stop_at_eos=False)
        assert out.tokens[b] == alone.tokens and out.thoughts[b] == alone.thoughts, b


def test_bad_input_is_refused(model):
    m, _ = model
    with pytest.raises(ValueError, match="at least one non-empty prompt .*1 empty"):
        run_thinking_batch(m, [[1, 2], []])
    with pytest.raises(ValueError, match="max_new_tokens=0 must be >= 1"):
        run_thinking_batch(m, [[1, 2]], max_new_tokens=0)
    limit = m.backbone.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"need {limit + 1} positions but the model addresses {limit}"):
        run_thinking_batch(m, [[1] * limit])
    assert torch.is_grad_enabled()
