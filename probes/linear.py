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
import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from beliefscope.base.files import atomic_save, atomic_write_json

from .data import load_probe_data
from .store import ActivationStore
from .twin import checkpoint_hash

POLISH_STEPS = 20  # most unit L-BFGS steps after the line search stalls (solve_problems)


@dataclass
class ProbeConfig:
    """How probes are fitted."""

    C: float = 1.0  # inverse L2 strength (scikit-learn convention: larger = weaker penalty)
    max_iter: int = 300  # L-BFGS iterations (torch) / solver iterations (scikit-learn)
    tol: float = 1e-6  # scikit-learn tolerance; torch stops on a gradient (max |g|) below tol / 10 or a null step
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
    folder: str = field(default="", compare=False)  # the folder it was loaded from ("": fitted in memory); not saved

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
        dev = X.device  # the probe's few numbers go to the activations, not the activations to the host
        z = ((X.float() - self.mean[i].to(dev)) / self.std[i].to(dev)) @ self.W[i].to(dev) + self.b[i].to(dev)  # [n, K]
        return torch.cat([torch.zeros_like(z), z], dim=1) if self.n_classes == 2 else z

    def predict(self, X: torch.Tensor, hook: str) -> torch.Tensor:
        return self.logits(X, hook).argmax(dim=1)

    def accuracy(self, X: torch.Tensor, y, hook: str) -> float:
        pred = self.predict(X, hook)
        return float((pred == torch.as_tensor(y).to(pred.device)).float().mean())

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
        return cls(hooks=hooks, mean=t["mean"], std=t["std"], W=t["W"], b=t["b"], n_classes=n_classes, meta=meta,
                   folder=os.path.abspath(folder))


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
                   meta: dict | None = None, model=None) -> LinearProbe | list[LinearProbe]:
    """Fit one probe per layer. `X` is ``[L, N, d]``, a callable yielding chunks (torch only), or an
    `ActivationStore` with `y` a label name (every hook, tokens after the first event).

    The probe carries its model's identity where it can be known: a store stamps its own (its model, hash and
    harvest config, with the checkpoint hash), and `model` (the bridge the activations came from) stamps its
    checkpoint hash on a fit from arrays. The analyses then refuse to read it on another model of the same width.

    `groups [N]` (torch only) assigns rows to `n_groups` position classes and fits a separate
    probe for each class in the same run; then a list of `n_groups` probes is returned.

    >>> X = torch.randn(2, 100, 4); y = (X[0, :, 1] > 0).long()
    >>> fit_all_layers(X, y, trainer="sklearn").hooks
    ['layer0', 'layer1']
    """

    if isinstance(X, ActivationStore):
        store, label = X, y
        data = load_probe_data(store, "after_first_event", store.hooks)
        store.check_label(label)
        X, y, hooks = data.X, data.labels[label], hooks or data.hooks
        meta = {"label": label, "store_hash": store.hash, "model": store.manifest["model"]["id"],
                "harvest_config": store.manifest["config"], **(meta or {})}
    if model is not None:

        meta = dict(meta or {})
        meta["harvest_config"] = {**(meta.get("harvest_config") or {}), "checkpoint_hash": checkpoint_hash(model)}
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


