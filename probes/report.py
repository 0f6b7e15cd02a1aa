"""Probe every layer of a store, with controls, prompt-grouped folds and held-out splits.

For every layer: out-of-fold accuracy (GroupKFold by prompt) on the chosen label, the same on
the control task (selectivity = accuracy - control accuracy), the same probe on the
random-init twin store, per-token-type accuracy (event-boundary tokens vs the others), and
accuracy on held-out lengths (train on ``train_events``, test on longer prompts) and held-out
templates and names (natural rendering). The embedding-only probe (input to block 0) and a
majority-class baseline are reported next to them.

Usage (not run as a doctest: it needs stored activations, probes or a model)::

    rep = probe_report(ActivationStore.open("acts/target"), ReportConfig(label="state"))
    rep.best_layer
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from ..tasks import parse_events_range
from ..tasks.score_checks import require_two_classes
from .baselines import control_defined
from .controls import control_labels, majority_accuracy, prompt_folds
from .crossfit import save_folds
from .data import _row_selection, load_probe_data
from .harvest import EMBED_HOOK
from .honest import baseline_predictions, describe, layer_reading, verdict
from .intervals import scored
from .linear import LinearProbe, ProbeConfig, fit_all_layers, fit_problems
from .massmean import mass_mean_oof
from .store import ActivationStore
from .transfer import check_transfer_store, transfer_scores


@dataclass
class ReportConfig:
    """What `beliefscope probe` fits and reports."""

    label: str = ""  # label to probe: "state" or "parity" for a task, or a label of your data by its field name
    #   ("": state for a task, your data's first label)
    positions: str = "auto"  # token rows the probe is fitted on: after_first_event (every token once the story has
    #   begun), boundary (the token completing each event), last (the final token, where the answer is computed),
    #   labelled (every token with a label) or all; auto: labelled for your data, after_first_event for a task
    folds: int = 5  # GroupKFold folds over prompts (over the data's groups, where it has a group field)
    train_events: str = "auto"  # prompts with this many events (LO-HI) form the main split and longer ones test
    #   lengths; all: no length split; auto: 1-8 for a task, all for your data
    layers: str = "all"  # "all" or comma-separated block indices to fit (the embedding is always fitted)
    trainer: str = "torch"  # "torch" (batched) or "sklearn" (reference)
    C: float = 1.0  # inverse L2 strength on standardised activations
    max_iter: int = 300  # optimiser iterations per fit
    control_seed: int = 0  # seed of the control task's random labels
    layers_per_fit: int = 8  # hooks fitted together (bounds memory: rows x d x this many floats)
    baseline_label: str = ""  # comma-separated labels of the store to score as baselines (each as a rule: its value
    #   -> the label's most common class on the training folds), e.g. lastbox
    text_baseline: bool = True  # score a bag-of-words of the text so far as a baseline (cross-fitted like the probe)
    transfer: str = ""  # comma-separated stores of the same model to read the final probes on (fitted here, scored
    #   there: cities -> negated cities), each with intervals


@dataclass
class ProbeCommandConfig(ReportConfig):
    """`beliefscope probe`: the report's settings, and which stores it reads and where it writes."""

    acts: str = ""  # activation store folder (from `beliefscope harvest --out`)
    out: str | None = None  # folder for the fitted probes and report.json (None: report only)
    random_init: str | None = None  # random-init twin store (None: ACTS/random_init when it exists)
    random_init_twin: bool = True  # fit the random-init twin's probes beside the model's (the control)


def layer_index(hook: str) -> int:
    """Block index of a hook name; the embedding (input to block 0) is -1."""
    if hook == EMBED_HOOK:
        return -1
    m = re.match(r"blocks\.(\d+)\.", hook)
    return int(m.group(1)) if m else -1


