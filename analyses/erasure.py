"""Concept erasure at a layer: does the answer fall when the label can no longer be read linearly there?

LEACE (Belrose et al. 2023, through EleutherAI's ``concept-erasure`` package) is fitted on one half of the
stories: the activations at one hook at every token that has a state, against that state. It removes the
smallest (least-squares) change that leaves no linear classifier better than a constant. The other half of
the stories is then run with every token's activation at that hook erased, and three numbers answer the
question, each with a 95% bootstrap interval over stories:

- the fall in the model's answer accuracy (clean minus erased);
- the same fall after erasing a random subspace of equal rank around the same mean (the control: any edit of
  that size may hurt);
- a probe refitted on erased activations (the fit half) and scored on erased held-out activations, beside the
  majority class: LEACE's guarantee is that it reads no better than that.

>>> ErasureConfig(layer=2).positions
'all'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..hooks import hook_name, stream
from ..models.tokenizer import answer_token_ids
from ..probes.intervals import margin_interval, scored
from .das import split_pairs
from .interchange import last_logits
from .subspaces import random_basis


@dataclass(frozen=True)
class ErasureConfig:
    """Where and how a concept is erased."""

    layer: int  # block whose output is erased
    kind: str = "resid_post"  # hook kind at that block
    positions: str = "all"  # fitted on and erased at: "all" (every token with a state), "state" (tokens that have
    #   read an event) or "last" (the answer's token alone, against the final state)
    heldout_share: float = 0.5  # share of stories held out for scoring (the rest fit the eraser and the probe)
    seed: int = 0  # split and random subspace
    batch_size: int = 16  # stories per forward


def _labelled(tok, examples, positions: str):
    """Per example: ids ``[T]``, the state fitted on ``[T]`` (-1 where none) and where to erase ``[T]`` bool."""
    out = []
    for ex in examples:
        lab = ex.labels(tok, text=ex.prompt)
        state = np.where((lab.events_so_far > 0) | (ex.initial >= 0), lab.state, -1)
        where = np.ones(len(state), bool) if positions == "all" else lab.events_so_far > 0
        if positions == "last":
            where = np.arange(len(state)) == len(state) - 1
        out.append((lab.input_ids, np.where(where, state, -1), where))
    return out


def _acts(model, hook: str, seqs: list, batch_size: int) -> list[torch.Tensor]:
    """Each sequence's activation at ``hook``, ``[T, d]`` float32 on the host."""
    out = []
    for lo in range(0, len(seqs), batch_size):
        chunk = seqs[lo: lo + batch_size]
        T = max(len(s) for s in chunk)
        ids = torch.zeros(len(chunk), T, dtype=torch.long)
        for r, s in enumerate(chunk):
            ids[r, : len(s)] = torch.as_tensor(s)
        got = {}
        with torch.no_grad(), stream(model, [hook], lambda n, a: got.__setitem__("a", a.float().cpu())):
            model(ids.to(next(model.parameters()).device), return_type="logits")
        out += [got["a"][r, : len(s)] for r, s in enumerate(chunk)]
    return out


def _edit_hook(hook: str, fn, masks: list):
    """A forward hook applying ``fn`` to the rows' activations where ``masks[r]`` (``[T_r]`` bool) holds."""
    def apply(act, *, hook):
        new = act.clone()
        for r, m in enumerate(masks):
            idx = torch.as_tensor(np.nonzero(m)[0]).to(act.device)
            new[r, idx] = fn(act[r, idx].float()).to(act.dtype)
        return new
    return [(hook, apply)]