def fit_problems(X, Y, M, *, hooks: list[str], n_classes: int, config: ProbeConfig | None = None,
                 meta: dict | None = None) -> list[LinearProbe]:
    """Independent torch probes on row subsets of the same activations ``X [L, n, d]``, in one L-BFGS
    run: problem p is fitted on rows ``M [P, n]`` (bool) with labels ``Y [P, n]``, standardised by its
    own rows' moments, exactly as ``fit_all_layers(X[:, M[p]], Y[p, M[p]])`` would fit it. Stack the
    training rows of every cross-validation fold, of a control task and of the final fit, and the
    activations are read once per step for all of them. Returns one `LinearProbe` per problem.

    >>> X = torch.randn(1, 300, 6); y = (X[0, :, 0] > 0).long()
    >>> M = torch.stack([torch.arange(300) % 2 == 0, torch.ones(300, dtype=torch.bool)])
    >>> a, b = fit_problems(X, y.expand(2, -1), M, hooks=["h"], n_classes=2)
    >>> a.accuracy(X[0, 1::2], y[1::2], "h") > 0.9
    True
    """
    cfg = config or ProbeConfig()
    X = torch.as_tensor(X, dtype=torch.float32)
    Y, M = torch.as_tensor(Y, dtype=torch.long), torch.as_tensor(M, dtype=torch.bool)
    L, _, d = X.shape
    if Y.shape != M.shape or Y.shape[1] != X.shape[1]:
        raise ValueError(f"labels {list(Y.shape)} and rows {list(M.shape)} must both be [problems, {X.shape[1]}]")
    mean, std, _ = _moments(lambda: iter([(X, None, None)]), L, d)
    Mf = M.double()
    cnt = Mf.sum(1).clamp_min(1)[None, :, None]  # [1, P, 1]
    Xd = X.double()
    p_mean = torch.einsum("pn,lnd->lpd", Mf, Xd) / cnt  # [L, P, d]
    p_var = torch.einsum("pn,lnd->lpd", Mf, Xd * Xd) / cnt - p_mean * p_mean
    del Xd
    p_std = p_var.clamp_min(0).sqrt()
    p_std = torch.where(p_std > 1e-6, p_std, torch.ones_like(p_std)).float()
    W, b, n_iter = solve_problems(lambda: iter([(X, Y, M)]), mean, std, p_mean.float(), p_std, n_classes, cfg)
    meta = {**(meta or {}), "trainer": "torch", "C": cfg.C, "n_iter": n_iter}
    return [LinearProbe(hooks=list(hooks), mean=p_mean[:, p].float().contiguous(), std=p_std[:, p].contiguous(),
                        W=W[:, p].contiguous(), b=b[:, p].contiguous(), n_classes=max(n_classes, 2), meta=dict(meta))
            for p in range(len(Y))]


def _fit_torch(chunks, mean, std, n, n_classes, K, n_groups, cfg):
    """Position classes as problems of `solve_problems`: class k's rows, standardised with every row's moments."""
    def problems():
        for X, y, g in chunks():
            yield X, y.expand(n_groups, -1), torch.stack([g == k for k in range(n_groups)])

    W, b, n_iter = solve_problems(problems, mean, std, mean.expand(n_groups, -1, -1).transpose(0, 1),
                                  std.expand(n_groups, -1, -1).transpose(0, 1), n_classes, cfg)
    return W, b, n_iter  # [L, G, d, K], [L, G, K]


