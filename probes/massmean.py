"""Mass-mean probes (Marks & Tegmark 2024, "The Geometry of Truth"): the direction from one class's mean
activation to the other's, thresholded half way, with no optimisation. Beside a logistic probe it says how
much of a reading lies along the plain difference of means, which Marks & Tegmark found generalises better
across datasets and is more causally implicated than the logistic direction.

Two classes: ``theta = mu_1 - mu_0`` and class 1 where ``theta . (x - (mu_0 + mu_1) / 2) > 0``. More classes:
one direction per class against the rest, and the class with the largest such score.

>>> X = torch.tensor([[[0., 0.], [0., 1.], [4., 0.], [4., 1.]]]); y = np.array([0, 0, 1, 1])
>>> folds = [(np.array([0, 2]), np.array([1, 3])), (np.array([1, 3]), np.array([0, 2]))]
>>> mass_mean_oof(X, y, folds, 2).tolist()
[[0, 0, 1, 1]]
"""

from __future__ import annotations

import numpy as np
import torch


def mass_mean_scores(X: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """Scores ``[L, n, K]`` of activations ``X [L, n, d]`` under class means ``mu [L, K, d]`` (one-vs-rest)."""
    K = mu.shape[1]
    if K == 2:
        theta = mu[:, 1] - mu[:, 0]  # [L, d]
        s = torch.einsum("lnd,ld->ln", X - (mu[:, 0] + mu[:, 1])[:, None] / 2, theta)
        return torch.stack([-s, s], dim=-1)
    rest = (mu.sum(1, keepdim=True) - mu) / (K - 1)  # [L, K, d] mean of the other classes' means
    theta, mid = mu - rest, (mu + rest) / 2
    return torch.einsum("lnd,lkd->lnk", X, theta) - (mid * theta).sum(-1)[:, None, :]


def class_means(X: torch.Tensor, y, K: int) -> torch.Tensor:
    """Per-class mean activations ``[L, K, d]`` (a class without rows gets the overall mean)."""
    y = torch.as_tensor(np.asarray(y))
    overall = X.double().mean(1)
    out = []
    for k in range(K):
        rows = y == k
        out.append(X[:, rows].double().mean(1) if rows.any() else overall)
    return torch.stack(out, 1).float()


def mass_mean_oof(X, y, folds, K: int) -> np.ndarray:
    """Out-of-fold predictions ``[L, n]`` of mass-mean probes, fitted on each fold's training rows."""
    X = torch.as_tensor(X, dtype=torch.float32)
    y = np.asarray(y)
    pred = np.full((X.shape[0], X.shape[1]), -1, dtype=np.int64)
    for train, test in folds:
        mu = class_means(X[:, torch.as_tensor(train)], y[train], K)
        pred[:, test] = mass_mean_scores(X[:, torch.as_tensor(test)], mu).argmax(-1).numpy()
    return pred
