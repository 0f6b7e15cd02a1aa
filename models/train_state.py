"""Resumable training: ``OUT/train_state.pt`` holds the weights being trained, the optimiser, the
history and the random state, written atomically every few steps, so a run killed at any point and
started again with the same settings ends where an uninterrupted run ends (no step lost or repeated).
`models.train_rope` and `models.thinking.train` both keep their state here.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, fields

import torch

from beliefscope.base.files import atomic_save

from .devices import HOST

STATE_FILE = "train_state.pt"


def save_state(out: str, step: int, named: dict, opt, history: list, cfg, rng: random.Random | None = None) -> None:
    """Write step ``step``'s state of the parameters ``named`` (name -> tensor) into ``out``."""

    state = {"step": step, "config": asdict(cfg), "history": history, "optimizer": opt.state_dict(),
             "trained": {n: p.detach().cpu() for n, p in named.items()}, "torch_rng": torch.get_rng_state()}
    if rng is not None:
        state["python_rng"] = rng.getstate()
    atomic_save(os.path.join(out, STATE_FILE), lambda tmp: torch.save(state, tmp))


def load_state(out: str, cfg, named: dict, opt, free: tuple = (), rng: random.Random | None = None) -> tuple[int, list]:
    """Restore ``out``'s state into ``named``, ``opt`` (and ``rng``); ``(last step, history)``, or
    ``(0, [])`` when there is none. A state written by another configuration (any field outside
    ``free``) is refused, naming the fields that differ."""
    path = os.path.join(out, STATE_FILE)
    if not os.path.exists(path):
        return 0, []
    state = torch.load(path, map_location=HOST, weights_only=True)
    mine = asdict(cfg)
    saved = {f.name: state["config"].get(f.name, f.default) for f in fields(cfg)}  # a field added since: its default
    diff = {f.name: (saved[f.name], mine[f.name]) for f in fields(cfg)
            if f.name not in free and saved[f.name] != mine[f.name]}
    if diff:
        raise ValueError(f"{path} was written by another training configuration "
                         f"({', '.join(f'{k}: saved {a!r}, now {b!r}' for k, (a, b) in diff.items())}): "
                         "give the same settings to resume, or another --out to start afresh")
    if set(named) != set(state["trained"]):
        raise ValueError(f"{path} holds other trained weights than this model: start afresh in another --out")
    with torch.no_grad():
        for n, p in named.items():
            p.copy_(state["trained"][n])
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    if rng is not None:
        if "python_rng" not in state:
            raise ValueError(f"{path} has no data-stream state to resume from: start afresh in another --out")
        rng.setstate(_as_tuples(state["python_rng"]))
    return int(state["step"]), list(state["history"])


def _as_tuples(x):
    """random.Random.setstate wants the tuples getstate gave (a round trip may return lists)."""
    return tuple(_as_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x