def erasure(model, tok, examples: list, cfg: ErasureConfig, progress=None) -> dict:
    """LEACE at ``cfg.layer`` against a random subspace of equal rank, and a probe refitted after it (see the
    module). ``examples``: task examples or records as examples (``Data.example``), one label each."""
    from concept_erasure import LeaceFitter  # deferred: loaded with scikit-learn, when an erasure runs
    from sklearn.linear_model import LogisticRegression  # deferred: scikit-learn (1 s) loads for a fit only

    n_layers = int(model.cfg.n_layers)
    if not 0 <= cfg.layer < n_layers:
        raise ValueError(f"layer {cfg.layer} is out of range: this model has blocks 0..{n_layers - 1}")
    if cfg.positions not in ("all", "state", "last"):
        raise ValueError(f"positions={cfg.positions!r} is unknown: use 'all' (every token), 'state' or 'last'")
    names = list(examples[0].state_names)
    classes = sorted({int(e.final_state) for e in examples} | {int(ev.state_after) for e in examples
                                                               for ev in e.events})
    if len([c for c in classes if c >= 0]) < 2:
        raise ValueError(f"the label has one class ({[names[c] for c in classes if c >= 0]}): there is no concept "
                         "to erase; give records of at least two classes")
    hook = hook_name(cfg.kind, cfg.layer)
    answer_ids = answer_token_ids(tok, names)
    pseudo = [type("P", (), {"unit": str(i)})() for i in range(len(examples))]
    fit_idx, test_idx = (sorted(int(p.unit) for p in side) for side in split_pairs(pseudo, cfg.heldout_share,
                                                                                    cfg.seed))
    lab = _labelled(tok, examples, cfg.positions)
    fit_acts = _acts(model, hook, [lab[i][0] for i in fit_idx], cfg.batch_size)
    X = torch.cat([a[torch.as_tensor(lab[i][1] >= 0)] for a, i in zip(fit_acts, fit_idx)])  # [n, d]
    z = np.concatenate([lab[i][1][lab[i][1] >= 0] for i in fit_idx])  # [n]
    if len(np.unique(z)) < 2:
        raise ValueError("the stories fitting the eraser hold one class only: give more stories, or records of "
                         "both classes in each half")
    k = len(names)
    onehot = torch.nn.functional.one_hot(torch.as_tensor(z), k).double()  # [n, k]
    eraser = LeaceFitter.fit(X.double(), onehot if k > 2 else onehot[:, 1:]).eraser
    rank = int(torch.linalg.matrix_rank(eraser.proj_left).item())
    mu = X.double().mean(0)
    Qr = random_basis(X.shape[1], rank, cfg.seed).double()

    def leace(x):
        return eraser(x.double().to(eraser.proj_left.device)).to(x.device)

    def rand(x):
        xd = x.double()
        return xd - ((xd - mu.to(x.device)) @ Qr.to(x.device)) @ Qr.T.to(x.device)

    test = [lab[i] for i in test_idx]
    truth = np.asarray([examples[i].final_state for i in test_idx])
    masks = [t[2] for t in test]
    answers = {}
    for name, fn in (("clean", None), ("leace", leace), ("random", rand)):
        got = []
        for lo in range(0, len(test), cfg.batch_size):
            seqs, ms = [t[0] for t in test[lo: lo + cfg.batch_size]], masks[lo: lo + cfg.batch_size]
            got.append(last_logits(model, seqs, answer_ids, _edit_hook(hook, fn, ms) if fn else None).argmax(1))
            if progress:
                progress(len(seqs))
        answers[name] = torch.cat(got).numpy()
    groups = np.asarray(test_idx)
    right = {n: answers[n] == truth for n in answers}
    out = {"hook": hook, "layer": cfg.layer, "positions": cfg.positions, "rank": rank,
           "n_fit_stories": len(fit_idx), "n_fit_rows": len(z),
           "scored_on": f"{len(test_idx)} held-out stories (the answer at the last token)",
           **{f"accuracy_{n}": scored(right[n], groups, cfg.seed).to_json() for n in right}}
    for n in ("leace", "random"):
        d, lo_, hi_ = margin_interval(right["clean"], right[n], groups, seed=cfg.seed)
        out[f"drop_{n}"] = {"drop": round(d, 4), "interval": [round(lo_, 4), round(hi_, 4)]}
    # a probe refitted on erased activations: fit half against held-out half, both erased
    Xt = torch.cat([a[torch.as_tensor(t[1] >= 0)] for a, t in zip(_acts(model, hook, [t[0] for t in test],
                                                                         cfg.batch_size), test)])
    zt = np.concatenate([t[1][t[1] >= 0] for t in test])
    gt = np.concatenate([np.full(int((t[1] >= 0).sum()), i) for i, t in zip(test_idx, test)])
    Xe, Xte = eraser(X.double()).float(), eraser(Xt.double()).float()
    m, s = Xe.mean(0), Xe.std(0) + 1e-6
    clf = LogisticRegression(max_iter=2000).fit(((Xe - m) / s).numpy(), z)
    pred = clf.predict(((Xte - m) / s).numpy())
    plain = LogisticRegression(max_iter=2000).fit(((X - X.mean(0)) / (X.std(0) + 1e-6)).numpy(), z)
    pred_plain = plain.predict(((Xt - X.mean(0)) / (X.std(0) + 1e-6)).numpy())
    majority = int(np.bincount(z).argmax())
    out["probe_after_erasure"] = {**scored(pred == zt, gt, cfg.seed).to_json(),
                                  "scored_on": "held-out stories' tokens that have a state, erased"}
    out["probe_before_erasure"] = scored(pred_plain == zt, gt, cfg.seed).to_json()
    out["majority_baseline"] = {**scored(zt == majority, gt, cfg.seed).to_json(), "class": names[majority]}
    return out
