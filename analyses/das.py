"""Distributed alignment search (DAS; Geiger et al. 2023): learn, per site, the rank-k subspace whose
interchange moves the answer to the counterfactual one, on training pairs; score IIA on held-out pairs.

The subspace is ``Q [d, k]`` with orthonormal columns (PyTorch's orthogonal parametrization of a ``[k, d]``
map), trained by cross-entropy of the intervened answer over the class words against the counterfactual
class, the model frozen: gradients are taken with respect to Q alone (`torch.autograd.grad`), so nothing
accumulates on the model's parameters. Pairs are split by base story (hash of its unit), so no base story is
both trained and scored on. A DAS IIA means little alone: it is reported beside the probe's subspace and a
random subspace of the same rank (`analyses.interchange_report`), since a rank-k subspace of a wide residual
can often be fitted to move an answer (Makelov et al. 2023 show such illusory subspaces).

>>> cfg = DasConfig(rank=1, steps=2)
>>> cfg.rank, split_pairs.__name__
(1, 'split_pairs')
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from .interchange import (
    Site,
    check_inputs,
    last_logits_grad,
    patch_hooks,
    prepare,
    source_activations,
)
from .patching import Prefilled, resumed_logits_grad

MAX_PREFILL_BYTES = 2 * 2 ** 30  # the training bases' clean caches DAS keeps; past it, every step runs whole stories


@dataclass(frozen=True)
class DasConfig:
    """How a DAS subspace is trained at each site."""

    rank: int = 1  # k, the dimensions of the learned subspace
    steps: int = 100  # optimiser steps per site
    lr: float = 0.01  # Adam learning rate of the rotation's parameters
    batch_size: int = 16  # pairs per step
    heldout_share: float = 0.5  # share of base stories whose pairs are held out for scoring
    seed: int = 0  # initial rotation, batch order and split


def split_pairs(pairs: list, heldout_share: float, seed: int = 0) -> tuple[list, list]:
    """(train, held-out) by base story: a story's pairs all fall on one side (sha256 of seed and its unit)."""
    if not 0 < heldout_share < 1:
        raise ValueError(f"heldout_share={heldout_share} must lie strictly between 0 and 1")

    def held(p) -> bool:
        h = hashlib.sha256(f"{seed}/{p.unit}".encode()).digest()
        return int.from_bytes(h[:8], "big") / 2 ** 64 < heldout_share

    train, test = [p for p in pairs if not held(p)], [p for p in pairs if held(p)]
    if not train or not test:
        raise ValueError(f"{len(pairs)} pairs from {len({p.unit for p in pairs})} base stories leave one side of a "
                         f"{heldout_share:.0%} held-out split empty: give more pairs")
    return train, test


def learn_das(model, tok, pairs: list, site: Site, cfg: DasConfig = DasConfig(), progress=None) -> torch.Tensor:
    """``[d, k]`` the subspace learned at ``site`` on ``pairs`` (all of them: split before calling)."""
    d = int(model.cfg.d_model)
    if not 1 <= cfg.rank <= d:
        raise ValueError(f"DAS rank {cfg.rank} does not fit a residual of d_model={d}: choose 1 <= rank <= {d}")
    check_inputs(model, [site])
    prep = prepare(tok, pairs, [site])
    keep = np.nonzero(~prep.noop[:, 0] & (prep.target[:, 0] != prep.base_state))[0]
    if len(keep) == 0:
        raise ValueError(f"no training pair changes the answer at {site.hook} {site.position}: DAS has nothing to "
                         "learn from; choose a site after the stories differ")
    src = source_activations(model, prep, [site], cfg.batch_size)[:, 0]  # [P, d]
    train = [prep.base_ids[i] for i in keep]
    # each row resumes from its base's clean cache at the site: only the tokens from there on run forward and back
    base = Prefilled(model, train, prep.answer_ids, cfg.batch_size) \
        if Prefilled.nbytes(model, train) <= MAX_PREFILL_BYTES else None
    dev = next(model.parameters()).device
    torch.manual_seed(cfg.seed)
    rot = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(d, cfg.rank, bias=False)).to(dev)
    opt = torch.optim.Adam(rot.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(cfg.seed)
    params = list(rot.parameters())
    for _ in range(cfg.steps):
        sel = torch.randperm(len(keep), generator=g)[: cfg.batch_size].numpy()
        b = keep[sel]
        Q = rot.weight.T  # [d, k]
        starts = prep.pos_base[b, 0]  # [b] the site's token in each base
        zeros = np.zeros(len(b), dtype=np.int64)
        if base is not None:
            hooks = patch_hooks(zeros, zeros, src[torch.as_tensor(b)], [site], {site: Q})
            logits = resumed_logits_grad(model, base, sel, starts, [prep.base_ids[i][p:] for i, p in zip(b, starts)],
                                         hooks, prep.answer_ids)  # [b, C]
        else:
            hooks = patch_hooks(zeros, starts, src[torch.as_tensor(b)], [site], {site: Q})
            logits = last_logits_grad(model, [prep.base_ids[i] for i in b], prep.answer_ids, hooks)  # [b, C]
        loss = torch.nn.functional.cross_entropy(logits, torch.as_tensor(prep.target[b, 0]).to(logits.device))
        grads = torch.autograd.grad(loss, params)
        for p, gr in zip(params, grads):
            p.grad = gr
        opt.step()
        opt.zero_grad(set_to_none=True)
        if progress:
            progress(1)
    if base is not None:
        base.close()
    return rot.weight.detach().T.cpu().contiguous()
