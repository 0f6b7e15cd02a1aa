"""`beliefscope interchange`: per site, is the label readable, and is it used?

On held-out pairs (split by base story), per site (layer x position rule):

- **readable**: a logistic probe fitted on the training pairs' source activations at the site, scored on the
  held-out ones, beside the strongest of two baselines fitted on the same pairs: the majority class, and a
  bag-of-words regression on the text up to the site (`probes.baselines.text_so_far_baseline`);
- **used**: interchange IIA with the whole activation, with the probe's subspace, with the class means'
  subspace (the mass-mean direction of Marks & Tegmark 2023), with a random subspace of the same rank, and
  (at ``--das-layers``) with a DAS subspace of rank ``--das-rank`` trained on the training pairs;
- at ``--erase-layers``: LEACE at the answer's token (`analyses.erasure`), the fall in accuracy beside a random
  erasure of equal rank.

Each site gets a verdict sentence with its numbers: "readable and used", "readable but not used" or "not
readable". Writes ``interchange.json`` and ``interchange.png`` (the IIA heatmap and the curves per layer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import singledispatch

import numpy as np
import torch

from ..models.load import load_model
from ..models.thinking.model import ThinkingStates
from ..probes.baselines import text_so_far_baseline
from ..probes.intervals import scored
from ..probes.twin import checkpoint_hash
from ..tasks import get_task
from ..tasks.records import DataSource
from .common import write_json
from .das import DasConfig, learn_das, split_pairs
from .erasure import ErasureConfig, erasure
from .interchange import interchange, prepare, sites, source_activations
from .interchange_thinking import thinking_interchange
from .pairs import record_pairs, states_after, task_pairs
from .plots_causal import interchange_figure
from .subspaces import orthonormal


@dataclass
class InterchangeConfig(DataSource):
    """`beliefscope interchange`: pairs, sites and the tests run at each."""

    model: str = "target"  # checkpoint folder or alias (target, smollm2, ...)
    task: str = "coinflip"  # built-in task of the minimal pairs when no --data is given (one event turned over)
    rendering: str = "toy"  # toy or natural (the task's rendering)
    events: str = "3-8"  # event counts of the task's stories
    n: int = 100  # pairs (the task's, or the first N of the records' pairs; 0: every pair of the records)
    label: str = ""  # the records' label whose state the pairs differ in ("": the first)
    question: str = ""  # appended to each record (a template over its fields); "": its own question field
    answers: str = ""  # comma-separated answer words, one per class ("": the class names)
    pair_by: str = "events"  # records: "group" (records sharing the group field) or "events" (drawn, seeded)
    layers: str = "all"  # blocks to intervene at: "all" or comma-separated indices
    positions: str = "last_event,last"  # position rules: last, last_event, event:K, end:J, pos:N
    das_layers: str = ""  # blocks where DAS is trained ("": none; "all": every one of --layers)
    das_rank: int = 1  # rank of the DAS, probe-control and random subspaces
    das_steps: int = 100  # DAS optimiser steps per site
    erase_layers: str = ""  # blocks where LEACE erases the label at the answer's token ("": none)
    heldout_share: float = 0.5  # share of base stories whose pairs are scored (the rest train probes and DAS)
    batch_size: int = 16  # rows per forward
    seed: int = 0  # pair draw, split, random subspaces and DAS
    out: str = ""  # folder for interchange.json and interchange.png ("": write nothing)


def _layers(spec: str, n: int, flag: str) -> list[int]:
    if not spec:
        return []
    if spec == "all":
        return list(range(n))
    try:
        out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {spec!r} is not 'all' or comma-separated block indices, e.g. 0,5,10") from None
    if bad := [x for x in out if not 0 <= x < n]:
        raise ValueError(f"{flag} {bad} out of range: this model has blocks 0..{n - 1}")
    return out


def build_pairs(cfg: InterchangeConfig) -> list:
    """The pairs of ``cfg``: the records' (``--data``) or the task's minimal pairs."""
    if cfg.data:
        answers = [a.strip() for a in cfg.answers.split(",") if a.strip()] or None
        return record_pairs(cfg.load(), cfg.label, cfg.question, answers, by=cfg.pair_by, seed=cfg.seed,
                            max_pairs=cfg.n)

    return task_pairs(get_task(cfg.task, rendering=cfg.rendering), cfg.n, cfg.seed, cfg.events)


def _readable(model, tok, train, test, site_list, batch_size, seed):
    """Per site: a probe on the training pairs' source activations, scored on the held-out ones, and its
    subspace (``[d, C-1]``)."""
    from sklearn.linear_model import LogisticRegression  # deferred: scikit-learn (1 s) loads for a fit only

    def acts_labels(pairs):
        prep = prepare(tok, pairs, site_list)
        X = source_activations(model, prep, site_list, batch_size)  # [P, S, d]
        y = np.zeros(prep.pos_source.shape, dtype=np.int64)  # [P, S] the source's state at each site
        for i, p in enumerate(pairs):
            lab = p.source.labels(tok, text=p.source.prompt)
            y[i] = np.asarray(states_after(p.source))[lab.events_so_far[prep.pos_source[i]]]
        return X, y, prep

    Xtr, ytr, ptr = acts_labels(train)
    Xte, yte, pte = acts_labels(test)
    gte = pte.groups
    out, bases, means = [], {}, {}
    for j, site in enumerate(site_list):
        x, y = Xtr[:, j].double(), ytr[:, j]
        m, s = x.mean(0), x.std(0) + 1e-6
        if len(np.unique(y)) < 2:
            out.append({"probe": None, "majority": None, "note": "one class at this site in the training pairs"})
            bases[site] = means[site] = None
            continue
        mu = torch.stack([x[torch.as_tensor(y == c)].mean(0) for c in np.unique(y)])  # [C, d] class means
        U, _, _ = torch.linalg.svd((mu - mu.mean(0)).T, full_matrices=False)
        means[site] = U[:, : len(mu) - 1].float()  # the mass-mean subspace (Marks & Tegmark 2023)
        clf = LogisticRegression(max_iter=2000).fit(((x - m) / s).numpy(), y)
        pred = clf.predict(((Xte[:, j].double() - m) / s).numpy())
        maj = int(np.bincount(y[y >= 0]).argmax())
        W = torch.as_tensor(clf.coef_.T) / s[:, None]  # [d, C or 1] in activation space
        W = W - W.mean(1, keepdim=True) if W.shape[1] > 2 else W
        bases[site] = orthonormal(W[:, : max(1, W.shape[1] - (1 if W.shape[1] > 2 else 0))])
        words = _bag_of_words(ptr, pte, j, ytr[:, j])
        out.append({"probe": scored(pred == yte[:, j], gte, seed).to_json(),
                    "majority": scored(yte[:, j] == maj, gte, seed).to_json(),
                    "bag_of_words": scored(words == yte[:, j], gte, seed).to_json()})
    return out, bases, means


def _bag_of_words(ptr, pte, j: int, ytr) -> np.ndarray:
    """Held-out predictions ``[P_test]`` of a bag-of-words logistic regression on the source's tokens up to the
    site (`probes.baselines.text_so_far_baseline`), fitted on the training pairs: the text's own answer."""
    from scipy.sparse import csr_matrix  # deferred: loaded with scikit-learn, when a fit asks for it


    seqs = [ids[: int(p) + 1] for ids, p in zip(ptr.source_ids + pte.source_ids,
                                                  np.concatenate([ptr.pos_source[:, j], pte.pos_source[:, j]]))]
    vocab = int(max(int(s.max()) for s in seqs)) + 1
    rows = np.concatenate([np.full(len(s), r) for r, s in enumerate(seqs)])
    counts = csr_matrix((np.ones(len(rows)), (rows, np.concatenate(seqs))), shape=(len(seqs), vocab))
    n = len(ptr.source_ids)
    y = np.concatenate([ytr, np.zeros(len(seqs) - n, dtype=np.int64)])
    return text_so_far_baseline(counts, y, [(np.arange(n), np.arange(n, len(seqs)))])[n:]


