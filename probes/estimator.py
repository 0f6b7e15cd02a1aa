"""A linear probe of one hook as a scikit-learn classifier, and the store reader that feeds it.

`ProbeClassifier` is the estimator face of `fit_all_layers` (one layer): same objective, same
trainers, same standardisation, so it can sit in ``cross_val_score``, ``GridSearchCV`` and
``Pipeline``. `fit_all_layers` stays the fast path for many layers at once (one L-BFGS run for
all of them); use the estimator for model selection and scikit-learn tooling on one hook.

>>> import numpy as np
>>> from sklearn.model_selection import cross_val_score
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(200, 8)); y = (X[:, 2] > 0).astype(int)
>>> float(cross_val_score(ProbeClassifier(C=1.0), X, y, cv=3).mean()) > 0.9
True
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .linear import LinearProbe, ProbeConfig, fit_all_layers
from .report import main_split_xy


class ProbeClassifier(ClassifierMixin, BaseEstimator):
    """Logistic probe on standardised activations of one hook: ``fit(X [n, d], y [n])``.

    Minimises ``sum_i CE(W z_i + b, y_i) + ||W||^2 / (2 C)`` with ``z`` the activations
    standardised by the training mean and std (the objective of `fit_all_layers`); two classes use
    one logit, more a softmax. ``coef_`` / ``intercept_`` are in the raw activation space, so
    ``decision_function(X) = X @ coef_.T + intercept_``, as for scikit-learn's linear models.

    Parameters: ``hook`` names the hook the activations come from (kept in `to_probe`, e.g. for
    steering; it does not select anything), ``C`` the inverse L2 strength, ``max_iter`` and ``tol``
    the solver's budget, ``trainer`` ``"torch"`` (L-BFGS, the fast path's trainer) or ``"sklearn"``
    (``LogisticRegression`` per fit).

    Example::

        >>> import numpy as np
        >>> X = np.array([[0.0, 1.0], [0.2, 0.9], [1.0, 0.1], [0.9, 0.0]]); y = ["tails", "tails", "heads", "heads"]
        >>> clf = ProbeClassifier(hook="blocks.3.hook_resid_post", C=10.0).fit(X, y)
        >>> clf.classes_.tolist(), clf.predict([[0.95, 0.05]]).tolist()
        (['heads', 'tails'], ['heads'])
    """

    def __init__(self, hook: str | None = None, C: float = 1.0, max_iter: int = 300, tol: float = 1e-6,
                 trainer: str = "torch"):
        self.hook = hook
        self.C = C
        self.max_iter = max_iter
        self.tol = tol
        self.trainer = trainer

    def fit(self, X, y):
        """Fit on activations ``X [n, d]`` and labels ``y [n]`` (any hashable class values)."""
        if self.trainer not in ("torch", "sklearn"):
            raise ValueError(f"trainer={self.trainer!r} is unknown: use 'torch' or 'sklearn'")
        if not (isinstance(self.C, (int, float, np.number)) and self.C > 0):
            raise ValueError(f"C={self.C!r} must be a positive number (inverse L2 strength, e.g. 1.0)")
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32])
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"ProbeClassifier needs at least 2 classes in y; got 1 class "
                             f"({self.classes_[0]!r}). Probe a label that varies over the selected tokens.")
        config = ProbeConfig(C=float(self.C), max_iter=int(self.max_iter), tol=float(self.tol), trainer=self.trainer)
        probe = fit_all_layers(torch.tensor(X, dtype=torch.float32)[None], torch.tensor(codes),
                               hooks=[self.hook or "layer0"], n_classes=len(self.classes_), config=config)
        self.probe_ = probe
        self.n_iter_ = int(probe.meta.get("n_iter", 0))
        W = probe.W[0].double() / probe.std[0].double()[:, None]  # [d, K] weights on raw activations
        self.coef_ = W.T.numpy()  # [K, d], K = 1 for two classes
        self.intercept_ = (probe.b[0].double() - probe.mean[0].double() @ W).numpy()  # [K]
        return self

    def decision_function(self, X) -> np.ndarray:
        """Logits: ``[n]`` (log-odds of ``classes_[1]``) for two classes, else ``[n, n_classes]``."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32])
        z = np.asarray(X, dtype=np.float64) @ self.coef_.T + self.intercept_  # [n, K]
        return z[:, 0] if z.shape[1] == 1 else z

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities ``[n, n_classes]`` in the order of ``classes_``."""
        z = self.decision_function(X)
        if z.ndim == 1:
            p1 = 1.0 / (1.0 + np.exp(-z))  # [n]
            return np.stack([1.0 - p1, p1], axis=1)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def predict_log_proba(self, X) -> np.ndarray:
        return np.log(self.predict_proba(X))

    def predict(self, X) -> np.ndarray:
        z = self.decision_function(X)
        idx = (z > 0).astype(int) if z.ndim == 1 else z.argmax(axis=1)
        return self.classes_[idx]

    def to_probe(self) -> LinearProbe:
        """The fitted probe as a `LinearProbe` (class ``i`` = ``classes_[i]``), e.g. for steering."""
        check_is_fitted(self)
        return self.probe_


def hook_xy(store, hook: str, label: str, positions: str = "auto"):
    """``(X [n, d], y [n], groups [n])`` of one hook of an `ActivationStore`: the rows `beliefscope probe`
    cross-validates for `label` (tokens chosen by ``positions``, as its ``--positions``: auto is labelled for your
    data and after_first_event for a task; its main split, without held-out records or lengths), sorted by
    (prompt, position), with each row's group for ``GroupKFold`` (the data's group where it has one, else the
    prompt): the same groups, folds and rows as the command line.

    Usage (not run as a doctest: it needs stored activations)::

        X, y, groups = hook_xy(store, "blocks.3.hook_resid_post", "state")
        cross_val_score(ProbeClassifier(), X, y, groups=groups, cv=GroupKFold(5))
    """

    store.check_hook(hook)
    store.check_label(label)
    return main_split_xy(store, hook, label, positions)
