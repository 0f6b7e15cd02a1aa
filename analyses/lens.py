"""When does the answer form? The forced answer read through the logit lens (or a tuned lens) at every layer
and every kind of position, over many stories.

Two readings per story, both against the truth:

- **in place**: one forward over the whole prompt (story and question); at every token the lens's class
  words are compared with the state true at that token. Tokens are grouped into position classes: the
  event boundaries, the other story tokens, the question's tokens, and the answer position (the last token,
  where the model answers).
- **forced**: at every event boundary the question is appended (`analyses.forced`), and the lens is read at
  the answer position: what each layer would answer if asked there.

A model that keeps a running state shows the answer at the event boundaries themselves; a lazy one (our
toy target, trained on the final answer only) shows it only where it is asked, at the answer position of
the question, and only in its last layers. Accuracy is the argmax over the class words against the true
class, next to the majority class of the same tokens (the baseline to beat), with 95% bootstrap intervals over
stories (``intervals``: per lens, position class and layer).

Usage (not run as a doctest: it needs a model and many forwards)::

    res = main(LensConfig(model="target", n=40, out="runs/lens"))
    res["in_place"]["logit"]["answer"]  # lens accuracy at the answer position, per layer
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import singledispatch

import numpy as np
import torch

from ..models.load import load_model
from ..models.profile import compute_device, model_profile
from ..models.thinking.model import ThinkingStates
from ..probes.intervals import group_interval
from ..probes.lens import (
    LensDecoder,
    check_last_layer,
    check_layers,
    class_token_ids,
    read_residuals,
    residuals,
)
from ..probes.tuned_lens import TunedLens
from ..tasks import get_task, parse_events_range
from ..tasks.records import DataSource
from .common import check_writable_parent, save_fig, token_strings, write_json
from .forced import data_examples_for_forced, split_story
from .lens_attention import evidence_attention
from .lens_plots import attention_figure, example_figure, forming_figure

CLASSES = ("boundary", "story", "question", "answer")  # position classes of the in-place reading


@dataclass
class LensConfig(DataSource):
    """`beliefscope lens`: the forced answer through the logit lens (and a tuned lens) at every layer and position
    class of many stories: sampled coin-flip stories, or your records (`--data`, with `--question`)."""

    model: str = "target"  # checkpoint folder or alias (target, smollm2, thinking, ...)
    tuned: str = ""  # a tuned lens folder from `beliefscope lens-train --out` (same model), read beside the logit lens
    out: str = ""  # folder for lens.json and the figures ("": no files)
    n: int | None = None  # stories read (default: 40 sampled ones; with --data, every record)
    seed: int = 4242  # story seed
    events: str = "1-8"  # events per sampled story, LO-HI
    rendering: str | None = None  # toy / natural (default: the model's own)
    label: str = ""  # with --data: the label whose states are read (default: the data's first label)
    question: str = ""  # with --data: the question appended at every event end, e.g. " Where is it? It is in Box"
    answers: tuple = ()  # with --data: one single-token answer word per class, in class order (default: class names)
    forced: bool = True  # read the forced answer (question appended) at every event boundary too
    attention: bool = False  # also the answer position's attention mass on the true evidence vs the last-named
    #   distractor, per layer and head (analyses.lens_attention)


def prepare(cfg: LensConfig) -> tuple[list, TunedLens | None]:
    """The stories and the tuned lens, every value checked before any model loads."""
    if cfg.out:
        check_writable_parent(os.path.join(cfg.out, "lens.json"))
    tuned = TunedLens.load(cfg.tuned) if cfg.tuned else None
    if cfg.data:
        return data_examples_for_forced(cfg), tuned
    lo, hi = parse_events_range(cfg.events)
    n = 40 if cfg.n is None else cfg.n
    if n < 1:
        raise ValueError(f"--n {n}: read at least 1 story")
    rendering = cfg.rendering or model_profile(cfg.model).rendering
    return get_task("coinflip", rendering=rendering, fmt="direct", split="all").examples(n, cfg.seed, (lo, hi)), tuned


def position_classes(lab, n_tokens: int, story_end: int) -> np.ndarray:
    """``[T]`` index into `CLASSES` of every token (-1: before the first event, not scored)."""
    cls = np.full(n_tokens, 1)
    first = np.nonzero(lab.is_event_boundary)[0]
    cls[: (first[0] if len(first) else n_tokens)] = -1
    cls[story_end:] = 2
    cls[lab.is_event_boundary[:n_tokens]] = 0
    cls[n_tokens - 1] = 3
    return cls


def forced_rows(model, tok, ex, q_ids: list[int], story_ids: list[int], positions) -> tuple[torch.Tensor, ...]:
    """Residuals ``[L, n, d]`` and the model's logits ``[n, V]`` at the answer position of the question appended
    after each boundary in `positions` (one right-padded forward: a causal model's real tokens never see the pad)."""
    rows = [story_ids[: int(i) + 1] + q_ids for i in positions]
    layers = list(range(model.cfg.n_layers))
    dev = compute_device(LensDecoder(model).unembed)
    return _last_rows(model, rows, layers, dev)


@singledispatch
def _last_rows(model, rows: list[list[int]], layers: list[int], dev) -> tuple[torch.Tensor, torch.Tensor]:
    """Residuals ``[L, n, d]`` and logits ``[n, V]`` at the last token of each row: one right-padded forward."""
    width = max(map(len, rows))
    ids = torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], device=dev)  # [n, width]
    resid, logits = residuals(model, ids, layers)  # [L, n, width, d], [n, width, V]
    last = torch.tensor([len(r) - 1 for r in rows], device=resid.device)
    at = torch.arange(len(rows), device=resid.device)
    return resid[:, at, last], logits[at, last.to(logits.device)]