@dataclass
class ProbeReport:
    """Everything `beliefscope probe --json` prints."""

    label: str  # probed label
    positions: str  # token selection
    store: str  # store folder
    store_hash: str  # config hash of the store
    model: str  # model id
    n_prompts: int  # prompts in the main (by-prompt CV) split
    n_rows: int  # tokens in the main split
    folds: int  # GroupKFold folds
    trainer: str  # torch / sklearn
    majority_accuracy: float  # always predict the training majority
    embedding_accuracy: float  # probe on the input to block 0
    embedding_control_accuracy: float  # control task on the input to block 0
    random_init_embedding_accuracy: float | None  # same on the random-init model
    best_layer: int  # layer with the highest accuracy (resid_post)
    layers: list = field(default_factory=list)  # per-layer dicts (see `probe_report`)
    heldout_lengths: dict = field(default_factory=dict)  # train/test event ranges and sizes
    heldout_templates: dict = field(default_factory=dict)  # sizes, if the store has held-out templates (or splits)
    class_names: list | None = None  # the label's class names, in index order (None for a count label)
    seconds: float | None = None  # wall time of the fits
    scored_on: str = "out-of-fold"  # every accuracy here: each row scored by the fold probe that did not see it
    n_groups: int = 0  # record groups of the main split (the folds' and the intervals' unit)
    baselines: dict = field(default_factory=dict)  # name -> accuracy, interval, rows, groups, description
    control: dict = field(default_factory=dict)  # whether the control task is defined on the scored rows, and why
    verdict: str = ""  # the best block's reading against its strongest baseline, in words
    transfer: dict = field(default_factory=dict)  # store -> the final probes' accuracy on its rows, per hook

    def to_json(self) -> dict:
        return asdict(self)


