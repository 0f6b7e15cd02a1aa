"""Batched Thinking States inference gives every story the thoughts and answer it gets alone
(`decoding.thinking.run_thinking`, chunk by chunk, one story), in batches that mix stories of 1 to
32 events, with empty thoughts or without, when decoding goes on past the answer, and with
far fewer forwards than one story at a time."""

import pytest
import torch

from beliefscope.decoding.thinking import run_thinking
from beliefscope.decoding.thinking_batch import run_thinking_batch
from beliefscope.models.load import load_model
from beliefscope.models.thinking.drafter import ThoughtDrafter
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


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 4, 16])
def test_speculative_batch_equals_each_story_alone(model, k):
    """Drafted chunks, cut per story at its first mis-drafted thought: every story's thoughts and three
    new tokens are those it gets alone, chunk by chunk; drafting several chunks takes fewer forwards."""
    m, tok = model
    prompts, _ = _mixed_prompts(tok)
    out = run_thinking_batch(m, prompts, max_new_tokens=3, stop_at_eos=False, prefill="speculative", k=k)
    for b, p in enumerate(prompts):
        alone = run_thinking(m, p, max_new_tokens=3, stop_at_eos=False)
        assert out.thoughts[b] == alone.thoughts and out.tokens[b] == alone.tokens, (k, b)
    chunked = run_thinking_batch(m, prompts, max_new_tokens=3, stop_at_eos=False)
    if k > 1:
        assert out.backbone_forwards < chunked.backbone_forwards, (out.backbone_forwards, chunked.backbone_forwards)


def test_speculative_batch_with_a_drafter_that_is_always_wrong(model):
    """A drafter whose thought T never writes ("flips <eos>"): every draft is cut after its first chunk
    (one complete chunk per story per forward), and the result is still each story's own."""
    m, tok = model
    prompts, _ = _mixed_prompts(tok, n=6, seed=4)
    alone = [run_thinking(m, p, max_new_tokens=1) for p in prompts]

    class Wrong(ThoughtDrafter):
        def predict(self, state, chunk):
            return [tok.convert_tokens_to_ids("flips"), m.eos_id]

    out = run_thinking_batch(m, prompts, max_new_tokens=1, prefill="speculative", k=8,
                             thought_drafter=Wrong(m.eos_id))
    assert [o.thoughts for o in alone] == out.thoughts and [o.tokens for o in alone] == out.tokens
    complete = max(sum(c for _, _, c in m.spans(p)) for p in prompts)
    assert out.backbone_forwards >= complete  # no forward kept a second chunk of any story


def test_bad_input_is_refused(model):
    m, _ = model
    with pytest.raises(ValueError, match="at least one non-empty prompt .*1 empty"):
        run_thinking_batch(m, [[1, 2], []])
    with pytest.raises(ValueError, match="max_new_tokens=0 must be >= 1"):
        run_thinking_batch(m, [[1, 2]], max_new_tokens=0)
    with pytest.raises(ValueError, match="prefill='draft' is unknown"):
        run_thinking_batch(m, [[1, 2]], prefill="draft")
    with pytest.raises(ValueError, match=r"needs k >= 1 \(got 0\)"):
        run_thinking_batch(m, [[1, 2]], prefill="speculative", k=0)
    limit = m.backbone.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"need {limit + 1} positions but the model addresses {limit}"):
        run_thinking_batch(m, [[1] * limit])
    assert torch.is_grad_enabled()
