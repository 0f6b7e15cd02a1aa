"""Forced answers at every event boundary (the Z_i of seed 004), through KV-cache forks.

The story is prefilled once. At each event boundary i the cache is forked at length i + 1, the
question is appended on the branch, the answer distribution is read, and the branch is dropped.
Each position costs O(question length) instead of O(prefix).

>>> from models.load import load_model  # doctest: +SKIP
>>> bridge, tok = load_model("target")  # doctest: +SKIP
>>> ex = get_task("coinflip").example(seed=0, n_events=3)  # doctest: +SKIP
>>> forced_answers(bridge, tok, ex).p_state.shape  # doctest: +SKIP
(3, 2)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cache import KVCache


@dataclass
class ForcedAnswers:
    """Answer distributions read at event boundaries of one example."""

    positions: np.ndarray  # [n] token index of each event boundary in the story
    p_state: np.ndarray  # [n, n_states] answer distribution restricted to the state words
    true_state: np.ndarray  # [n] state index after each event
    story_ids: np.ndarray  # [T] token ids of the story (prompt without the question)
    question_ids: np.ndarray  # [q] token ids of the appended question


def split_story(ex) -> tuple[str, str]:
    """(story, question): the prompt up to the end of the last event, and the rest of it."""
    if not ex.events:
        raise ValueError("an example with no events has no event boundaries to read")
    end = ex.events[-1].span[1]
    return ex.prompt[:end], ex.prompt[end:]


def answer_token_ids(tok, state_names) -> list[int]:
    """First token of " <state>" for each state name; they must differ."""
    ids = [tok(" " + s, add_special_tokens=False)["input_ids"][0] for s in state_names]
    if len(set(ids)) != len(ids):
        raise ValueError(f"state names {state_names} share a first token under this tokenizer")
    return ids


def _state_probs(logits: torch.Tensor, ans: list[int]) -> np.ndarray:
    return torch.softmax(logits[..., ans].double(), -1).numpy()


@torch.no_grad()
def forced_answers(bridge, tok, ex, use_fork: bool = True) -> ForcedAnswers:
    """Answer distribution after every event; `use_fork=False` recomputes each prefix from scratch."""
    story, question = split_story(ex)
    lab = ex.labels(tok, text=story) if story != ex.prompt else ex.labels(tok, text=story)
    story_ids = torch.as_tensor(lab.input_ids)[None]  # [1, T]
    q_ids = torch.tensor(tok(question, add_special_tokens=False)["input_ids"])[None]  # [1, q]
    positions = np.nonzero(lab.is_event_boundary)[0]
    ans = answer_token_ids(tok, ex.state_names)
    out = []
    if use_fork:
        cache = KVCache.for_model(bridge, batch=1, capacity=story_ids.shape[1] + q_ids.shape[1] + 8)
        bridge(story_ids, past_key_values=cache, return_type="logits")
        for i in positions:
            with cache.fork(at=int(i) + 1) as branch:
                logits = bridge(q_ids, return_type="logits", **branch.forward_kwargs(q_ids.shape[1]))
            out.append(_state_probs(logits[0, -1], ans))
    else:
        for i in positions:
            ids = torch.cat([story_ids[:, : int(i) + 1], q_ids], dim=1)
            out.append(_state_probs(bridge(ids, return_type="logits")[0, -1], ans))
    return ForcedAnswers(positions, np.stack(out), lab.state[positions], lab.input_ids, q_ids[0].numpy())
