"""Where the answer's attention goes: at the answer position (the prompt's last token), per layer and head, the
attention mass on the true evidence against the mass on a distractor.

- **evidence**: the sentence that set the current state (the last event that changed it; the opening, before
  the first event, where none did);
- **distractor**: the sentence holding the last mention of the class named last in the story
  (`tasks.surface.last_named`), the reading a model that "answers the box named last" would use.

The first token is left out of both (most models park attention there, the "attention sink"; its mass is
reported as ``sink_mass``). Only stories where the two differ (the last-named class is not the answer, and the
sentences are not the same) are scored; the others are counted. Masses are also grouped by how many sentences
follow the evidence (``by_sentences_after``: recency) and precede it (``by_sentences_before``). The pattern is
captured at ``blocks.L.attn.hook_pattern`` by `hooks.capture`, the hooks every other reading uses.

Usage (not run as a doctest: it needs a model and many forwards)::

    res = evidence_attention(model, tok, examples)
    res["evidence_mass"][layer], res["distractor_mass"][layer]  # means over heads and stories
"""

from __future__ import annotations

import re

import numpy as np
import torch

from ..hooks import capture
from ..models.profile import model_shapes
from ..probes.intervals import group_interval
from ..tasks.surface import last_named
from .forced import split_story


def sentence_spans(ex) -> list[tuple[int, int, int]]:
    """``(start, end, state after)`` of the opening (before the first event) and of every event's last sentence."""
    first = ex.events[0].span[0] if ex.events else len(ex.prompt)
    spans = [(0, first, int(ex.initial))] if first > 0 else []
    return spans + [(_last_sentence(ex.prompt, *e.span), int(e.span[1]), int(e.state_after)) for e in ex.events]


def _last_sentence(text: str, start: int, end: int) -> int:
    """Where the last sentence of ``text[start:end]`` starts (a record's event span runs from the previous event's
    end, so the first one holds every sentence before it)."""
    cut = max(text.rfind(p, start, end - 1) for p in (". ", "? ", "! "))
    return cut + 2 if cut >= start else start


def evidence_and_distractor(ex) -> tuple[tuple[int, int] | None, tuple[int, int] | None, int, int]:
    """(evidence char span, distractor char span or None, the true class, the last-named class) of one story."""
    spans = sentence_spans(ex)
    truth = spans[-1][2]
    k = len(spans) - 1
    while k > 0 and spans[k - 1][2] == truth:  # back to the sentence that set the current state
        k -= 1
    evidence = spans[k][:2]
    story, _ = split_story(ex)
    names = list(ex.meta.get("classes") or ex.state_names)
    named = int(last_named(story, names, np.asarray([len(story)]))[0])
    if named < 0 or named == truth:
        return evidence, None, truth, named
    name = str(names[named]).strip()
    pattern = r"(?<!\w)" + re.escape(name) + r"(?!\w)"  # as `last_named` matches it (one letter: as written)
    last = [m.start() for m in re.finditer(pattern, story, flags=0 if len(name) == 1 else re.IGNORECASE)][-1]
    hold = next((sp[:2] for sp in spans if sp[0] <= last < sp[1]), None)
    if hold is None or hold == evidence:
        return evidence, None, truth, named
    return evidence, hold, truth, named


def sentences_after(story: str, end: int) -> int:
    """How many sentences of `story` follow the one ending at character `end` (recency: 0 is the last)."""
    return len(re.findall(r"[.?!](\s|$)", story[end:].strip()))


def by_group(E: np.ndarray, D: np.ndarray, key: list) -> dict:
    """Per-layer mean masses (over heads and stories) grouped by `key` (sentences after, or before, the evidence)."""
    key = np.asarray(key)
    return {str(k): {"n": int((key == k).sum()), "evidence_mass": E[key == k].mean((0, 2)).round(4).tolist(),
                     "distractor_mass": D[key == k].mean((0, 2)).round(4).tolist()} for k in sorted(set(key))}


def _mask(offsets: np.ndarray, span: tuple[int, int]) -> np.ndarray:
    """``[T]`` tokens whose characters fall in `span`."""
    return (offsets[:, 0] < span[1]) & (offsets[:, 1] > span[0]) & (offsets[:, 1] > offsets[:, 0])


@torch.no_grad()
def evidence_attention(model, tok, examples, progress=None) -> dict:
    """Mean attention mass of the answer position on the evidence vs the distractor, per layer and head, over the
    stories where the two differ; with the per-layer head means, the share of heads that favour the evidence,
    and 95% bootstrap intervals over stories of the per-layer means."""
    s = model_shapes(model)
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(s.n_layers)]
    ev, di, sink, back, index, scored, skipped = [], [], [], [], [], 0, 0
    for ex in examples:
        evidence, distractor, truth, named = evidence_and_distractor(ex)
        if distractor is None:
            skipped += 1
        else:
            enc = tok(ex.prompt, return_offsets_mapping=True)
            offsets = np.asarray(enc["offset_mapping"])  # [T, 2]
            ids = torch.tensor([enc["input_ids"]], device=s.device)  # [1, T]
            with capture(model, names) as cap:
                model(ids, return_type=None)
            pat = torch.stack([cap.stacked(n)[0, :, -1].float() for n in names]).cpu().numpy()  # [L, H, T]
            real = np.arange(len(offsets)) > 0  # the first token (the attention sink) counts for neither
            ev.append(pat[..., _mask(offsets, evidence) & real].sum(-1))  # [L, H]
            di.append(pat[..., _mask(offsets, distractor) & real].sum(-1))
            sink.append(pat[..., 0])
            story = split_story(ex)[0]
            back.append(sentences_after(story, evidence[1]))
            index.append(sentences_after(story[: evidence[0]], 0))  # sentences before the evidence
            scored += 1
        if progress:
            progress(1)
    if not scored:
        return {"n_scored": 0, "n_skipped": skipped}
    E, D = np.stack(ev), np.stack(di)  # [n, L, H]
    groups = np.arange(scored)
    return {"n_scored": scored, "n_skipped": skipped,
            "evidence_mass": E.mean((0, 2)).round(4).tolist(), "distractor_mass": D.mean((0, 2)).round(4).tolist(),
            "evidence_interval": [[round(x, 4) for x in group_interval(E[:, i].mean(1), groups)]
                                  for i in range(s.n_layers)],
            "distractor_interval": [[round(x, 4) for x in group_interval(D[:, i].mean(1), groups)]
                                    for i in range(s.n_layers)],
            "by_sentences_after": by_group(E, D, back), "by_sentences_before": by_group(E, D, index),
            "sink_mass": np.stack(sink).mean((0, 2)).round(4).tolist(),
            "heads_favouring_evidence": (E.mean(0) > D.mean(0)).mean(1).round(4).tolist(),
            "evidence_by_head": E.mean(0).round(4).tolist(), "distractor_by_head": D.mean(0).round(4).tolist()}