MIN_SCORED_PAIRS = 5  # base stories an IIA needs before a verdict says "used" or "not used" (its bootstrap unit)


def _verdict(r: dict) -> str:
    probe, maj, full, rnd = r["probe"], r["majority"], r["iia_full"], r["iia_random"]
    best = max((b for b in (maj, r.get("bag_of_words")) if b), key=lambda b: b["accuracy"], default=None)
    subs = [x for x in (r["iia_probe"], r["iia_massmean"]) if x]
    n_iia = int(full.get("n_groups", 0))  # base stories whose pairs the IIA scores (the model right on both stories)
    nums = f"IIA whole {full['accuracy']:.2f} over {n_iia} scored pair group(s)"
    if probe:
        nums = (f"probe {probe['accuracy']:.2f} [{probe['interval'][0]:.2f}, {probe['interval'][1]:.2f}] vs majority "
                f"{maj['accuracy']:.2f}, bag-of-words {r['bag_of_words']['accuracy']:.2f}; {nums}, probe subspace "
                f"{r['iia_probe']['accuracy']:.2f}, mass-mean {r['iia_massmean']['accuracy']:.2f}, random "
                f"{rnd['accuracy']:.2f}")
    if r.get("iia_das"):
        nums += f", DAS {r['iia_das']['accuracy']:.2f}"
    readable = bool(probe) and probe["interval"][0] > best["accuracy"]  # above the strongest baseline
    if n_iia < MIN_SCORED_PAIRS or not np.isfinite(full["interval"][0]):  # no verdict on use from so few pairs
        why = (f"use not measured: {n_iia} base stor{'y' if n_iia == 1 else 'ies'} scored, fewer than "
               f"{MIN_SCORED_PAIRS} (IIA counts pairs whose base and source the model answers right)")
        return f"{'readable' if readable else 'not readable'}; {why} ({nums})"
    used_probe = any(x["interval"][0] > rnd["interval"][1] for x in subs)
    used_any = full["interval"][0] > 0.5
    if not readable:
        return f"not readable ({nums})" + ("; the site is used, but no linear probe reads the label there"
                                           if used_any else "")
    if used_probe:
        return f"readable and used ({nums})"  # through the probe's or the class means' direction
    return f"readable but not used ({nums})" if not used_any else (
        f"readable; the site is used, but not through the probe's direction ({nums})")


