"""The tuned lens (Belrose et al. 2023, arXiv 2303.08112): one learned affine translator per layer, so
that each layer's decoded distribution matches the model's final one.

Block ``l``'s residual ``h`` (``blocks.{l}.hook_resid_post``) is translated to ``h + h A_l + b_l`` and then
decoded like the logit lens (`probes.lens.LensDecoder`: the model's own final norm and unembedding).
As in the paper, every translator starts at the identity (``A = 0, b = 0``: the logit lens) and is trained
to minimise KL(final distribution || lens distribution), averaged over tokens. The last block's residual
*is* the final one, so its translator stays the identity. Training reads residuals captured once
(`hooks.capture`, one forward per text) and fits every layer at once from them; the model is never run
again (`probes.tuned_lens_store` fits the same translators from a harvest store's residuals, with no forward
at all). Held-out texts (whole texts, never tokens of a training text) give the KL table, tuned vs logit.

A lens is saved like a probe (a folder with ``tuned_lens.safetensors`` and ``tuned_lens.json`` carrying the
model's name and checkpoint hash) and is refused on another model (`TunedLens.check_model`).

The paper trains with SGD + Nesterov momentum on 2^18 tokens a step; with the few thousand tokens a CPU can
afford here, Adam with a linearly decaying rate converges in a few hundred steps (`TunedLensConfig`).

>>> import beliefscope as bs
>>> model, tok = bs.load_model("target")
>>> texts = [bs.get_task("coinflip").example(seed=s, n_events=4).prompt for s in range(12)]
>>> lens = train_tuned_lens(model, tok, texts, TunedLensConfig(steps=30, batch_tokens=64))
>>> kl = lens.meta["heldout_kl"]
>>> bool(sum(kl["tuned"]) < sum(kl["logit"]))  # held-out KL summed over layers falls
True
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from beliefscope.base.files import atomic_save, atomic_write_json

from ..models.profile import compute_device
from .lens import LensDecoder, read_residuals, residuals
from .twin import checkpoint_hash


@dataclass
class TunedLensConfig:
    """How a tuned lens is trained."""

    steps: int = 300  # optimiser steps (every layer is updated at every step)
    batch_tokens: int = 256  # training tokens per step, drawn at random from the captured ones (all layers read them)
    lr: float = 1e-3  # Adam learning rate, decayed linearly to 0 over the steps
    heldout: float = 0.2  # share of the texts held out (whole texts) for the KL table
    max_tokens: int = 40_000  # most training tokens captured (memory: n_layers x tokens x d_model float32)
    seed: int = 0  # the held-out split and the token draws


@dataclass
class TunedLens:
    """One affine translator per block: ``h -> h + h A[l] + b[l]`` before the model's own decoder."""

    A: torch.Tensor  # [L, d_model, d_model] translator weights (0: the identity, i.e. the logit lens)
    b: torch.Tensor  # [L, d_model] translator biases
    meta: dict = field(default_factory=dict)  # model, checkpoint_hash, config, training time, held-out KL table

    @property
    def n_layers(self) -> int:
        return int(self.A.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.A.shape[1])

    def translate(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """Block `layer`'s residuals ``h [..., d_model]`` as the final layer would hold them."""
        A, b = self.A[layer].to(h.device, h.dtype), self.b[layer].to(h.device, h.dtype)
        return h + h @ A + b

    def check_model(self, model, name: str = "") -> None:
        """Refuse a lens trained on another model: width, depth and checkpoint hash must match."""
        trained = self.meta.get("model", "?")
        name = name or getattr(model, "name_or_path", "") or "this model"
        fix = f"train a lens on it: beliefscope lens-train --model {name} --data FILE --out LENS"
        if (self.d_model, self.n_layers) != (model.cfg.d_model, model.cfg.n_layers):
            raise ValueError(f"the tuned lens was trained on {trained} ({self.n_layers} blocks of width "
                             f"{self.d_model}) but {name} has {model.cfg.n_layers} of width {model.cfg.d_model}: {fix}")
        want = self.meta.get("checkpoint_hash")
        if want and want != checkpoint_hash(model):
            raise ValueError(f"the tuned lens was trained on {trained} (checkpoint hash {want}) but {name} has other "
                             f"weights (hash {checkpoint_hash(model)}): {fix}")

    def save(self, folder: str) -> None:
        """Write ``tuned_lens.safetensors`` and ``tuned_lens.json`` (atomically) into `folder`."""
        os.makedirs(folder, exist_ok=True)
        tensors = {"A": self.A.contiguous(), "b": self.b.contiguous()}
        atomic_save(os.path.join(folder, "tuned_lens.safetensors"), lambda tmp: save_file(tensors, tmp))
        atomic_write_json(os.path.join(folder, "tuned_lens.json"), {**self.meta, "d_model": self.d_model,
                                                                      "n_layers": self.n_layers})

    @classmethod
    def load(cls, folder: str) -> TunedLens:
        paths = [os.path.join(folder, f) for f in ("tuned_lens.json", "tuned_lens.safetensors")]
        for p in paths:
            if not os.path.exists(p):
                raise FileNotFoundError(f"{p} is missing: train a tuned lens with `beliefscope lens-train --model M "
                                        f"--data FILE --out {folder}`")
        with open(paths[0]) as f:
            meta = json.load(f)
        t = load_file(paths[1])
        if tuple(t["A"].shape) != (meta["n_layers"], meta["d_model"], meta["d_model"]):
            raise ValueError(f"{paths[1]} does not match {paths[0]} (width or layer count differs)")
        return cls(A=t["A"], b=t["b"], meta=meta)


def check_config(cfg: TunedLensConfig, n_texts: int) -> None:
    """Refuse settings that cannot train or cannot hold out a text, before any forward."""
    for name in ("steps", "batch_tokens", "max_tokens"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} (--{name.replace('_', '-')}) must be at least 1, got {getattr(cfg, name)}")
    if not 0 < cfg.heldout < 1:
        raise ValueError(f"heldout (--heldout) must be a share between 0 and 1 (e.g. 0.2), got {cfg.heldout}")
    if n_texts < 2:
        raise ValueError(f"{n_texts} text(s): a tuned lens needs at least 2 (one held out for its KL table)")


def _capture(model, tok, texts, layers, max_tokens=None, progress=None) -> torch.Tensor:
    """Residuals ``[N, L, d]`` (float32, on the host) of every token of `texts` at every block."""
    rows, n = [], 0
    dev = compute_device(LensDecoder(model).unembed)
    for text in texts:
        ids = torch.as_tensor(tok(text)["input_ids"], dtype=torch.long)[None].to(dev)  # [1, T]
        resid, _ = residuals(model, ids, layers)  # [L, 1, T, d]
        rows.append(resid[:, 0].transpose(0, 1).float().cpu())  # [T, L, d]
        n += rows[-1].shape[0]
        if progress:
            progress(1)
        if max_tokens and n >= max_tokens:
            break
    return torch.cat(rows)[:max_tokens] if max_tokens else torch.cat(rows)


def _n_tokens(tok, texts) -> int:
    return sum(len(tok(t)["input_ids"]) for t in texts)


def heldout_kl(model, tok, texts, lenses: dict, layers) -> dict:
    """Mean KL(final || lens) in nats per block over every token of `texts`, for each of ``lenses`` (name ->
    a `TunedLens`, or None for the logit lens), from one forward per text."""
    decoder, n = LensDecoder(model), 0
    total = {k: np.zeros(len(layers)) for k in lenses}
    dev = compute_device(decoder.unembed)
    with torch.no_grad():
        for text in texts:
            ids = torch.as_tensor(tok(text)["input_ids"], dtype=torch.long)[None].to(dev)
            resid, logits = residuals(model, ids, layers)
            for k, lens in lenses.items():
                total[k] += read_residuals(decoder, resid[:, 0], logits[0], layers, lens=lens)["kl"].sum(1)
            n += ids.shape[1]
    return {k: [round(float(x), 4) for x in v / max(n, 1)] for k, v in total.items()}


def train_tuned_lens(model, tok, texts, config: TunedLensConfig | None = None, *, name: str = "",
                     progress=None) -> TunedLens:
    """Train a tuned lens of `model` on `texts` (strings); returns it with its held-out KL table in ``meta``.

    ``progress(n)`` is called as texts are captured and steps are taken (``len(texts) + steps`` in all)."""
    cfg = config or TunedLensConfig()
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    check_config(cfg, len(texts))
    held, train = split_heldout(len(texts), cfg)
    layers = list(range(model.cfg.n_layers))
    t0 = time.perf_counter()
    R = _capture(model, tok, [texts[i] for i in train], layers, cfg.max_tokens, progress)  # [N, L, d]
    t_capture = time.perf_counter() - t0
    lens, t_train, losses = fit_translators(model, R, cfg, progress)
    t2 = time.perf_counter()
    kl = heldout_kl(model, tok, [texts[i] for i in held], {"logit": None, "tuned": lens}, layers)
    lens.meta = _meta(model, name, cfg, layers, losses, R, kl, n_train=len(train), n_held=len(held),
                      heldout_tokens=_n_tokens(tok, [texts[i] for i in held]), capture_seconds=t_capture,
                      train_seconds=t_train, heldout_seconds=time.perf_counter() - t2)
    return lens


def split_heldout(n: int, cfg: TunedLensConfig) -> tuple[list[int], list[int]]:
    """(held-out, training) indices of `n` texts: a seeded permutation, whole texts held out."""
    order = np.random.default_rng(cfg.seed).permutation(n)
    n_held = max(1, int(round(cfg.heldout * n)))
    return [int(i) for i in order[:n_held]], [int(i) for i in order[n_held:]]


def fit_translators(model, R: torch.Tensor, cfg: TunedLensConfig, progress=None):
    """Fit every layer's translator at once from residuals ``R [N, L, d]`` (the last block's is the final one);
    returns ``(lens, seconds, mean loss per step)``. The model's own decoder gives the targets; it never runs."""
    L, d = model.cfg.n_layers, model.cfg.d_model
    decoder = LensDecoder(model)
    dev = compute_device(decoder.unembed)
    A = [torch.zeros(d, d, device=dev, requires_grad=True) for _ in range(L - 1)]  # the last block stays identity
    b = [torch.zeros(d, device=dev, requires_grad=True) for _ in range(L - 1)]
    opt = torch.optim.Adam([*A, *b], lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / cfg.steps)
    gen = torch.Generator().manual_seed(cfg.seed)
    losses = []
    t1 = time.perf_counter()
    for _ in range(cfg.steps):
        idx = torch.randint(0, R.shape[0], (min(cfg.batch_tokens, R.shape[0]),), generator=gen)
        h = R[idx].to(dev)  # [B, L, d]
        with torch.no_grad():
            target = torch.log_softmax(decoder(h[:, L - 1]), -1)  # [B, V] the model's own distribution
            p = target.exp()
        step = 0.0
        for layer in range(L - 1):  # one layer's graph at a time: [B, V] logits, not [L, B, V]
            x = h[:, layer]
            lq = torch.log_softmax(decoder(x + x @ A[layer] + b[layer]), -1)  # [B, V]
            loss = (p * (target - lq)).sum(-1).mean()
            A[layer].grad, b[layer].grad = torch.autograd.grad(loss, [A[layer], b[layer]])
            step += float(loss.detach())
        opt.step()
        sched.step()
        losses.append(step / (L - 1))
        if progress:
            progress(1)
    zero = torch.zeros(1, d, d, device=dev)
    lens = TunedLens(A=torch.cat([torch.stack([a.detach() for a in A]), zero]).cpu(),
                     b=torch.cat([torch.stack([x.detach() for x in b]), zero[:, 0]]).cpu())
    return lens, time.perf_counter() - t1, losses


def _meta(model, name, cfg, layers, losses, R, kl, *, n_train, n_held, heldout_tokens, capture_seconds,
          train_seconds, heldout_seconds, **extra) -> dict:
    return {"model": name or getattr(model, "name_or_path", "") or type(model).__name__,
            "checkpoint_hash": checkpoint_hash(model), "hooks": [f"blocks.{x}.hook_resid_post" for x in layers],
            "config": asdict(cfg), "n_train_texts": n_train, "n_heldout_texts": n_held,
            "train_tokens": int(R.shape[0]), "capture_seconds": round(capture_seconds, 1),
            "train_seconds": round(train_seconds, 1), "heldout_seconds": round(heldout_seconds, 1),
            "heldout_tokens": heldout_tokens, "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
            "bytes": int((model.cfg.n_layers * (model.cfg.d_model + 1) * model.cfg.d_model) * 4), "heldout_kl": kl,
            **extra}