def solve_problems(problems, mean, std, p_mean, p_std, n_classes, cfg):
    """Fit ``P`` independent logistic problems per layer in one L-BFGS run over shared activations.

    ``problems()`` yields chunks ``(X [L, n, d], Y [P, n] labels, M [P, n] bool rows)``: problem p is
    fitted on its rows M[p] with labels Y[p], on features standardised by its own ``p_mean / p_std
    [L, P, d]`` (scikit-learn's objective on the problem's own standardised rows). ``mean / std [L, d]``
    standardise the shared activations once; each problem's features are an affine map of those, so
    one matmul serves every problem (cross-validation folds, control labels and the final fit read
    the activations once per step).

    The weights are preconditioned with the curvature of the logistic loss at zero,
    ``Sigma / 4 + I / (C n)`` (Sigma the covariance of the standardised activations): the objective and
    its optimum are unchanged, and L-BFGS needs a few dozen steps instead of hundreds.
    Returns ``(W [L, P, d, K], b [L, P, K], n_iter)`` in each problem's standardised space."""
    L, d = mean.shape
    K = 1 if n_classes == 2 else n_classes
    S = torch.zeros(L, d, d, dtype=torch.float64)
    counts = None
    for X, _, M in problems():
        Z = (X.float() - mean[:, None]) / std[:, None]  # [L, n, d]
        S += torch.einsum("lnd,lne->lde", Z, Z).double()
        c = M.sum(1).double()
        counts = c if counts is None else counts + c
    n = float(counts.max())
    lam, U = torch.linalg.eigh(S / max(n, 1))
    precond = (U * (lam.clamp_min(0) / 4 + 1 / (cfg.C * n)).rsqrt()[:, None, :]).float()  # [L, d, d]
    n_p = counts.clamp_min(1).float()  # [P] rows of each problem
    Pn = len(n_p)
    ratio = (std[:, None] / p_std)  # [L, P, d]: problem p's features = Z * ratio + shift
    shift = (mean[:, None] - p_mean) / p_std  # [L, P, d]
    V = torch.zeros(L, d, Pn * K, requires_grad=True)  # [L, d, P*K] preconditioned weights
    b = torch.zeros(L, Pn, K, requires_grad=True)  # [L, P, K]
    # stop when a step lowers the summed objective by less than `tol` of its value at zero (every problem starts
    # at log K per row), or the gradient is below tol / 10; then polish (below)
    start = L * Pn * (math.log(2) if K == 1 else math.log(K))
    opt = torch.optim.LBFGS([V, b], lr=1, max_iter=cfg.max_iter, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=cfg.tol / 10, tolerance_change=cfg.tol * start)
    cached = [((X.float() - mean[:, None]) / std[:, None], Y, M) for X, Y, M in problems()] \
        if sum(1 for _ in problems()) == 1 else None

    def standardised():
        if cached is not None:
            return iter(cached)
        return (((X.float() - mean[:, None]) / std[:, None], Y, M) for X, Y, M in problems())

    def closure():
        opt.zero_grad()
        W = (precond @ V).view(L, d, Pn, K)  # [L, d, P, K] in each problem's standardised space
        We = W * ratio.transpose(1, 2)[..., None]  # [L, d, P, K] on the shared standardised activations
        be = b + torch.einsum("lpd,ldpk->lpk", shift, W)  # [L, P, K]
        total = 0.0
        for Z, Y, M in standardised():  # Z: [L, n, d]
            z = torch.einsum("lnd,ldq->lnq", Z, We.reshape(L, d, Pn * K)).view(L, -1, Pn, K) + be[:, None]
            w = (M.float() / n_p[:, None]).T  # [n, P] row weight in each problem
            if K == 1:
                ce = torch.nn.functional.binary_cross_entropy_with_logits(
                    z[..., 0], Y.T.float().expand(L, -1, -1), reduction="none")  # [L, n, P]
            else:
                ce = torch.nn.functional.cross_entropy(z.reshape(-1, K), Y.T.reshape(-1).repeat(L).clamp_min(0),
                                                       reduction="none").view(L, -1, Pn)
            loss = (ce * w).sum()
            loss.backward(retain_graph=True)
            total += float(loss.detach())
        reg = ((W * W).sum((1, 3)) / (2 * cfg.C * n_p)).sum()
        reg.backward()
        return torch.tensor(total + float(reg.detach()))

    opt.step(closure)
    n_iter = int(opt.state[V].get("n_iter", 0))
    if float(max(V.grad.abs().max(), b.grad.abs().max())) > cfg.tol / 10 and n_iter < cfg.max_iter:
        # The line search stopped on a small change of the loss, or on a step it could not tell from no step:
        # near the optimum a float32 loss no longer resolves the decrease, though its gradient still does, and
        # where that happens depends on the summation order of the CPU's kernels (a stop there left weights
        # about 2e-3 from the optimum, and two machines 3e-3 apart). Finish with at most POLISH_STEPS unit
        # L-BFGS steps (no line search: in the preconditioned space the curvature is at most about 1, so a unit
        # step cannot overshoot), stopping on the gradient alone.
        opt = torch.optim.LBFGS([V, b], lr=1, max_iter=min(POLISH_STEPS, cfg.max_iter - n_iter), history_size=20,
                                tolerance_grad=cfg.tol / 10, tolerance_change=0.0)
        opt.step(closure)
        n_iter += int(opt.state[V].get("n_iter", 0))
    W = (precond @ V.detach()).view(L, d, Pn, K).permute(0, 2, 1, 3).contiguous()  # [L, P, d, K]
    return W, b.detach(), n_iter


def _fit_sklearn(X, y, mean, std, n_classes, cfg):
    from sklearn.linear_model import LogisticRegression  # deferred: scikit-learn (1 s) loads for a fit only

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