def main(cfg: InterchangeConfig, *, bridge=None, tok=None, progress=None) -> dict:
    """Every test at every site; see the module."""

    pairs = build_pairs(cfg)  # records are checked before the model loads
    if bridge is None:
        bridge, tok = load_model(cfg.model)
    return _tests(bridge, tok, cfg, pairs, progress)


@singledispatch
def _tests(bridge, tok, cfg: InterchangeConfig, pairs: list, progress=None) -> dict:
    """`main` on a loaded model: every test at every residual site (a Thinking States model: its overload)."""
    n = int(bridge.cfg.n_layers)
    layers = _layers(cfg.layers, n, "--layers")
    das_layers = [x for x in _layers(cfg.das_layers, n, "--das-layers") if x in layers] if cfg.das_layers != "all" \
        else layers
    erase_layers = _layers(cfg.erase_layers, n, "--erase-layers")
    site_list = sites(bridge, layers, [p.strip() for p in cfg.positions.split(",") if p.strip()])
    if not 1 <= cfg.das_rank <= int(bridge.cfg.d_model):
        raise ValueError(f"--das-rank {cfg.das_rank} does not fit d_model={bridge.cfg.d_model}")
    train, test = split_pairs(pairs, cfg.heldout_share, cfg.seed)
    prepare(tok, pairs, site_list)  # every site and answer defined, before any forward
    kw = {"batch_size": cfg.batch_size, "seed": cfg.seed, "progress": progress}
    full = interchange(bridge, tok, test, site_list, **kw)
    reads, probe_bases, mean_bases = _readable(bridge, tok, train, test, site_list, cfg.batch_size, cfg.seed)
    have = [s for s in site_list if probe_bases[s] is not None]
    by_probe = interchange(bridge, tok, test, have, {s: probe_bases[s] for s in have}, **kw) if have else None
    by_mean = interchange(bridge, tok, test, have, {s: mean_bases[s] for s in have}, **kw) if have else None
    rnd = interchange(bridge, tok, test, site_list, f"random:{cfg.das_rank}", **kw)
    das = {}
    for s in [s for s in site_list if s.layer in das_layers]:
        Q = learn_das(bridge, tok, train, s, DasConfig(rank=cfg.das_rank, steps=cfg.das_steps, seed=cfg.seed))
        das[s] = interchange(bridge, tok, test, [s], {s: Q}, **kw).rows[0]["iia"]
    rows = []
    for j, s in enumerate(site_list):
        r = {"layer": s.layer, "position": s.position, "hook": s.hook, **reads[j],
             "iia_full": full.rows[j]["iia"], "logit_diff_shift": full.rows[j]["logit_diff_shift"],
             "iia_probe": by_probe.rows[have.index(s)]["iia"] if s in have else None,
             "iia_massmean": by_mean.rows[have.index(s)]["iia"] if s in have else None,
             "iia_random": rnd.rows[j]["iia"], "iia_das": das.get(s)}
        r["verdict"] = _verdict(r)
        rows.append(r)
    erased = {}
    if erase_layers:
        bases = list({p.unit: p.base for p in pairs}.values())
        erased = {str(x): erasure(bridge, tok, bases, ErasureConfig(layer=x, positions="last", seed=cfg.seed,
                                                                     heldout_share=cfg.heldout_share,
                                                                     batch_size=cfg.batch_size)) for x in erase_layers}
    res = {"model": cfg.model, "checkpoint_hash": checkpoint_hash(bridge),
           "source": cfg.data or f"task {cfg.task} ({cfg.rendering}, {cfg.events} events)",
           "n_pairs": len(pairs), "n_train_pairs": len(train), "n_heldout_pairs": len(test),
           "base_correct": round(full.base_correct, 4), "das_rank": cfg.das_rank,
           "scored_on": "held-out pairs (split by base story); IIA over pairs whose counterfactual answer differs from "
                        "the base's own", "sites": rows, "erasure": erased, "files": []}
    if cfg.out:

        os.makedirs(cfg.out, exist_ok=True)
        png = os.path.join(cfg.out, "interchange.png")
        interchange_figure(res, png)
        res["files"] = [os.path.join(cfg.out, "interchange.json"), png]
        write_json(res["files"][0], res)
    return res


@_tests.register(ThinkingStates)
def _swap_the_written_state(model, tok, cfg: InterchangeConfig, pairs: list, progress=None) -> dict:
    """A Thinking States model's belief is the state S it writes: swap that (the ground truth)."""
    res = {"model": cfg.model, "checkpoint_hash": checkpoint_hash(model),
           "source": f"task {cfg.task} ({cfg.rendering}, {cfg.events} events)",
           **thinking_interchange(model, tok, pairs, cfg.seed, progress), "files": []}
    if cfg.out:
        os.makedirs(cfg.out, exist_ok=True)
        res["files"] = [os.path.join(cfg.out, "interchange.json")]
        write_json(res["files"][0], res)
    return res
