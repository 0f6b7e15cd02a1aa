"""When does the answer become readable through the lens? The model's own forced answer, compared with what the
logit lens (or a tuned lens) reads at every layer x position of the story, for the instrument, the belief
trajectories and the viewer's hover.

Definitions (every one against the model, not the truth: the lens asks whether the model's answer is already
there, right or wrong):

- the **model's answer at a position** ``a(p)``: at an event boundary, the class the model answers when the
  question is appended right after it (`analyses.forced`, its forced answer); at the answer position (the
  prompt's last token, after the question) its own answer;
- the **lens answer at (l, p)**: the lens's top class among the class words at block ``l``, position ``p``, in
  one forward over the prompt (story and question) as the model reads it (no question appended);
- the answer is **read at (l, p)** when the two agree, and **readable from layer L at p** when it is read at
  (l, p) for every block ``l >= L`` (``readable_from[p]``; None when even the last block disagrees: at an
  event boundary the last block predicts the next story word, which need not be the answer);
- over many stories, for a kind of position (the event boundaries; the answer positions), the answer is
  **readable at layer l** when the 95% bootstrap interval over stories of the agreement lies wholly above the
  majority share of the model's answers there (what always naming its most common answer would agree), and
  **readable from L** when it is readable at every layer from L on. The instrument's sentence, "the answer
  becomes readable through the lens from layer L at P", names the first kind in story order (event
  boundaries, then the answer position) readable from some layer, and its L.

At the answer position the last block *is* the model, so the answer is always readable there from the last
block at least: a lazy model (the toy target) is readable only there, and only from its last blocks; a model
that keeps its state where the events are (a Thinking States model) is readable at the event boundaries.

>>> import beliefscope as bs
>>> model, tok = bs.load_model("target")
>>> ex = bs.get_task("coinflip").example(seed=3, n_events=3)
>>> r = lens_answers(model, tok, ex)
>>> r["readable_from"][-1] is not None and bool(r["answer"][-1] == r["logit"][-1][-1])  # the last block: the model
True
"""

from __future__ import annotations

import numpy as np
import torch

from ..models.profile import compute_device
from ..probes.intervals import group_interval
from ..probes.lens import LensDecoder, check_last_layer, class_token_ids, read_residuals, residuals
from ..probes.tuned_lens import TunedLens
from .common import model_folders
from .forced import forced_answers

KINDS = ("boundary", "answer")  # the kinds of position read, in story order


def one_token_classes(tok, names) -> bool:
    """Whether every class word is one token (the lens reads one token per class; else it is left out)."""
    try:
        class_token_ids(tok, names)
    except ValueError:
        return False
    return True


def readable_from(lens_top: np.ndarray, answer: np.ndarray) -> list[int | None]:
    """Per position: the first block from which the lens's top class ``lens_top [L, T]`` equals the model's
    answer ``answer [T]`` at every later block (None where none does, or where the answer is unknown, -1).

    >>> readable_from(np.array([[0, 1, 1], [1, 1, 0], [1, 1, 1]]), np.array([1, 1, -1]))
    [1, 0, None]
    """
    hit = lens_top == answer[None]  # [L, T]
    out = []
    for p in range(hit.shape[1]):
        if answer[p] < 0 or not hit[-1, p]:
            out.append(None)
            continue
        misses = np.nonzero(~hit[:, p])[0]
        out.append(int(misses[-1]) + 1 if len(misses) else 0)
    return out


