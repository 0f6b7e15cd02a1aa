"""Causal check of a probe: push the residual stream along the probe direction, count answer flips.

For each prompt, the probe reads the model's current belief at the last prompt token (layer L).
The steering vector points from that class towards the opposite one, so a causal direction
should flip the answer. It is added at every position from the token that completes the last
event to the end of the prompt. Its norm is ``alpha`` times the mean residual norm at layer L
(measured on the probe's training tokens), so alpha means the same thing for every model. The
same norm along random directions (at least 10) gives the baseline flip rate.

Usage (not run as a doctest: it needs stored activations, probes or a model)::

    res = steer_experiment(bridge, tok, probe, examples, SteerConfig(layer=2, alpha=1.0))
    res["flip_rate"], res["random"]["mean"]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..hooks import hook_name, hooked
from ..hooks.capture import capture
from ..models.tokenizer import answer_token_ids


@dataclass
class SteerConfig:
    """One steering experiment."""

    layer: int  # block whose resid_post is steered (the probe must have this layer)
    alpha: float = 1.0  # added norm, in units of the mean residual norm at that layer
    n_random: int = 10  # random directions of equal norm (baseline)
    random_seed: int = 0  # seed of the random directions
    boundary: bool = True  # also steer the token that completes the last event
    batch_size: int = 32  # prompts per forward (prompts are batched by equal token length)


@dataclass
class SteerCommandConfig:
    """`beliefscope steer`: steering experiments (one per alpha) on prompts drawn like the probe's own."""

    model: str = ""  # model the probe was fitted on (a shipped name or a checkpoint folder)
    probes: str = ""  # folder written by `beliefscope probe --out`
    layer: int = 0  # block whose resid_post is steered (the probe must have this layer)
    alpha: tuple[float, ...] = (1.0,)  # added norm, in units of the mean residual norm; a comma list sweeps
    n: int = 200  # prompts
    seed: int = 777  # prompt seed (use one the probe never saw)
    events: str = "1-8"  # events per prompt, LO-HI
    n_random: int = 10  # random directions of equal norm (baseline)
    random_seed: int = 0  # seed of the random directions
    boundary: bool = True  # steer the token that completes the last event
    batch_size: int = 32  # prompts per forward (prompts are batched by equal token length)


def _batches(lengths: list[int], size: int):
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and j - i < size and lengths[order[j]] == lengths[order[i]]:
            j += 1
        yield order[i:j]
        i = j


def _run(model, ids, hook, delta=None, capture_hook=False):
    """Answer-restricted logits at the last position; optionally add ``delta [b, pos, d]`` at `hook`."""
    def add(act, *, hook):
        return act + delta.to(act.device, act.dtype)

    fwd = [(hook, add)] if delta is not None else []
    with torch.no_grad(), hooked(model, fwd):
        if capture_hook:
            with capture(model, [hook]) as cap:
                logits = model(ids, return_type="logits")
            return logits[:, -1], cap.records[hook][0].act
        return model(ids, return_type="logits")[:, -1], None


def steer_experiment(model, tokenizer, probe, examples, cfg: SteerConfig, progress=None) -> dict:
    """Flip rates for the probe direction and for `cfg.n_random` random directions of equal norm."""
    hook = hook_name("resid_post", cfg.layer)
    if probe.d_model != model.cfg.d_model:
        raise ValueError(f"probe width {probe.d_model} does not match the model's d_model {model.cfg.d_model}: "
                         "the probe was trained on another model")
    probe._index(hook)  # clear error if the probe lacks this layer
    if probe.n_classes != 2:
        raise ValueError(f"steering flips between two states; this probe has {probe.n_classes} classes")
    norm = float(probe.meta["resid_norm"][hook]) * cfg.alpha
    states = probe.meta.get("state_names") or list(examples[0].state_names)
    ans = answer_token_ids(tokenizer, states)
    d = probe.d_model
    gen = torch.Generator().manual_seed(cfg.random_seed)
    rand_dirs = torch.randn(cfg.n_random, d, generator=gen)
    rand_dirs = rand_dirs / rand_dirs.norm(dim=1, keepdim=True)  # [n_random, d]
    labs = [ex.labels(tokenizer, text=ex.prompt) for ex in examples]
    base, belief, steered, correct = [], [], [], []
    rand = [[] for _ in range(cfg.n_random)]
    for batch in _batches([len(lab.input_ids) for lab in labs], cfg.batch_size):
        ids = torch.as_tensor(np.stack([labs[j].input_ids for j in batch]))  # [b, pos]
        T = ids.shape[1]
        mask = torch.zeros(len(batch), T, 1)  # [b, pos, 1] where to steer
        for r, j in enumerate(batch):
            b_idx = np.nonzero(labs[j].is_event_boundary)[0]
            first = int(b_idx[-1]) + (0 if cfg.boundary else 1) if len(b_idx) else 0
            mask[r, first:] = 1.0
        logits, act = _run(model, ids, hook, capture_hook=True)
        answer = logits[:, ans].argmax(1)  # [b]
        pred = probe.predict(act[:, -1], hook)  # [b] current belief at the last prompt token
        dirs = torch.stack([probe.direction(hook, toward=1 - int(p), away=int(p)) for p in pred])  # [b, d]
        s_logits, _ = _run(model, ids, hook, delta=mask * norm * dirs[:, None, :])
        base += answer.tolist()
        belief += pred.tolist()
        steered += s_logits[:, ans].argmax(1).tolist()
        correct += [int(answer[r]) == examples[j].final_state for r, j in enumerate(batch)]
        for k in range(cfg.n_random):
            r_logits, _ = _run(model, ids, hook, delta=mask * norm * rand_dirs[k])
            rand[k] += (r_logits[:, ans].argmax(1) != answer).tolist()
        if progress:
            progress(len(batch))
    base, belief, steered = map(np.asarray, (base, belief, steered))
    rates = np.asarray([np.mean(r) for r in rand]) if cfg.n_random else np.zeros(0)
    return {
        "layer": cfg.layer, "hook": hook, "alpha": cfg.alpha, "alpha_unit": "mean resid norm at the layer",
        "added_norm": round(norm, 5), "n_prompts": len(examples),
        "flip_rate": round(float(np.mean(steered != base)), 4),
        "flip_to_opposite_of_belief_rate": round(float(np.mean(steered == 1 - belief)), 4),
        "baseline_accuracy": round(float(np.mean(correct)), 4),
        "probe_agrees_with_answer": round(float(np.mean(belief == base)), 4),
        "random": {"n": cfg.n_random, "flip_rates": [round(float(r), 4) for r in rates],
                   "mean": round(float(rates.mean()), 4) if len(rates) else None,
                   "std": round(float(rates.std()), 4) if len(rates) else None,
                   "min": round(float(rates.min()), 4) if len(rates) else None,
                   "max": round(float(rates.max()), 4) if len(rates) else None},
    }