@_last_rows.register(ThinkingStates)
def _last_rows_one_by_one(model, rows: list[list[int]], layers: list[int], dev) -> tuple[torch.Tensor, torch.Tensor]:
    """A Thinking States model's thoughts depend on the chunks: one unpadded forward per row."""
    got = [residuals(model, torch.tensor([r], device=dev), layers) for r in rows]
    return torch.cat([g[0][:, :, -1] for g in got], 1), torch.cat([g[1][:, -1] for g in got])


def read_story(model, tok, ex, lenses: dict, forced: bool) -> dict:
    """One story's in-place hits ``{lens: [L, T] bool}`` (and class shares ``[L, T, K]`` in ``reading``), its
    position classes and truth, and forced hits: one forward in place for every lens, one for the forced rows."""
    lab = ex.labels(tok, text=ex.prompt)
    ids = [int(i) for i in lab.input_ids]
    story, question = split_story(ex)
    story_end = len(ex.labels(tok, text=story).input_ids)
    out = {"cls": position_classes(lab, len(ids), story_end), "truth": lab.state[: len(ids)], "ids": ids,
           "in_place": {}, "forced": {}, "forced_truth": None, "reading": {}}
    layers, decoder = list(range(model.cfg.n_layers)), LensDecoder(model)
    class_ids = class_token_ids(tok, ex.state_names)
    dev = compute_device(decoder.unembed)
    resid, logits = residuals(model, torch.tensor([ids], device=dev), layers)  # one forward for every lens
    check_last_layer(decoder, resid[-1, 0], logits[0])
    for name, lens in lenses.items():
        share = read_residuals(decoder, resid[:, 0], logits[0], layers, class_ids, lens)["class_share"]  # [L, T, K]
        out["in_place"][name] = share.argmax(-1) == out["truth"][None]  # [L, T]
        out["reading"][name] = share
    if forced and question:
        positions = np.nonzero(lab.is_event_boundary[:story_end])[0]
        q_ids = tok(question, add_special_tokens=False)["input_ids"]
        resid, logits = forced_rows(model, tok, ex, q_ids, ids[:story_end], positions)
        out["forced_truth"] = lab.state[positions]
        for name, lens in lenses.items():
            s = read_residuals(decoder, resid, logits.float(), layers, class_ids, lens)["class_share"]  # [L, n, K]
            out["forced"][name] = s.argmax(-1) == out["forced_truth"][None]
    return out


def _rate(hits: list, masks: list) -> list:
    """Per layer: the share of hits over the masked tokens of every story (None where no token)."""
    num = sum(h[:, m].sum(1) for h, m in zip(hits, masks))
    den = sum(int(m.sum()) for m in masks)
    return [round(float(x) / den, 4) for x in num] if den else None


def _intervals(hits: list, masks: list) -> list | None:
    """Per layer: the 95% bootstrap interval of the accuracy, resampling stories (`probes.intervals`)."""
    groups = np.concatenate([np.full(int(m.sum()), i) for i, m in enumerate(masks)])
    if not len(groups):
        return None
    flat = np.concatenate([h[:, m] for h, m in zip(hits, masks)], 1)  # [L, n] hits of every story's tokens
    return [[round(x, 4) for x in group_interval(row.astype(float), groups)] for row in flat]


def _majority(truths: list, masks: list) -> float | None:
    vals = np.concatenate([t[m] for t, m in zip(truths, masks)])
    return round(float(np.bincount(vals).max() / len(vals)), 4) if len(vals) else None


