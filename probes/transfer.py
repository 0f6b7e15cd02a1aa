"""Train on one store, score on another: the cross-dataset cell of a truth paper (cities -> negated cities,
Marks & Tegmark 2024), without harvesting the union of the datasets.

`probe --acts A --transfer B,C` reads the final probes fitted on A's training records on every labelled row
of B and C (their own training and held-out records alike: none of them was fitted on), with a bootstrap
interval over B's record groups. Running `probe` on each store with the others as `--transfer` fills the
matrix; its diagonal is each store's own out-of-fold accuracy. The stores must come from one model (the
checkpoint hash), hold the hooks, and name the label's classes alike.

Usage (not run as a doctest: it needs stored activations)::

    rep = probe_report(ActivationStore.open("acts/cities"), ReportConfig(label="truth",
                       transfer="acts/cities_negated"))
    rep.transfer["acts/cities_negated"]["layers"][9]["accuracy"]
"""

from __future__ import annotations

import numpy as np
import torch

from .data import _row_selection, load_probe_data
from .intervals import below_chance, scored
from .store import ActivationStore


def check_transfer_store(store, other, label: str, classes) -> None:
    """Refuse a store the probes cannot be read on: another model, missing hooks, another label or classes."""
    want = store.manifest["config"].get("checkpoint_hash")
    have = other.manifest["config"].get("checkpoint_hash")
    if want and have and want != have:
        raise ValueError(f"--transfer {other.path} was harvested from another model (checkpoint {have}) than "
                         f"{store.path} ({want}): harvest it with the same --model")
    missing = [h for h in store.hooks if h not in other.hooks]
    if missing:
        raise ValueError(f"--transfer {other.path} lacks the hooks {missing}: harvest it with the same --layers")
    other.check_label(label)
    theirs = (other.manifest.get("label_classes") or {}).get(label)
    if classes and theirs and list(theirs) != list(classes):
        raise ValueError(f"--transfer {other.path} names the classes of {label!r} {list(theirs)}, {store.path} "
                         f"{list(classes)}: a probe's class k would be scored against another class k")


def transfer_scores(finals: list, other: ActivationStore, positions: str, label: str, chance: float) -> dict:
    """Accuracy of each block's final probe (``finals``: per-block `LinearProbe`s) on every labelled row of
    `other`, with its interval over `other`'s record groups."""
    sel = _row_selection(other, positions, label)
    lab = sel[2]
    y = torch.as_tensor(lab[label])
    groups = lab["group_id" if "group_id" in lab else "prompt_id"]
    layers = []
    for probe in finals:
        X = load_probe_data(other, positions, probe.hooks, sel).X  # [L, n, d]
        for i, h in enumerate(probe.hooks):
            correct = (probe.predict(X[i], h) == y).numpy()
            s = scored(correct, groups)
            layers.append({"hook": h, **s.to_json(), "below_chance": below_chance(s.hi, chance)})
    best = max(layers, key=lambda r: r["accuracy"])
    return {"n_rows": int(len(y)), "n_groups": int(len(np.unique(groups))), "best_hook": best["hook"],
            "layers": layers}
