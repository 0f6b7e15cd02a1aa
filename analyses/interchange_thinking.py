"""Interchange on a Thinking States model's written state: the ground truth of `analyses.interchange`.

A Thinking States model (Thinking States, 2025: a thought written after each chunk becomes the state S
added to the next chunk) keeps its belief where it can be swapped: after chunk j, replace the base's S_j by the
source's S_j (the state the source's own thought gave at the same chunk) and read the answer. The counterfactual
answer is the task's replay of the base's later events from the source's state there
(`analyses.pairs.counterfactual_state`), so IIA here is what `analyses.interchange` scores at a residual
site, at the site the model was built to use. The control puts in a random vector at the same distance from
the base's S (drawn on the host, seeded); its IIA says how often any edit of that size lands on the
counterfactual answer.

Pairs must be token-aligned at the chunks (a minimal pair with one event turned over, in the toy rendering):
a pair whose chunks end elsewhere in the source is refused, naming it.
"""

from __future__ import annotations

from functools import singledispatch

import numpy as np
import torch

from ..decoding.thinking import run_thinking
from ..models.thinking.data import thought_word_id
from ..models.thinking.model import ThinkingStates
from ..probes.intervals import scored
from .pairs import counterfactual_state


@singledispatch
def thinking_interchange(model, tok, pairs: list, seed: int = 0, progress=None) -> dict:
    """Per chunk j (1-based): IIA of the S swap and of the equal-distance random control over the pairs whose
    counterfactual answer differs from the base's, with 95% intervals over base stories. A model that writes no
    thoughts is refused (the swap is `ThinkingStates`' overload, below)."""
    raise ValueError("this model writes no thoughts: interchange its residual with analyses.interchange")


@thinking_interchange.register(ThinkingStates)
@torch.no_grad()
def _swap_states(model, tok, pairs: list, seed: int = 0, progress=None) -> dict:
    answers = [thought_word_id(tok, s) for s in pairs[0].base.state_names]
    g = torch.Generator().manual_seed(seed)
    runs = []
    for p in pairs:
        ids_b, ids_s = (tok(ex.prompt)["input_ids"] for ex in (p.base, p.source))
        base, src = run_thinking(model, ids_b, max_new_tokens=1), run_thinking(model, ids_s, max_new_tokens=1)
        if [e for e, _ in base.thoughts] != [e for e, _ in src.thoughts]:
            raise ValueError(f"pair {p.name}: the source's chunks end at {[e for e, _ in src.thoughts]}, the base's "
                             f"at {[e for e, _ in base.thoughts]}: pair stories whose chunks align (a minimal pair "
                             "in the toy rendering, analyses.pairs.task_pairs)")
        if base.tokens[:1] == [answers[p.base.final_state]] and src.tokens[:1] == [answers[p.source.final_state]]:
            runs.append((p, ids_b, base, src))  # scored only where the model answers both stories right
    by_chunk: dict[int, dict[str, list]] = {}
    for p, ids_b, base, src in runs:
        lab_b, lab_s = (ex.labels(tok, text=ex.prompt) for ex in (p.base, p.source))
        for j in range(1, len(base.thoughts) + 1):
            end = base.thoughts[j - 1][0]
            want = counterfactual_state(p, int(lab_b.events_so_far[end - 1]), int(lab_s.events_so_far[end - 1]))
            if want is None or want == p.base.final_state:
                continue
            r = torch.randn(base.states[j - 1].shape, generator=g).to(base.states[j - 1].device)
            gap = (src.states[j - 1] - base.states[j - 1]).norm()
            row = by_chunk.setdefault(j, {"swap": [], "random": [], "unit": []})
            for kind, vec in (("swap", src.states[j - 1]), ("random", base.states[j - 1] + r / r.norm() * gap)):
                run = run_thinking(model, ids_b, max_new_tokens=1, intervene=lambda k, s, v=vec, jj=j: v if k == jj
                                   else s)
                row[kind].append(run.tokens[0] == answers[want])
            row["unit"].append(p.unit)
        if progress:
            progress(1)
    rows = [{"chunk": j, "iia_swap": scored(v["swap"], np.asarray(v["unit"]), seed).to_json(),
             "iia_random": scored(v["random"], np.asarray(v["unit"]), seed).to_json()}
            for j, v in sorted(by_chunk.items())]
    return {"n_pairs": len(pairs), "n_answered_right": len(runs), "site": "the state S written after chunk j",
            "chunks": rows, "scored_on": "pairs whose base and source the model answers right, at chunks whose "
                                         "counterfactual answer differs from the base's own"}
