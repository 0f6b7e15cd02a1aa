"""Linear (logistic) probes for every layer, with a scikit-learn reference and a batched torch trainer.

Both trainers minimise the same objective per layer on standardised features::

    sum_i CE(W x_i + b, y_i) + ||W||^2 / (2 C)          (scikit-learn's convention)

Two classes use one logit (binary logistic, as scikit-learn does); more use a softmax. The torch
trainer stacks all layers (and optional position classes) into ``W [L, G, d, K]`` and runs one
full-batch L-BFGS; the problems are independent, so the joint optimum is each layer's optimum.
Data can be given in memory or as a callable yielding chunks (one shard at a time), in which
case every L-BFGS closure streams the chunks and accumulates loss and gradients.

>>> X = torch.randn(3, 200, 8); y = (X[1, :, 0] > 0).long()
>>> probe = fit_all_layers(X, y, hooks=["a", "b", "c"], trainer="torch")
>>> float(probe.accuracy(X[1], y, "b")) > 0.9
True
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from beliefscope.files import atomic_save, atomic_write_json


@dataclass
class ProbeConfig:
    """How probes are fitted."""

    C: float = 1.0  # inverse L2 strength (scikit-learn convention: larger = weaker penalty)
    max_iter: int = 300  # L-BFGS iterations (torch) / solver iterations (scikit-learn)
    tol: float = 1e-6  # scikit-learn tolerance; torch stops on gradient < tol / 10
    trainer: str = "torch"  # "torch" (all layers in one run) or "sklearn" (one fit per layer)


@dataclass
class LinearProbe:
    """Per-hook logistic probes on standardised activations."""

    hooks: list[str]  # hook name of each probe layer (store order)
    mean: torch.Tensor  # [L, d] feature means used for standardising
    std: torch.Tensor  # [L, d] feature standard deviations
    W: torch.Tensor  # [L, d, K] weights (K = 1 for two classes)
    b: torch.Tensor  # [L, K] biases
    n_classes: int  # number of label values
    meta: dict = field(default_factory=dict)  # label, store hash, resid norms, trainer, ...

    @property
    def d_model(self) -> int:
        return int(self.W.shape[1])

    def _index(self, hook: str) -> int:
        if hook not in self.hooks:
            raise KeyError(f"this probe has no layer {hook!r}; it was trained on {self.hooks}")
        return self.hooks.index(hook)

    def logits(self, X: torch.Tensor, hook: str) -> torch.Tensor:
        """Class logits ``[n, n_classes]`` for activations ``X [n, d]`` at `hook`."""
        i = self._index(hook)
        if X.ndim != 2 or X.shape[1] != self.d_model:
            raise ValueError(f"probe for {hook} expects activations [n, {self.d_model}], got {list(X.shape)}: "
                             "was it trained on another model or hook?")
        z = ((X.float() - self.mean[i]) / self.std[i]) @ self.W[i] + self.b[i]  # [n, K]
        return torch.cat([torch.zeros_like(z), z], dim=1) if self.n_classes == 2 else z

    def predict(self, X: torch.Tensor, hook: str) -> torch.Tensor:
        return self.logits(X, hook).argmax(dim=1)

    def accuracy(self, X: torch.Tensor, y, hook: str) -> float:
        return float((self.predict(X, hook) == torch.as_tensor(y)).float().mean())

    def direction(self, hook: str, toward: int, away: int) -> torch.Tensor:
        """Unit vector in activation space that raises class `toward` over `away` (``[d]``)."""
        i = self._index(hook)
        Wf = self.W[i] if self.n_classes > 2 else torch.cat([torch.zeros_like(self.W[i]), self.W[i]], 1)
        v = (Wf[:, toward] - Wf[:, away]) / self.std[i]  # the gradient of the logit gap w.r.t. x
        return v / v.norm()

    def save(self, folder: str) -> None:
        """Write ``probe.safetensors`` and ``probe.json`` (atomically) into `folder`."""
        os.makedirs(folder, exist_ok=True)
        tensors = {"mean": self.mean, "std": self.std, "W": self.W, "b": self.b}
        atomic_save(os.path.join(folder, "probe.safetensors"), lambda tmp: save_file(tensors, tmp))
        atomic_write_json(os.path.join(folder, "probe.json"),
                          {"hooks": self.hooks, "n_classes": self.n_classes, "d_model": self.d_model, **self.meta})

    @classmethod
    def load(cls, folder: str) -> LinearProbe:
        paths = [os.path.join(folder, f) for f in ("probe.json", "probe.safetensors")]
        for p in paths:
            if not os.path.exists(p):
                raise FileNotFoundError(f"{p} is missing: train probes with `beliefscope probe --out {folder}`")
        with open(paths[0]) as f:
            meta = json.load(f)
        t = load_file(paths[1])
        if t["W"].shape[1] != meta["d_model"] or t["W"].shape[0] != len(meta["hooks"]):
            raise ValueError(f"{paths[1]} does not match {paths[0]} (width or layer count differs)")
        hooks, n_classes = meta.pop("hooks"), meta.pop("n_classes")
        meta.pop("d_model")
        return cls(hooks=hooks, mean=t["mean"], std=t["std"], W=t["W"], b=t["b"], n_classes=n_classes, meta=meta)


def _as_chunks(X, y, groups=None):
    """Normalise inputs to a zero-argument callable yielding ``(X [L, n, d], y [n], g [n])``."""
    if callable(X):
        return X
    X = torch.as_tensor(X, dtype=torch.float32)
    y = torch.as_tensor(np.asarray(y), dtype=torch.long)
    g = torch.zeros_like(y) if groups is None else torch.as_tensor(np.asarray(groups), dtype=torch.long)
    return lambda: iter([(X, y, g)])


def _moments(chunks, L, d):
    """Streaming mean and std per layer (float64 accumulators). Returns ([L, d], [L, d], n)."""
    s = torch.zeros(L, d, dtype=torch.float64)
    s2 = torch.zeros(L, d, dtype=torch.float64)
    n = 0
    for X, _, _ in chunks():
        X = X.double()
        s += X.sum(1)
        s2 += (X * X).sum(1)
        n += X.shape[1]
    mean = s / n
    std = (s2 / n - mean * mean).clamp_min(0).sqrt()
    return mean.float(), torch.where(std > 1e-6, std, torch.ones_like(std)).float(), n


def fit_all_layers(X, y=None, *, hooks: list[str] | None = None, n_classes: int | None = None,
                   groups=None, n_groups: int = 1, trainer: str = "torch", config: ProbeConfig | None = None,
                   meta: dict | None = None) -> LinearProbe | list[LinearProbe]:
    """Fit one probe per layer. `X` is ``[L, N, d]``, a callable yielding chunks (torch only), or an
    `ActivationStore` with `y` a label name (every hook, tokens after the first event).

    `groups [N]` (torch only) assigns rows to `n_groups` position classes and fits a separate
    probe for each class in the same run; then a list of `n_groups` probes is returned.

    >>> X = torch.randn(2, 100, 4); y = (X[0, :, 1] > 0).long()
    >>> fit_all_layers(X, y, trainer="sklearn").hooks
    ['layer0', 'layer1']
    """
    from beliefscope.probes.store import ActivationStore

    if isinstance(X, ActivationStore):
        from beliefscope.probes.data import load_probe_data

        data = load_probe_data(X, "after_first_event", X.hooks)
        X.check_label(y)
        X, y, hooks = data.X, data.labels[y], hooks or data.hooks
    cfg = config or ProbeConfig(trainer=trainer)
    trainer = trainer if config is None else cfg.trainer
    if trainer not in ("torch", "sklearn"):
        raise ValueError(f"trainer {trainer!r} is unknown: use 'torch' or 'sklearn'")
    chunks = _as_chunks(X, y, groups)
    X0, y0, _ = next(chunks())
    L, d = X0.shape[0], X0.shape[2]
    hooks = hooks or [f"layer{i}" for i in range(L)]
    if len(hooks) != L:
        raise ValueError(f"{len(hooks)} hook names for {L} layers")
    if n_classes is None:
        n_classes = int(max(int(c[1].max()) for c in chunks())) + 1
    n_classes = max(n_classes, 2)
    mean, std, n = _moments(chunks, L, d)
    K = 1 if n_classes == 2 else n_classes
    meta = {**(meta or {}), "trainer": trainer, "C": cfg.C}
    if trainer == "sklearn":
        if n_groups != 1 or callable(X):
            raise ValueError("the scikit-learn trainer takes in-memory data with one position class")
        W, b, meta["n_iter"] = _fit_sklearn(X0, y0, mean, std, n_classes, cfg)
        return LinearProbe(hooks=list(hooks), mean=mean, std=std, W=W, b=b, n_classes=n_classes, meta=meta)
    W, b, meta["n_iter"] = _fit_torch(chunks, mean, std, n, n_classes, K, n_groups, cfg)
    probes = [LinearProbe(hooks=list(hooks), mean=mean, std=std, W=W[:, g].contiguous(), b=b[:, g].contiguous(),
                          n_classes=n_classes, meta=dict(meta, position_class=g)) for g in range(n_groups)]
    return probes[0] if n_groups == 1 else probes


def _loss(z, y, n_classes):
    """Summed cross-entropy of logits ``z [L, n, K]`` against ``y [n]``."""
    if n_classes == 2:
        target = y.float().expand(z.shape[0], -1)
        return torch.nn.functional.binary_cross_entropy_with_logits(z[..., 0], target, reduction="sum")
    return torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), y.repeat(z.shape[0]), reduction="sum")


def _fit_torch(chunks, mean, std, n, n_classes, K, n_groups, cfg):
    L, d = mean.shape
    W = torch.zeros(L, n_groups, d, K, requires_grad=True)  # [L, G, d, K]
    b = torch.zeros(L, n_groups, K, requires_grad=True)  # [L, G, K]
    opt = torch.optim.LBFGS([W, b], lr=1, max_iter=cfg.max_iter, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=cfg.tol / 10, tolerance_change=1e-12)

    streamed = sum(1 for _ in chunks()) > 1
    cached = None if streamed else [((X.float() - mean[:, None]) / std[:, None], y, g) for X, y, g in chunks()]

    def standardised():
        if cached is not None:
            return iter(cached)
        return (((X.float() - mean[:, None]) / std[:, None], y, g) for X, y, g in chunks())

    def closure():
        opt.zero_grad()
        total = 0.0
        for Z, y, g in standardised():  # Z: [L, n, d] standardised activations
            for k in range(n_groups):
                rows = g == k
                if rows.any():
                    z = torch.einsum("lnd,ldk->lnk", Z[:, rows], W[:, k]) + b[:, k, None]  # [L, n_k, K]
                    loss = _loss(z, y[rows], n_classes) / n
                    loss.backward()
                    total += float(loss.detach())
        reg = (W * W).sum() / (2 * cfg.C * n)
        reg.backward()
        return torch.tensor(total + float(reg.detach()))

    opt.step(closure)
    n_iter = int(opt.state[opt.param_groups[0]["params"][0]].get("n_iter", 0))
    return W.detach(), b.detach(), n_iter


def _fit_sklearn(X, y, mean, std, n_classes, cfg):
    from sklearn.linear_model import LogisticRegression

    L, _, d = X.shape
    K = 1 if n_classes == 2 else n_classes
    W, b = torch.zeros(L, d, K), torch.zeros(L, K)
    yn = y.numpy()
    n_iter = 0
    for i in range(L):
        Z = ((X[i] - mean[i]) / std[i]).numpy().astype(np.float64)
        clf = LogisticRegression(C=cfg.C, max_iter=cfg.max_iter * 5, tol=cfg.tol).fit(Z, yn)
        if len(clf.classes_) != n_classes:
            raise ValueError(f"training labels hold classes {clf.classes_.tolist()} of {n_classes}: "
                             "every class must occur in the training rows")
        coef = torch.as_tensor(clf.coef_, dtype=torch.float32)  # [K, d]
        icpt = torch.as_tensor(clf.intercept_, dtype=torch.float32)  # [K]
        W[i], b[i] = coef.T, icpt
        n_iter = max(n_iter, int(np.max(clf.n_iter_)))
    return W, b, n_iter
