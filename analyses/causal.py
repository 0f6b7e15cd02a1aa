"""The causal check of a Thinking States model: replace S at one chunk by another state's and see
whether the answer and every later thought follow the state it leads to.

The state it leads to is computed, not assumed: the task's ``replay`` runs the later events from
the swapped state (the same flips, swaps or statements), so the check works for one bit, three
cups and a binding of several variables alike. Random vectors of the same norm are the control.
"""

from __future__ import annotations

import importlib
import random
from functools import singledispatch

import numpy as np
import torch

from ..decoding.thinking import run_thinking
from ..models.thinking.data import thought_word_id
from ..models.thinking.model import ThinkingStates
from ..tasks import get_task
from ..tasks.variables import VARIABLES


def _replay(ex, done: int, start):
    """States after each event from ``done`` on, had the state been ``start`` there (the task's replay)."""

    return importlib.import_module(f"beliefscope.tasks.{ex.task}").replay(ex, done, start)


def _words(ex, state) -> tuple[str, ...]:
    """A state's words as a thought writes them (every variable's value, or the one state word)."""
    return tuple(ex.state_names[int(v)] for v in state) if ex.initial_values else (ex.state_names[int(state)],)


def _answer(ex, state) -> int:
    """The answer a state gives to ``ex``'s question (the queried variable's value, or the state)."""
    if not ex.initial_values:
        return int(state)

    return int(state[VARIABLES.index(ex.meta["query"])])


def _other_state(ex, state, rng):
    """Another state than ``state``: a different class, or a different value of the queried variable
    (of an assigned one when the queried variable has none yet)."""
    n = len(ex.state_names)
    if not ex.initial_values:
        return (int(state) + 1 + rng.randrange(n - 1)) % n

    q = VARIABLES.index(ex.meta["query"])
    k = q if state[q] else rng.choice([i for i, v in enumerate(state) if v])
    new = list(state)
    new[k] = rng.choice([v for v in range(1, n) if v != state[k]])
    return tuple(new)


@singledispatch
def causal_check(model, tok, n: int, seed: int, task=None) -> dict | None:
    """Replace S_j at one middle chunk by the S of another state's gold thought; does the answer
    become the one that state leads to (the task's replay of the later events), and do the later
    thoughts name the replayed states? Random vectors of equal norm are the control. A model that writes no
    thoughts has no written state to replace: None (the check is `ThinkingStates`' overload, below)."""
    return None


@causal_check.register(ThinkingStates)
def _replace_written_states(model, tok, n: int, seed: int, task=None) -> dict:

    task = task or get_task("coinflip", fmt="direct")
    exs = task.examples(n, seed, (3, 8))
    answers = [thought_word_id(tok, s) for s in exs[0].state_names]
    g, rng = torch.Generator().manual_seed(seed), random.Random(seed)
    flips = {"swap": [], "random": []}
    follow = {"swap": [], "random": []}
    thoughts_follow = {"swap": [], "random": []}
    for ex in exs:
        ids = tok(ex.prompt)["input_ids"]
        lab = ex.labels(tok, ex.prompt)
        base = run_thinking(model, ids, max_new_tokens=1)
        j = 1 + len(base.thoughts) // 2  # the chunk whose state is replaced
        done = int(lab.events_so_far[base.thoughts[j - 1][0] - 1])  # events read when S_j was written
        state = lab.values[base.thoughts[j - 1][0] - 1] if lab.values is not None else lab.state[
            base.thoughts[j - 1][0] - 1]
        new = _other_state(ex, tuple(int(v) for v in state) if lab.values is not None else int(state), rng)
        later = _replay(ex, done, new)  # states after each later event
        expect = answers[_answer(ex, later[-1] if later else new)]
        gold = model.state_from_thoughts([[thought_word_id(tok, w) for w in _words(ex, new)] + [model.eos_id]])[0]
        for kind in ("swap", "random"):
            if kind == "swap":
                vec = gold
            else:
                r = torch.randn(gold.shape, generator=g).to(gold.device)  # drawn on the host: the same on any device
                vec = base.states[j - 1] + r / r.norm() * (gold - base.states[j - 1]).norm()
            run = run_thinking(model, ids, max_new_tokens=1, intervene=lambda k, s, v=vec, jj=j: v if k == jj else s)
            flips[kind].append(run.tokens[0] != base.tokens[0])
            follow[kind].append(run.tokens[0] == expect)
            # an empty thought (S carried over) names the state S held: the swapped one, or none for a random S
            ok, named = [], list(_words(ex, new)) if kind == "swap" else None
            for end, z in run.thoughts[j:]:
                k = int(lab.events_so_far[end - 1]) - done
                want = _words(ex, later[k - 1] if k >= 1 else new)
                named = named if model.carries(z) else [tok.decode([t]).strip() for t in z[: len(want)]]
                ok.append(named == list(want))
            thoughts_follow[kind].append(bool(ok) and all(ok))
    return {"n": n, "answer_flip_rate_swap": float(np.mean(flips["swap"])),
            "answer_flip_rate_random": float(np.mean(flips["random"])),
            "answer_follows_swap": float(np.mean(follow["swap"])),
            "answer_follows_random": float(np.mean(follow["random"])),
            "downstream_thoughts_follow_swap": float(np.mean(thoughts_follow["swap"])),
            "downstream_thoughts_follow_random": float(np.mean(thoughts_follow["random"]))}
