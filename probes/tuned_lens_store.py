"""A tuned lens trained from an activation store (`beliefscope harvest`), with no new forward over the texts.

A harvest store holds every block's ``hook_resid_post`` for every token of every prompt (`probes.store`). The
last block's is the residual before the final norm, so the model's own final distribution is that residual
through `probes.lens.LensDecoder` (the model's final norm and unembedding): the targets need no forward
either. The texts are split as `train_tuned_lens` splits them (whole prompts, by prompt id, with the config's
seed), the training rows are taken prompt after prompt in that order, and the same `fit_translators` fits every
layer at once; the held-out KL table is read from the held-out prompts' stored residuals. On a float32 store
harvested one prompt per forward, training from the store therefore gives the lens that `train_tuned_lens`
gives on the same texts (tests/test_lens_store.py). A store from another model (its checkpoint hash) or without
every block's ``hook_resid_post`` is refused, naming the fix.

Usage (not run as a doctest: it needs a harvested store)::

    store = ActivationStore.open("acts/target")
    lens = train_tuned_lens_from_store(model, store, TunedLensConfig(steps=100))
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .lens import LensDecoder, read_residuals
from .store import ActivationStore
from .tuned_lens import (
    TunedLens,
    TunedLensConfig,
    _meta,
    check_config,
    fit_translators,
    split_heldout,
)
from .twin import checkpoint_hash


def check_store(model, store: ActivationStore, name: str = "") -> list[str]:
    """The store's ``blocks.L.hook_resid_post`` names, every block's; a store of another model (checkpoint hash
    or width) or one missing a block is refused, naming the fix."""
    name = name or getattr(model, "name_or_path", "") or "this model"
    want = store.manifest.get("checkpoint_hash") or store.manifest.get("config", {}).get("checkpoint_hash")
    have = checkpoint_hash(model)
    if want != have:
        trained = store.manifest.get("model", {}).get("id", "?")
        raise ValueError(f"activation store {store.path} was harvested from {trained} (checkpoint hash {want}) but "
                         f"{name} has hash {have}: pass --model {trained} with this store, or harvest one of this "
                         f"model: beliefscope harvest --model {name} --hooks resid_post --layers all --out STORE")
    hooks = [f"blocks.{layer}.hook_resid_post" for layer in range(model.cfg.n_layers)]
    missing = [h for h in hooks if h not in store.hooks]
    if missing:
        raise ValueError(f"activation store {store.path} lacks {len(missing)} of the {len(hooks)} blocks' residuals "
                         f"(e.g. {missing[0]}): a tuned lens trains every layer at once; harvest every block: "
                         f"beliefscope harvest --model {name} --hooks resid_post --layers all --out STORE")
    return hooks


def _rows_by_prompt(store: ActivationStore) -> dict[int, np.ndarray]:
    """Store row indices of every prompt, in token order."""
    lab = store.load_labels(["prompt_id", "position"])
    order = np.lexsort((lab["position"], lab["prompt_id"]))  # by prompt, then position
    pid = lab["prompt_id"][order]
    cuts = np.nonzero(np.diff(pid))[0] + 1
    return {int(p[0]): rows for p, rows in zip(np.split(pid, cuts), np.split(order, cuts))}


def _stack(store: ActivationStore, hooks: list[str], rows: np.ndarray) -> torch.Tensor:
    """``[len(rows), L, d]`` float32 residuals of the given store rows, one hook loaded at a time."""
    out = torch.empty(len(rows), len(hooks), store.manifest["model"]["d_model"])
    idx = torch.as_tensor(rows, dtype=torch.long)
    for i, hook in enumerate(hooks):
        out[:, i] = store.load_hook(hook)[idx].float()
    return out


def train_tuned_lens_from_store(model, store, config: TunedLensConfig | None = None, *, name: str = "",
                                progress=None) -> TunedLens:
    """Train a tuned lens of `model` from the residuals in `store` (an `ActivationStore` or its folder): the same
    split, fit and held-out KL table as `train_tuned_lens`, with no forward. ``progress(n)`` per step."""
    cfg = config or TunedLensConfig()
    store = store if isinstance(store, ActivationStore) else ActivationStore.open(store)
    hooks = check_store(model, store, name)
    t0 = time.perf_counter()
    by_prompt = _rows_by_prompt(store)
    prompts = sorted(by_prompt)
    check_config(cfg, len(prompts))
    held, train = split_heldout(len(prompts), cfg)
    train_rows = np.concatenate([by_prompt[prompts[i]] for i in train])[: cfg.max_tokens]
    held_rows = [by_prompt[prompts[i]] for i in held]
    R = _stack(store, hooks, train_rows)  # [N, L, d]
    H = _stack(store, hooks, np.concatenate(held_rows))  # [M, L, d]
    t_load = time.perf_counter() - t0
    lens, t_train, losses = fit_translators(model, R, cfg, progress)
    t2 = time.perf_counter()
    kl = heldout_kl_stored(model, H, [len(r) for r in held_rows], {"logit": None, "tuned": lens})
    layers = list(range(model.cfg.n_layers))
    return _with_meta(lens, _meta(model, name, cfg, layers, losses, R, kl, n_train=len(train), n_held=len(held),
                                  heldout_tokens=int(H.shape[0]), capture_seconds=t_load, train_seconds=t_train,
                                  heldout_seconds=time.perf_counter() - t2, store=store.path,
                                  store_hash=store.hash))


def _with_meta(lens: TunedLens, meta: dict) -> TunedLens:
    lens.meta = meta
    return lens


@torch.no_grad()
def heldout_kl_stored(model, H: torch.Tensor, lengths: list[int], lenses: dict) -> dict:
    """Mean KL(final || lens) per block over the stored held-out residuals ``H [M, L, d]`` (prompts of
    `lengths` one after another), the final distribution being the last block's residual decoded; summed per
    prompt as `tuned_lens.heldout_kl` sums per text."""
    decoder = LensDecoder(model)
    layers = list(range(model.cfg.n_layers))
    total = {k: np.zeros(len(layers)) for k in lenses}
    start = 0
    for n in lengths:
        h = H[start: start + n].transpose(0, 1)  # [L, n, d]
        final = decoder(h[-1])  # [n, V] the model's own logits, from its stored last residual
        for k, lens in lenses.items():
            total[k] += read_residuals(decoder, h, final, layers, lens=lens)["kl"].sum(1)
        start += n
    return {k: [round(float(x), 4) for x in v / max(start, 1)] for k, v in total.items()}
