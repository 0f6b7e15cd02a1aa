"""The subspace an interchange or an erasure acts in, per site: the whole activation, a probe's class
directions, a random subspace of a given rank, or a given basis. Every basis is ``[d, k]`` with orthonormal
columns (a QR of what was given), so that ``a + (s - a) Q Qᵀ`` replaces exactly the part of ``a`` in it.

>>> import torch
>>> Q = orthonormal(torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]))
>>> bool(torch.allclose(Q.T @ Q, torch.eye(2), atol=1e-6))
True
"""

from __future__ import annotations

import re

import torch


def orthonormal(B: torch.Tensor) -> torch.Tensor:
    """``[d, k]`` orthonormal columns spanning ``B [d, k]`` (reduced QR in float64); refuses a rank-deficient B."""
    Q, R = torch.linalg.qr(B.double())
    diag = R.diagonal().abs()
    if len(diag) and float(diag.min()) <= 1e-10 * float(diag.max()):
        raise ValueError(f"the basis of {B.shape[1]} columns spans fewer dimensions than it has columns: give "
                         "linearly independent columns")
    return Q.float()


def random_basis(d: int, k: int, seed: int) -> torch.Tensor:
    """``[d, k]``: a uniformly random rank-k subspace (QR of a Gaussian matrix drawn on the host, seeded)."""
    g = torch.Generator().manual_seed(seed)
    return orthonormal(torch.randn(d, k, generator=g, dtype=torch.float64))


def probe_basis(probe, hook: str) -> torch.Tensor:
    """``[d, k]``: the span of the probe's class directions at ``hook`` in activation space (its weights over the
    standardising scale), k = 1 for two classes, else n_classes - 1 (logits are defined up to a shared shift)."""
    i = probe._index(hook)
    W = probe.W[i].double() / probe.std[i].double()[:, None]  # [d, K]
    if probe.n_classes > 2:
        W = W - W.mean(1, keepdim=True)
        U, S, _ = torch.linalg.svd(W, full_matrices=False)
        return U[:, : probe.n_classes - 1].float()
    return orthonormal(W)


def site_bases(model, site_list, subspace, probe=None, seed: int = 0) -> tuple[dict, str]:
    """``({site: [d, k] or None}, label)`` for ``subspace`` (see `analyses.interchange.interchange`); refuses
    a rank above d_model, a probe missing, or a probe of another width, before any forward."""
    d = int(model.cfg.d_model)
    if subspace is None or subspace == "full":
        return {s: None for s in site_list}, "full"
    if isinstance(subspace, str) and subspace == "probe":
        if probe is None:
            raise ValueError("subspace='probe' needs probe=: pass the LinearProbe trained on this model's "
                             "activations at these hooks")
        if probe.d_model != d:
            raise ValueError(f"the probe has width {probe.d_model} and the model d_model {d}: it was trained on "
                             "another model")
        missing = sorted({s.hook for s in site_list if s.hook not in probe.hooks})
        if missing:
            raise ValueError(f"the probe has no layer at {missing[:3]}: its hooks are {probe.hooks[:3]}..., choose "
                             "sites at those hooks or train probes there")
        bases = {s: probe_basis(probe, s.hook) for s in site_list}
        return bases, f"probe:{next(iter(bases.values())).shape[1]}"
    if isinstance(subspace, str):
        m = re.fullmatch(r"random:(\d+)", subspace)
        if not m:
            raise ValueError(f"subspace {subspace!r} is unknown: use None (the whole activation), 'probe', "
                             "'random:K', a [d_model, K] tensor, or {site: tensor} (DAS)")
        k = int(m.group(1))
        _check_rank(k, d)
        return {s: random_basis(d, k, seed * 100_003 + j) for j, s in enumerate(site_list)}, f"random:{k}"
    if torch.is_tensor(subspace):
        _check_shape(subspace, d)
        Q = orthonormal(subspace)
        return {s: Q for s in site_list}, f"basis:{Q.shape[1]}"
    if isinstance(subspace, dict):
        if missing := [s for s in site_list if s not in subspace]:
            raise ValueError(f"the subspace dictionary has no basis for {len(missing)} site(s), e.g. {missing[0]}")
        for Q in subspace.values():
            _check_shape(Q, d)
        ks = sorted({int(subspace[s].shape[1]) for s in site_list})
        return {s: orthonormal(subspace[s]) for s in site_list}, f"basis:{ks[0] if len(ks) == 1 else ks}"
    raise TypeError(f"subspace of type {type(subspace).__name__} is not understood: use None, 'probe', 'random:K', "
                    "a tensor or a dict of tensors")


def _check_rank(k: int, d: int) -> None:
    if not 1 <= k <= d:
        raise ValueError(f"a subspace of rank {k} does not fit a residual of d_model={d}: choose 1 <= k <= {d}")


def _check_shape(Q: torch.Tensor, d: int) -> None:
    if Q.ndim != 2 or Q.shape[0] != d:
        raise ValueError(f"a basis of shape {list(Q.shape)} does not fit a residual of d_model={d}: give [d_model, k]")
    _check_rank(int(Q.shape[1]), d)