def forms_at(rates: list | None, majority: float | None, lower: float | None = None,
             margin: float = 0.05) -> int | None:
    """The first layer from which the lens accuracy stays within `margin` of the last layer's, where the last
    layer beats the majority class by more than `margin` and, given its interval's `lower` end, beyond its
    interval (None: the answer never forms there)."""
    final = rates[-1] if rates else None
    if final is None or majority is None or final <= majority + margin or (lower is not None and lower <= majority):
        return None
    ok = [r >= final - margin for r in rates]
    return next((i for i in range(len(ok)) if all(ok[i:])), None)


def main(cfg: LensConfig, *, model=None, tok=None, progress=None) -> dict:
    """Read every story through each lens; write lens.json and the figures to ``cfg.out``; return the result."""
    examples, tuned = prepare(cfg)
    if model is None:
        model, tok = load_model(cfg.model)
    check_layers(model, "all")
    class_token_ids(tok, examples[0].state_names)  # one token per class word, before any forward
    if tuned is not None:
        tuned.check_model(model, cfg.model)
    lenses = {"logit": None, **({"tuned": tuned} if tuned is not None else {})}
    stories = []
    for ex in examples:
        stories.append(read_story(model, tok, ex, lenses, cfg.forced))
        if progress:
            progress(1)
    res = summarise(stories, lenses, model.cfg.n_layers)
    if cfg.attention:
        res["attention"] = evidence_attention(model, tok, examples)
    res.update(model=cfg.model, tuned=cfg.tuned, n_stories=len(examples), state_names=list(examples[0].state_names),
               source=cfg.data or f"coinflip {cfg.events} events, seed {cfg.seed}", files=[])
    if cfg.out:
        res["files"] = write(res, stories[int(np.argmax([e.n_events for e in examples]))], examples, tok, cfg.out)
    return res


def summarise(stories: list, lenses: dict, n_layers: int) -> dict:
    """Accuracy per lens, layer and position class; the forced answer per layer; where the answer forms."""
    res = {"layers": list(range(n_layers)), "position_classes": list(CLASSES), "in_place": {}, "forced": {},
           "majority": {}, "forms_at": {}, "intervals": {}}
    for c, name in enumerate(CLASSES):
        masks = [(s["cls"] == c) & (s["truth"] >= 0) for s in stories]
        res["majority"][name] = _majority([s["truth"] for s in stories], masks)
        for lens in lenses:
            hits = [s["in_place"][lens] for s in stories]
            res["in_place"].setdefault(lens, {})[name] = _rate(hits, masks)
            res["intervals"].setdefault(lens, {})[name] = _intervals(hits, masks)
    with_forced = [s for s in stories if s["forced_truth"] is not None and len(s["forced_truth"])]
    if with_forced:
        masks = [np.ones(len(s["forced_truth"]), bool) for s in with_forced]
        res["majority"]["forced"] = _majority([s["forced_truth"] for s in with_forced], masks)
        for lens in lenses:
            res["forced"][lens] = _rate([s["forced"][lens] for s in with_forced], masks)
            res["intervals"][lens]["forced"] = _intervals([s["forced"][lens] for s in with_forced], masks)
    for lens in lenses:
        rates = {**res["in_place"][lens], **({"forced": res["forced"][lens]} if lens in res["forced"] else {})}
        ci = res["intervals"][lens]
        res["forms_at"][lens] = {k: forms_at(v, res["majority"].get(k), ci[k][-1][0] if ci.get(k) else None)
                                 for k, v in rates.items()}
    return res


def write(res: dict, story: dict, examples, tok, out: str) -> list[str]:
    os.makedirs(out, exist_ok=True)
    files = [os.path.join(out, "lens.json"), os.path.join(out, "lens-forming.png"), os.path.join(out, "lens-story.png")]
    save_fig(forming_figure(res), files[1])
    ex = examples[int(np.argmax([e.n_events for e in examples]))]
    truth = story["truth"]
    share = np.take_along_axis(story["reading"]["logit"], np.maximum(truth, 0)[None, :, None], 2)[..., 0]  # [L, T]
    p_true = np.where(truth[None] >= 0, share, np.nan)  # [L, T] P(true state); NaN where unlabelled
    save_fig(example_figure(p_true, token_strings(tok, story["ids"]), story["cls"], ex.state_names), files[2])
    if res.get("attention", {}).get("n_scored"):
        files.append(os.path.join(out, "lens-attention.png"))
        save_fig(attention_figure(res["attention"]), files[-1])
    write_json(files[0], {**res, "files": files})
    return files
