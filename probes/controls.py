"""Controls and splits for probes: position selections, prompt-grouped folds, control task labels.

**Control task (Hewitt & Liang 2019, adapted to sequences).** Every (token id, position) pair
gets a fixed random label, drawn once from a hash. A probe that scores well on this task reads
token identity and position, not the state; *selectivity* = accuracy - control accuracy says
how much of the accuracy needs more than that. H&L's original control gives each word *type* a
random label. With a vocabulary of 32 words that control is uninformative: token identity is
linearly readable from any layer, so a per-type control is solved at ~100% by every probe and
tells nothing about the state. Pairing the type with its position makes the control as hard to
memorise as the structure of the prompts allows.

>>> a = control_labels(np.array([5, 5, 6]), np.array([3, 3, 3]), 2, seed=0).tolist()
>>> a[0] == a[1] == control_labels(np.array([5]), np.array([3]), 2, seed=0).tolist()[0]
True
"""

from __future__ import annotations

import numpy as np

POSITIONS = {
    # name: which tokens are probed (all of them lie inside the prompt; the answer token is excluded
    # because it *is* the answer word)
    "after_first_event": "prompt tokens that complete or follow the first event (events_so_far >= 1)",
    "boundary": "prompt tokens that complete an event (is_event_boundary)",
    "all": "every prompt token, including those before the first event",
    "last": "the last prompt token of each prompt, where the answer is read out (toy: '?')",
    "labelled": "every token that carries a label (your data: event ends onward, spans, a text's last token)",
}


def position_mask(labels: dict[str, np.ndarray], positions: str, label: str = "state") -> np.ndarray:
    """Boolean row mask ``[rows]`` of the tokens a probe is trained and tested on; a row whose `label` is
    -1 (unlabelled) is never chosen."""
    if positions not in POSITIONS:
        raise ValueError(f"positions {positions!r} is unknown; choose one of {sorted(POSITIONS)}")
    mask = labels["in_prompt"].astype(bool) & (labels[label] >= 0)
    if positions == "after_first_event":
        mask &= labels["events_so_far"] >= 1
    elif positions == "boundary":
        mask &= labels["is_event_boundary"].astype(bool)
    elif positions == "last":
        pid, pos = labels["prompt_id"], labels["position"]
        last = np.full(int(pid.max()) + 1, -1)
        np.maximum.at(last, pid[mask], pos[mask])
        mask &= pos == last[pid]
    return mask


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def control_labels(token_id: np.ndarray, position: np.ndarray, n_classes: int, seed: int = 0) -> np.ndarray:
    """A fixed random label in ``[0, n_classes)`` for each (token id, position) pair. ``[rows]``."""
    key = (token_id.astype(np.uint64) << np.uint64(24)) ^ position.astype(np.uint64)
    key = key ^ (np.uint64(seed) << np.uint64(56))
    return (_splitmix64(key) % np.uint64(n_classes)).astype(np.int64)


def prompt_folds(prompt_ids: np.ndarray, k: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    """GroupKFold over prompts: ``[(train_rows, test_rows)]`` index arrays; no prompt is split."""
    from sklearn.model_selection import GroupKFold  # deferred: scikit-learn (1 s) loads for a fit only

    n_prompts = len(np.unique(prompt_ids))
    if n_prompts < k:
        raise ValueError(f"{n_prompts} prompts cannot be split into {k} folds (with your own records, records that "
                         "share a text or a group count once): harvest more prompts or lower --folds")
    return list(GroupKFold(n_splits=k).split(np.zeros(len(prompt_ids)), groups=prompt_ids))


def majority_accuracy(y_train: np.ndarray, y_test: np.ndarray) -> float:
    """Accuracy of always predicting the most common training label."""
    return float(np.mean(y_test == np.bincount(y_train).argmax()))
