"""Baselines a probe must beat, each cross-fitted on the probe's own folds (no baseline sees its test rows).

- `lookup_baseline`: a rule from one categorical column to the label. Each value of the column maps to the
  label's most common class among training rows with that value (the training majority for a value the
  training rows lack, or -1 (unknown)). With the column ``<label>_last_named`` this is "the class named last so
  far"; with any label of the store (``--baseline-label``) it is "what that label alone predicts".
- `text_so_far_baseline`: a bag-of-words logistic regression on the tokens up to the scored one (for a label
  per text, the whole text). It is what the words give away, with no model.
- `control_defined`: whether a type-level control task (Hewitt & Liang 2019) says anything on the scored
  rows; at a text's last "." every scored token is one word type, and the control is then degenerate.

>>> feat = np.array([0, 0, 1, 1, 0, 1]); y = np.array([1, 1, 0, 0, 1, 0])
>>> folds = [(np.array([0, 1, 2]), np.array([3, 4, 5])), (np.array([3, 4, 5]), np.array([0, 1, 2]))]
>>> lookup_baseline(feat, y, folds).tolist()
[1, 1, 0, 0, 1, 0]
"""

from __future__ import annotations

import numpy as np

MIN_TYPES = 8  # fewest effective (word type, position) keys (exp of their entropy) at the scored rows for a control


def lookup_baseline(feature, y, folds) -> np.ndarray:
    """Out-of-fold predictions ``[n]`` of the rule "this value of `feature` means the label's most common
    class for it in the training folds" (-1 where no training row has the value and no majority exists)."""
    feature, y = np.asarray(feature), np.asarray(y)
    pred = np.full(len(y), -1, dtype=np.int64)
    for train, test in folds:
        ytr, ftr = y[train], feature[train]
        majority = int(np.bincount(ytr).argmax())
        table = {}
        for v in np.unique(ftr):
            table[int(v)] = int(np.bincount(ytr[ftr == v]).argmax())
        pred[test] = [table.get(int(v), majority) for v in feature[test]]
    return pred


def prefix_counts(token_id, prompt_id, position, at_prompt, at_position):
    """Sparse ``[n, vocab]`` counts of each token id in the text up to and including the tokens at
    ``(at_prompt [n], at_position [n])``; ``token_id / prompt_id / position`` are every stored token's."""
    from scipy.sparse import csr_matrix  # deferred: loaded with scikit-learn, when a fit asks for it

    token_id, prompt_id, position = (np.asarray(a, dtype=np.int64) for a in (token_id, prompt_id, position))
    order = np.lexsort((position, prompt_id))
    tid, pid, pos = token_id[order], prompt_id[order], position[order]
    starts = {int(p): int(i) for p, i in zip(*np.unique(pid, return_index=True))}
    where = {(int(p), int(t)): k for k, (p, t) in enumerate(zip(pid, pos))}
    indptr, indices = [0], []
    for p, t in zip(np.asarray(at_prompt), np.asarray(at_position)):
        k = where[(int(p), int(t))]
        prefix = tid[starts[int(p)]: k + 1]
        indices.append(prefix)
        indptr.append(indptr[-1] + len(prefix))
    indices = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    vocab = int(token_id.max()) + 1 if len(token_id) else 1
    m = csr_matrix((np.ones(len(indices)), indices, np.asarray(indptr)), shape=(len(indptr) - 1, vocab))
    m.sum_duplicates()
    return m


def text_so_far_baseline(counts, y, folds, C: float = 1.0) -> np.ndarray:
    """Out-of-fold predictions ``[n]`` of a bag-of-words logistic regression on ``counts [n, vocab]`` (log-scaled
    token counts of the text so far), fitted per fold."""
    from sklearn.linear_model import LogisticRegression  # deferred: scikit-learn (1 s) loads for a fit only

    X = counts.copy()
    X.data = np.log1p(X.data)
    y = np.asarray(y)
    pred = np.full(len(y), -1, dtype=np.int64)
    for train, test in folds:
        classes = np.unique(y[train])
        if len(classes) < 2:
            pred[test] = classes[0]
            continue
        clf = LogisticRegression(C=C, max_iter=2000).fit(X[train], y[train])
        pred[test] = clf.predict(X[test])
    return pred


def effective_types(token_id) -> float:
    """exp(entropy) of the word types at the scored rows: about the number of equally common types."""
    _, counts = np.unique(np.asarray(token_id), return_counts=True)
    p = counts / counts.sum()
    return float(np.exp(-(p * np.log(p)).sum()))


def control_defined(token_id, position) -> tuple[bool, str]:
    """(whether the control task means anything on these scored rows, the reason in words).

    The control gives each (word type, position) a random class (`probes.controls`). It is left out where the
    scored tokens are (almost) one word type, as at every text's final "." (a type-level control then has no
    types to vary: what is left is a random function of the position), or where the scored rows hold so few
    (type, position) keys that a random class per key is a constant or a coin (fewer than `MIN_TYPES`
    equally common keys)."""
    token_id, position = np.asarray(token_id, dtype=np.int64), np.asarray(position, dtype=np.int64)
    types = effective_types(token_id)
    keys = effective_types(token_id * (1 << 24) + position)
    if types < 1.5:
        return False, (f"the scored tokens hold {types:.1f} effective word types: a control task that gives each word "
                       "type a random class has nothing to vary here, so it is left out")
    if keys < MIN_TYPES:
        return False, (f"the scored tokens hold {keys:.1f} effective (word type, position) keys, fewer than "
                       f"{MIN_TYPES}: a random class per key is nearly constant here, so the control is left out")
    return True, f"the scored tokens hold {types:.1f} effective word types in {keys:.1f} (type, position) keys"
