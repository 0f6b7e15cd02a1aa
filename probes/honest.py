"""What a reviewer accepts: every probe accuracy out-of-fold, beside its strongest baseline, with intervals.

`probe_report` calls these. The baselines are cross-fitted on the probe's own folds:

- ``majority``: the training folds' most common class;
- ``embedding``: the same probe on the input to block 0 (what the token identities give);
- ``random_init``: the same probe on the random-init twin at the same block (what the architecture gives);
- ``last_named``: the class named last so far in the text (`tasks.surface`; stores harvested from records);
- ``text_so_far``: a bag-of-words logistic regression on the tokens up to the scored one;
- ``label:NAME``: any label of the store as a rule (``--baseline-label``).

A verdict reads the margin over the *strongest* of them at that block, with a paired group-bootstrap interval,
never the margin over chance.
"""

from __future__ import annotations

import numpy as np

from ..tasks.surface import surface_column
from .baselines import lookup_baseline, prefix_counts, text_so_far_baseline
from .intervals import below_chance, margin_interval, scored

DESCRIPTIONS = {  # baseline name -> how a sentence names it
    "majority": "the fold-wise majority class",
    "embedding": "the same probe on the embeddings",
    "random_init": "the same probe on the random-init twin",
    "last_named": "the class named last so far",
    "text_so_far": "a bag-of-words of the text so far",
}


def describe(name: str) -> str:
    """How a verdict names baseline `name`."""
    if name.startswith("label:"):
        return f"the label {name[6:]!r} alone"
    return DESCRIPTIONS.get(name, name)


def baseline_predictions(store, lab: dict, mi: np.ndarray, folds, label: str, baseline_labels=(),
                         text_baseline: bool = True) -> dict[str, np.ndarray]:
    """Out-of-fold predictions ``{name: [n_main]}`` of every baseline that does not need activations."""
    y = lab[label][mi]
    out = {"majority": lookup_baseline(np.zeros(len(mi), dtype=np.int64), y, folds)}
    col = surface_column(label)
    if col in lab and (lab[col][mi] >= 0).any():
        out["last_named"] = lookup_baseline(lab[col][mi], y, folds)
    for b in baseline_labels:
        if b not in lab:
            raise ValueError(f"--baseline-label {b!r} is not a label of {store.path}; its labels are "
                             f"{[n for n in lab if n not in ('token_id', 'position', 'prompt_id')]}")
        out[f"label:{b}"] = lookup_baseline(lab[b][mi], y, folds)
    if text_baseline:
        every = store.load_labels()
        counts = prefix_counts(every["token_id"], every["prompt_id"], every["position"],
                               lab["prompt_id"][mi], lab["position"][mi])
        out["text_so_far"] = text_so_far_baseline(counts, y, folds)
    return out


def layer_reading(correct: np.ndarray, baselines: dict[str, np.ndarray], groups: np.ndarray, chance: float) -> dict:
    """One block's held-out accuracy, interval, strongest baseline and margin over it (``correct [n]`` bool;
    ``baselines``: name -> ``[n]`` bool correctness on the same rows)."""
    s = scored(correct, groups)
    strongest = max(baselines, key=lambda k: float(np.mean(baselines[k])))
    b = scored(baselines[strongest], groups)
    m, lo, hi = margin_interval(correct, baselines[strongest], groups)
    return {"accuracy_interval": [round(s.lo, 4), round(s.hi, 4)], "strongest_baseline": strongest,
            "strongest_baseline_accuracy": round(b.accuracy, 4),
            "strongest_baseline_interval": [round(b.lo, 4), round(b.hi, 4)],
            "margin": [round(m, 4), round(lo, 4), round(hi, 4)], "below_chance": below_chance(s.hi, chance)}


def verdict(row: dict, label: str, n_groups: int, chance: float) -> str:
    """The sentence for one block's reading (a row with `layer_reading`'s keys, ``hook`` and ``accuracy``)."""
    a, (alo, ahi) = row["accuracy"], row["accuracy_interval"]
    b, (blo, bhi) = row["strongest_baseline_accuracy"], row["strongest_baseline_interval"]
    m, lo, hi = row["margin"]
    name = describe(row["strongest_baseline"])
    where = f"{row['hook']} (out-of-fold, {n_groups} record groups, 95% intervals)"
    nums = f"{a:.2f} [{alo:.2f}, {ahi:.2f}] vs {b:.2f} [{blo:.2f}, {bhi:.2f}]; margin {m:+.2f} [{lo:+.2f}, {hi:+.2f}]"
    if lo > 0:
        text = f"{where} reads {label!r} beyond {name}: {nums}"
    elif hi < 0:
        text = f"{where} reads {label!r} worse than {name}: {nums}"
    else:
        text = f"{where}: no evidence beyond {name} ({nums})"
    if row.get("below_chance"):
        text += (f". Its accuracy is below chance ({chance:.2f}) on held-out records: the probe reads something "
                 "else that the training folds tie to the label, and the held-out records tie the other way")
    return text