def _oof(X, labels, folds, cfg: ReportConfig, n_classes, hooks, final: bool = False):
    """Out-of-fold predictions ``[L, n]`` of per-layer probes for each label vector in ``labels``, and
    (``final``) the probe fitted on every row of the first. The torch trainer fits every fold of every
    label and the final probe in one run (`fit_problems`); scikit-learn fits them one by one."""
    y0 = torch.as_tensor(labels[0])
    preds = [torch.full((X.shape[0], X.shape[1]), -1, dtype=torch.long) for _ in labels]
    pcfg = ProbeConfig(cfg.C, cfg.max_iter, trainer=cfg.trainer)
    if cfg.trainer == "torch":
        M = torch.zeros(len(labels) * len(folds) + int(final), X.shape[1], dtype=torch.bool)
        Y = torch.stack([torch.as_tensor(y) for y in labels for _ in folds] + ([y0] if final else []))
        for j, (train, _) in enumerate(folds * len(labels)):
            M[j, torch.as_tensor(train)] = True
        if final:
            M[-1] = True
        probes = fit_problems(X, Y, M, hooks=hooks, n_classes=n_classes, config=pcfg)
    else:
        probes = [fit_all_layers(X[:, tr], torch.as_tensor(y)[tr], hooks=hooks, n_classes=n_classes,
                                 trainer=cfg.trainer, config=pcfg) for y in labels for tr, _ in folds]
        if final:
            probes.append(fit_all_layers(X, y0, hooks=hooks, n_classes=n_classes, trainer=cfg.trainer, config=pcfg))
    for j, probe in enumerate(probes[: len(labels) * len(folds)]):
        test = torch.as_tensor(folds[j % len(folds)][1])
        for i, h in enumerate(hooks):
            preds[j // len(folds)][i, test] = probe.predict(X[i, test], h)
    return preds, ((probes[-1], probes[: len(folds)]) if final else None)


def _acc(pred, y, rows=None):
    y = torch.as_tensor(y)
    if rows is not None:
        rows = torch.as_tensor(rows, dtype=torch.bool)
        if not rows.any():
            return [None] * pred.shape[0]
        pred, y = pred[:, rows], y[rows]
    return [round(float(a), 4) for a in (pred == y).float().mean(1)]


def probe_report(store: ActivationStore, cfg: ReportConfig, random_store: ActivationStore | None = None,
                 out: str | None = None, progress=None) -> ProbeReport:
    """Fit and evaluate probes on every hook of `store`; save the final probes to `out`.

    `progress(n)` is called after each block of n layers is fitted.
    """
    t0 = time.perf_counter()
    cfg, lo, hi = resolved(cfg, store)
    sel = _row_selection(store, cfg.positions, cfg.label)
    lab = sel[2]
    if len(lab["prompt_id"]) == 0:
        raise ValueError(f"no labelled tokens of {cfg.label!r} match positions={cfg.positions!r} in {store.path}: "
                         "choose other --positions (labelled takes every labelled token)")
    rsel = None
    if random_store is not None:
        rsel = _row_selection(random_store, cfg.positions, cfg.label)
        if not (np.array_equal(rsel[2]["prompt_id"], lab["prompt_id"])
                and np.array_equal(rsel[2]["token_id"], lab["token_id"])):
            raise ValueError(f"random-init store {random_store.path} holds other prompts than {store.path}; "
                             "harvest both with the same command")
    class_names = label_classes(store, cfg.label)
    n_classes = max(len(class_names or ()), int(lab[cfg.label].max()) + 1, 2)
    y = torch.as_tensor(lab[cfg.label])
    yc = torch.as_tensor(control_labels(lab["token_id"], lab["position"], n_classes, cfg.control_seed))
    main, long_rows, held_tpl = split_rows(lab, lo, hi)
    mi = np.nonzero(main)[0]
    if len(mi) == 0:
        raise ValueError(f"no prompts with {lo}-{hi} events in {store.path}: set --train-events to the harvested range")
    present, counts = np.unique(lab[cfg.label][mi], return_counts=True)  # the training rows' classes
    require_two_classes({class_names[k] if class_names else str(k): int(n) for k, n in zip(present, counts)},
                        cfg.label, f"{store.path} (its training rows)")
    groups = score_groups(lab)[mi]
    folds = prompt_folds(groups, cfg.folds)
    boundary = lab["is_event_boundary"][mi].astype(bool)
    maj = np.mean([majority_accuracy(lab[cfg.label][mi][tr], lab[cfg.label][mi][te]) for tr, te in folds])
    control_ok, control_note = control_defined(lab["token_id"][mi], lab["position"][mi])
    wanted = [b.strip() for b in cfg.baseline_label.split(",") if b.strip()]
    static = {k: v == y[mi].numpy() for k, v in
              baseline_predictions(store, lab, mi, folds, cfg.label, wanted, cfg.text_baseline).items()}
    chance, embed_correct = 1 / n_classes, None
    others = [ActivationStore.open(t.strip()) for t in cfg.transfer.split(",") if t.strip()]
    for other in others:  # refused before any fit
        check_transfer_store(store, other, cfg.label, class_names)
    rows, finals, embed = [], [], {}
    hooks = chosen_hooks(store.hooks, cfg.layers)
    for start in range(0, len(hooks), cfg.layers_per_fit):
        block = hooks[start:start + cfg.layers_per_fit]
        data = load_probe_data(store, cfg.positions, block, sel)
        X = data.X[:, torch.as_tensor(mi)]  # [L, n_main, d]
        (acc, ctl), (final, fold_probes) = _oof(X, [y[mi], yc[mi]], folds, cfg, n_classes, block, final=True)
        racc, twin_pred = [None] * len(block), None
        if random_store is not None:
            RX = load_probe_data(random_store, cfg.positions, block, rsel).X[:, torch.as_tensor(mi)]
            twin_pred = _oof(RX, [y[mi]], folds, cfg, n_classes, block)[0][0]
            racc = _acc(twin_pred, y[mi])
            del RX
        finals.append((final, X.norm(dim=2).mean(1), fold_probes))
        held = {}
        held_name = "heldout_split_accuracy" if is_data_store(store) else "heldout_template_accuracy"
        for name, test_rows in (("heldout_length_accuracy", long_rows), (held_name, held_tpl)):
            if test_rows.any():
                ti = torch.as_tensor(np.nonzero(test_rows)[0])
                held[name] = [round(final.accuracy(data.X[i, ti], y[ti], h), 4) for i, h in enumerate(block)]
        a, c = _acc(acc, y[mi]), _acc(ctl, yc[mi])
        ab, ao = _acc(acc, y[mi], boundary), _acc(acc, y[mi], ~boundary)
        mm = mass_mean_oof(X, y[mi].numpy(), folds, n_classes) == y[mi].numpy()  # [L, n] mass-mean hits
        for i, h in enumerate(block):
            correct = (acc[i] == y[mi]).numpy()
            row = {"layer": layer_index(h), "hook": h, "accuracy": a[i],
                   "control_accuracy": c[i] if control_ok else None,
                   "selectivity": round(a[i] - c[i], 4) if control_ok else None, "random_init_accuracy": racc[i],
                   "accuracy_event_tokens": ab[i], "accuracy_other_tokens": ao[i],
                   "mass_mean_accuracy": round(float(mm[i].mean()), 4),
                   "mass_mean_interval": scored(mm[i], groups).to_json()["interval"],
                   **{k: v[i] for k, v in held.items()}}
            bases = dict(static)
            if embed_correct is not None:
                bases["embedding"] = embed_correct
            if twin_pred is not None:
                bases["random_init"] = (twin_pred[i] == y[mi]).numpy()
                row["random_init_interval"] = scored(bases["random_init"], groups).to_json()["interval"]
            row.update(layer_reading(correct, bases, groups, chance))
            if h == EMBED_HOOK:
                embed, embed_correct = row, correct
            else:
                rows.append(row)
        del data, X
        if progress:
            progress(len(block))
    best = max(rows, key=lambda r: r["accuracy"]) if rows else embed
    n_groups = len(np.unique(groups))
    base_json = {k: {**scored(v, groups).to_json(), "description": describe(k)} for k, v in static.items()}
    if embed_correct is not None:
        base_json["embedding"] = {**scored(embed_correct, groups).to_json(), "description": describe("embedding")}
    transfer = {o.path: transfer_scores([f for f, _, _ in finals], o, cfg.positions, cfg.label, chance)
                for o in others}
    if out:
        _save_final(finals, store, cfg, out, class_names)
        keys = store.manifest.get("text_keys")
        if keys:  # records: each training text's fold, so `forced` reads it with a probe that never saw it
            pids = lab["prompt_id"][mi]
            text_fold = {keys[int(p)]: k for k, (_, te) in enumerate(folds) for p in np.unique(pids[te])}
            meta = LinearProbe.load(out).meta
            save_folds(out, [_concat([f[k] for _, _, f in finals], meta) for k in range(len(folds))], text_fold)
    return ProbeReport(
        label=cfg.label, positions=cfg.positions, store=store.path, store_hash=store.hash,
        model=store.manifest["model"]["id"], n_prompts=len(np.unique(lab["prompt_id"][mi])), n_rows=len(mi),
        folds=cfg.folds, trainer=cfg.trainer, majority_accuracy=round(float(maj), 4),
        embedding_accuracy=embed.get("accuracy"), embedding_control_accuracy=embed.get("control_accuracy"),
        random_init_embedding_accuracy=embed.get("random_init_accuracy"), best_layer=best["layer"], layers=rows,
        heldout_lengths={"train_events": cfg.train_events, "test_prompts": len(np.unique(lab["prompt_id"][long_rows])),
                         "test_rows": int(long_rows.sum())},
        heldout_templates={"test_prompts": len(np.unique(lab["prompt_id"][held_tpl])),
                           "test_rows": int(held_tpl.sum())},
        class_names=class_names, seconds=round(time.perf_counter() - t0, 2), n_groups=n_groups,
        baselines=base_json, control={"defined": control_ok, "note": control_note},
        verdict=verdict(best, cfg.label, n_groups, chance), transfer=transfer,
    )


def split_rows(lab: dict, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row masks of the main split (cross-validated), the held-out lengths and the held-out templates or records."""
    in_len = (lab["n_events"] >= lo) & (lab["n_events"] <= hi)
    return (in_len & (lab["template_split"] == 0), (lab["n_events"] > hi) & (lab["template_split"] == 0),
            in_len & (lab["template_split"] == 1))


def score_groups(lab: dict) -> np.ndarray:
    """Each row's cross-validation group ``[rows]``: the data's group (records sharing a text or a group) where the
    store has one, else the prompt. Folds and intervals resample these, never rows."""
    return lab["group_id" if "group_id" in lab else "prompt_id"]


def main_split_xy(store, hook: str, label: str, positions: str = "auto", train_events: str = "auto"):
    """``(X [n, d], y [n], groups [n])``: the rows `probe` cross-validates for `label` at `hook` (its positions,
    its main split, its groups), so a fit in Python scores what the command line scores."""
    cfg, lo, hi = resolved(ReportConfig(label=label, positions=positions, train_events=train_events), store)
    sel = _row_selection(store, cfg.positions, label)
    main = split_rows(sel[2], lo, hi)[0]
    X = load_probe_data(store, cfg.positions, [hook], sel).X[0][torch.as_tensor(main)]
    return X.numpy(), np.asarray(sel[2][label][main]), np.asarray(score_groups(sel[2])[main])


def resolve_label(store, label: str) -> str:
    """The label a command reads: `label`, or the store's own default (state for a task, the data's first label);
    on your records "state" is refused, naming the label it stood for, so one name runs from harvest to view."""
    if is_data_store(store):
        primary = store.manifest.get("primary_label") or "state"
        if not label:
            return primary
        if label == "state":
            raise ValueError(f"'state' is not a label of your records in {store.path}: pass --label {primary} (its "
                             f"labels are {[n for n in (store.manifest.get('label_classes') or {})]})")
    label = label or "state"
    store.check_label(label)
    return label


def is_data_store(store) -> bool:
    """Whether the store was harvested from a researcher's records (`harvest --data`)."""
    return store.manifest.get("source") == "data"


def label_classes(store, label: str) -> list[str] | None:
    """Class names of `label` in `store` (None for a count such as ``events_so_far``)."""
    named = store.manifest.get("label_classes") or {}
    if label in named:
        return list(named[label])
    if label == "state":
        return list(store.manifest.get("state_names") or []) or None
    if label == "parity":
        return ["even", "odd"]
    return None


def resolved(cfg: ReportConfig, store) -> tuple[ReportConfig, int, int]:
    """`cfg` with its "auto" settings decided for `store`, and the main split's (lo, hi) events."""

    data = is_data_store(store)
    cfg = replace(cfg, label=resolve_label(store, cfg.label))
    if cfg.positions == "auto":
        cfg = replace(cfg, positions="labelled" if data else "after_first_event")
    if cfg.train_events == "auto":
        cfg = replace(cfg, train_events="all" if data else "1-8")
    if cfg.train_events == "all":
        return cfg, 0, 1 << 30
    lo, hi = parse_events_range(cfg.train_events)
    return cfg, lo, hi


def chosen_hooks(hooks: list[str], layers: str) -> list[str]:
    """The store's hooks at the block indices `layers` ("all", or e.g. "0,5,10"), the embedding always kept."""
    if layers in ("all", "", None):
        return list(hooks)
    try:
        want = {int(x) for x in str(layers).split(",") if x.strip()}
    except ValueError:
        raise ValueError(f"--layers {layers!r} is not 'all' or comma-separated block indices, e.g. 0,5,10") from None
    have = {layer_index(h) for h in hooks}
    missing = sorted(want - have)
    if missing:
        raise ValueError(f"--layers asks for blocks {missing}, which the store does not hold; it holds "
                         f"{sorted(have - {-1})}")
    return [h for h in hooks if h == EMBED_HOOK or layer_index(h) in want]


def _save_final(finals, store, cfg: ReportConfig, out: str, class_names=None) -> None:
    """Concatenate the per-block final probes into one `LinearProbe` and save it."""
    probes = [p for p, _, _ in finals]
    norms = torch.cat([n for _, n, _ in finals])
    hooks = [h for p in probes for h in p.hooks]
    probe = _concat(probes, {"label": cfg.label, "positions": cfg.positions, "store": os.path.abspath(store.path),
                         "store_hash": store.hash, "model": store.manifest["model"]["id"],
                         "harvest_config": store.manifest["config"],
                         "state_names": class_names, "source": store.manifest.get("source", "task"),
                         "resid_norm": {h: round(float(n), 5) for h, n in zip(hooks, norms, strict=True)},
                         "trainer": cfg.trainer, "C": cfg.C})
    probe.save(out)


def _concat(probes: list, meta: dict) -> LinearProbe:
    """One `LinearProbe` over the hooks of per-block probes (in order)."""
    return LinearProbe(hooks=[h for p in probes for h in p.hooks], mean=torch.cat([p.mean for p in probes]),
                       std=torch.cat([p.std for p in probes]), W=torch.cat([p.W for p in probes]),
                       b=torch.cat([p.b for p in probes]), n_classes=probes[0].n_classes, meta=meta)