@torch.no_grad()
def lens_answers(model, tok, ex, lenses: dict | None = None, forced=None) -> dict:
    """One story through each lens (``{name: TunedLens or None}``, default the logit lens alone): per lens the
    top class ``[L][T]``; the model's answer ``answer [T]`` (-1 off the boundaries and the answer position);
    ``boundaries``, ``readable_from`` (of the first lens) and the tokens' ``kind`` (index into `KINDS`, -1).
    ``forced``: the story's `ForcedAnswers` where already computed."""
    lenses = {"logit": None} if lenses is None else lenses
    lab = ex.labels(tok, text=ex.prompt)
    ids = [int(i) for i in lab.input_ids]
    class_ids = class_token_ids(tok, ex.state_names)
    decoder = LensDecoder(model)
    layers = list(range(model.cfg.n_layers))
    resid, logits = residuals(model, torch.tensor([ids], device=compute_device(decoder.unembed)), layers)
    check_last_layer(decoder, resid[-1, 0], logits[0])
    fa = forced if forced is not None else forced_answers(model, tok, ex)
    answer, kind = np.full(len(ids), -1), np.full(len(ids), -1)
    answer[fa.positions] = fa.p_state.argmax(-1)
    kind[fa.positions] = 0
    out = {"boundaries": [int(p) for p in fa.positions]}
    for name, lens in lenses.items():
        share = read_residuals(decoder, resid[:, 0], logits[0], layers, class_ids, lens)["class_share"]
        out[name] = share.argmax(-1)  # [L, T]
        out.setdefault("share", {})[name] = share  # [L, T, K] the lens's distribution over the class words
    first = out[next(iter(lenses))]
    answer[-1], kind[-1] = first[-1, -1], 1  # the model's own answer (the lens at the last block is the model)
    out.update(answer=answer, kind=kind, readable_from=readable_from(first, answer))
    return out


def summarise(stories: list[dict], lens: str, n_layers: int) -> dict:
    """Over many stories' `lens_answers`: per kind of position the agreement per layer with its intervals, the
    majority share, ``readable_from`` (the rule in the module's docstring) and the sentence."""
    res = {"lens": lens, "kinds": {}}
    for k, kind in enumerate(KINDS):
        rows, groups, answers = [], [], []
        for i, s in enumerate(stories):
            at = np.nonzero(s["kind"] == k)[0]
            rows.append(np.asarray(s[lens])[:, at] == s["answer"][at][None])  # [L, n]
            groups += [i] * len(at)
            answers += s["answer"][at].tolist()
        if not answers:
            continue
        hits = np.concatenate(rows, 1).astype(float)  # [L, N]
        majority = float(np.bincount(answers).max() / len(answers))
        ci = [group_interval(h, np.asarray(groups)) for h in hits]
        above = [lo > majority for lo, _ in ci]
        start = next((layer for layer in range(n_layers) if all(above[layer:])), None)
        res["kinds"][kind] = {"n": len(answers), "agreement": hits.mean(1).round(4).tolist(),
                              "interval": [[round(x, 4) for x in c] for c in ci], "majority": round(majority, 4),
                              "readable_from": start}
    res["sentence"] = sentence(res)
    return res


def sentence(res: dict) -> str:
    """'the answer becomes readable through the LENS lens from layer L at P', P the first kind in story order."""
    where = {"boundary": "the event boundaries", "answer": "the answer position, after the question"}
    for kind in KINDS:
        r = res["kinds"].get(kind)
        if r and r["readable_from"] is not None:
            L = r["readable_from"]
            return (f"the answer becomes readable through the {res['lens']} lens from layer {L} at {where[kind]} "
                    f"(agreeing with the model's own answer at {r['agreement'][L]:.2f} of {r['n']}, majority "
                    f"{r['majority']:.2f})")
    return f"the answer is never readable through the {res['lens']} lens (above the majority of the model's answers)"


def tuned_lenses(models, folders) -> dict:
    """``{model: TunedLens}`` of ``--tuned``, loaded before any model is: ``MODEL=FOLDER`` entries (any subset
    of the models), or one folder per model in order ("-" for none)."""
    return {m: TunedLens.load(f) for m, f in model_folders(models, folders, "--tuned").items()}


def instrument_lens(model, tok, examples, tuned=None, progress=None) -> dict:
    """The instrument's lens reading of held-out stories: `summarise` per lens (the logit lens, and `tuned`, a
    `TunedLens` of this model, where given), with the sentence of the first."""
    lenses = {"logit": None, **({"tuned": tuned} if tuned is not None else {})}
    stories = []
    for ex in examples:
        stories.append(lens_answers(model, tok, ex, lenses))
        if progress:
            progress(1)
    out = {name: summarise(stories, name, model.cfg.n_layers) for name in lenses}
    return {**out, "n_stories": len(examples), "sentence": "; ".join(r["sentence"] for r in out.values())}


def lens_hover(r: dict, lens: str = "logit") -> list[list[int]]:
    """``[T][L]``: every layer's lens answer (class index) at every token, for the viewer's hover."""
    return np.asarray(r[lens]).T.tolist()
