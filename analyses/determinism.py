"""Determinism among other requests: distinct outputs per prompt vs the number of co-batched requests.

A thin layer over ``decoding.sweep.determinism_sweep`` (the `Scheduler` of deterministic
requests). For every k in `others` the measured prompts run with continuous batching
(``max_batch = k + 1``, arrivals over time, other requests of different lengths, so the decode
batch size changes from round to round) in several arrival orders, once flagged deterministic
(verified in fixed-shape windows) and once not (the fast path's tokens as they come). It reports
the largest number of distinct outputs any one prompt produced, for both, and the first new-token
position where a prompt's fast-path outputs differ. On the real model the prompts are open-ended
questions about standard-library functions (chat template); on the toy they are coin flips.

``window`` and ``verify_slots`` may list several values (``"4,16"``, ``"2,8"``): the verified
requests then run at every verify shape of the grid, every slot of the same capacity, and
``verified_unique_max`` counts a prompt's distinct outputs over the whole grid (every k, order, W
and B together). LLM-42 reports verified outputs that change with the verify window; this is the
check that ours do not.

>>> res = main(DeterminismConfig(model="target", n=2, others="0,1", out=None, max_new_tokens=4))
>>> res["verified_unique_max"], res["fast_path_dtype"]
(1, 'float32')
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import random
import string
import textwrap
from dataclasses import dataclass

import torch

from ..decoding.sweep import determinism_sweep
from ..models.load import load_model
from ..models.packed import can_pack
from ..models.profile import hf_of, model_profile
from ..tasks import get_task
from . import plots_decoding
from .common import check_writable_parent, save_fig, write_json

# Every path a measured prompt can run on: (name, flagged deterministic, fast-path kernels, --paths values).
PATHS = (("fast_path", False, "default", ("all", "both", "fast")),
         ("fast_path_invariant", False, "row-invariant", ("all", "invariant")),
         ("verified", True, "default", ("all", "both", "verified")))


@dataclass
class DeterminismConfig:
    """`beliefscope determinism`: distinct outputs per prompt as other requests share its batch."""

    model: str = "target"  # checkpoint folder or alias
    n: int = 8  # measured prompts (requests)
    others: str = "0,1,3,7"  # co-batched requests k (the Scheduler's max_batch = k + 1), comma-separated
    out: str | None = None  # chart PNG (None: numbers only, as the command without --out)
    max_new_tokens: int = 12  # tokens per measured request (open-ended runs: 64 or more)
    quick: bool = False  # 2 arrival orders instead of 3
    window: str = "4"  # verify windows W (pending token + W-1 fast-path drafts), comma-separated for a grid
    seed: int = 0  # prompt seed
    fast_dtype: str = "float32"  # precision of the unverified fast path: float32 or bfloat16 (verification runs in
    #   the model's dtype)
    n_others: int | None = None  # other (background) requests per configuration (None: half the prompts)
    costs: str | None = None  # benchmarks/results/determinism.json to draw the throughput-vs-share panel from
    verify_slots: str = "4"  # B of every verify forward, comma-separated for a grid
    #   (at most B measured requests at once)
    partial: str | None = None  # JSON file rewritten after every k with the rows so far (long runs)
    paths: str = "auto"  # paths the measured prompts run on: all (PATHS), both (fast + verified), fast, invariant
    #   (the batch-invariant fast path: packed linears, tiled attention, float32; CPU only) or verified;
    #   auto: all where the batch-invariant path can run, else both
    compile: bool = False  # replay the scheduler's fast rounds and fixed-shape verifies (CUDA graphs on a GPU,
    #   torch.compile on the CPU): the same verified tokens, at GPU speed (decoding.graphed.SlotReplays)


def resolve_paths(paths: str, model) -> str:
    """``--paths`` for this model, checked before any forward. ``auto``: ``all`` where the batch-invariant
    fast path can run (float32 weights on the CPU, oneDNN packing), else ``both``; ``all`` or ``invariant``
    where it cannot are refused with the fix."""

    choices = sorted({c for *_, cs in PATHS for c in cs} | {"auto"})
    if paths not in choices:
        raise ValueError(f"paths={paths!r}: use one of {', '.join(choices)}")
    packable = can_pack(hf_of(model))
    if paths == "auto":
        return "all" if packable else "both"
    if paths in ("all", "invariant") and not packable:
        p = next(hf_of(model).parameters())
        raise ValueError(f"--paths {paths} runs the batch-invariant fast path, which needs float32 weights on the CPU "
                         f"(oneDNN packed linears); this model is {p.dtype} on {p.device}: use --paths both (or auto), "
                         "or --device cpu --dtype float32")
    return paths


def int_list(text, name: str, minimum: int = 1) -> list[int]:
    """Comma-separated integers ``>= minimum`` (an int is a one-value list); a clear error otherwise.

    >>> int_list("4,16", "window"), int_list(8, "verify_slots")
    ([4, 16], [8])
    """
    try:
        values = [int(v) for v in str(text).split(",")]
    except ValueError:
        values = []
    if not values or min(values) < minimum:
        raise ValueError(f"{name}={text!r} must be comma-separated integers >= {minimum}, e.g. 4 or 4,16")
    return values


def first_divergence(outputs) -> int | None:
    """First new-token position where the outputs of one prompt differ (None: all identical).

    >>> first_divergence({(1, 2, 3), (1, 2, 4)}), first_divergence({(5, 6)})
    (2, None)
    """
    outs = list(outputs)
    if len(outs) < 2:
        return None
    n = min(map(len, outs))
    return next((j for j in range(n) if len({o[j] for o in outs}) > 1), n)


def open_prompts(tok, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` open-ended chat prompts ("Explain in detail what the Python function X does"), X from the
    public callables of a few standard-library modules, in a fixed order rotated by ``seed``."""

    names = [f"{m.__name__}.{a}" for m in (json, os, textwrap, collections, string, random)
             for a in sorted(dir(m)) if not a.startswith("_") and callable(getattr(m, a))
             and (inspect.getdoc(getattr(m, a)) or "").strip()]
    names = names[seed % len(names):] + names[: seed % len(names)]
    if n > len(names):
        raise ValueError(f"{n} prompts asked for but only {len(names)} functions to ask about: use --n <= "
                         f"{len(names)}")
    msg = "Explain in detail what the Python function {} does, with an example."
    chat = lambda x: tok.apply_chat_template([{"role": "user", "content": msg.format(x)}], add_generation_prompt=True,
                                             tokenize=False)
    return [list(tok(chat(x))["input_ids"]) for x in names[:n]]


def measure(model, prompts, pool, cfg: DeterminismConfig, progress=None) -> dict:
    """Distinct outputs per prompt for every k, verified and fast path (``decoding.Scheduler``)."""

    ks = [int(k) for k in str(cfg.others).split(",")]
    orders = 2 if cfg.quick else 3
    dtype = getattr(torch, cfg.fast_dtype)
    every, stats = {name: {} for name, *_ in PATHS}, {name: {} for name, *_ in PATHS}
    rows = [{"others": k, "configurations": 1 if k == 0 else orders} for k in ks]
    which = resolve_paths(cfg.paths, model)
    paths = [(name, flag, kernels) for name, flag, kernels, cs in PATHS if which in cs]
    ran = {name: any(n == name for n, *_ in paths) for name, *_ in PATHS}
    run_fast, run_verified = ran["fast_path"], ran["verified"]
    windows, slots = int_list(cfg.window, "window"), int_list(cfg.verify_slots, "verify_slots")
    grid = [(w, b) for w in windows for b in slots]
    longest = max(len(p) for p in [*prompts, *pool])
    cap = longest + 2 * cfg.max_new_tokens + max(windows)  # one slot capacity for every shape of the grid
    by_shape, per_k = [], {name: {r["others"]: {} for r in rows} for name, *_ in paths}
    schedulers = {}  # one scheduler per configuration for the whole measurement (its recordings are reused)
    for name, flag, kernels in paths:  # the fast paths first: they are the question
        for w, b in grid if flag else grid[:1]:  # the fast path's tokens do not depend on the verify shape
            cell = {}
            for row in rows:
                seen = determinism_sweep(model, prompts, pool, others=(row["others"],), orders=orders,
                                         schedulers=schedulers, max_batch=max(ks) + 1,
                                         window=w, max_new_tokens=cfg.max_new_tokens,
                                         fast_dtype=dtype if kernels == "default" else torch.float32,
                                         deterministic=flag, n_others=cfg.n_others, stats=stats[name],
                                         verify_slots=b, slot_capacity=cap, fast_kernels=kernels,
                                         compile=cfg.compile)
                for i, v in seen.items():
                    for acc in (every[name], cell, per_k[name][row["others"]]):
                        acc.setdefault(i, set()).update(v)
                if progress:
                    progress(1)
                if cfg.partial:

                    write_json(cfg.partial, {"outputs": {n: {i: sorted(v) for i, v in e.items()}
                                                         for n, e in every.items()}})
            if flag:
                by_shape.append({"window": w, "verify_slots": b, "unique_max": max(map(len, cell.values()))})
    for name, *_ in paths:
        for row in rows:
            seen = per_k[name][row["others"]]
            counts = [len(v) for v in seen.values()]
            row[f"{name}_unique_max"] = max(counts)
            row[f"{name}_unique_mean"] = round(sum(counts) / len(counts), 4)
            firsts = [f for f in map(first_divergence, seen.values()) if f is not None]
            row[f"{name}_prompts_diverged"] = len(firsts)
            row[f"{name}_first_divergence_position"] = min(firsts, default=None)
    for name, *_ in PATHS:
        if not ran[name]:  # not measured: None, never a made-up 1
            every[name] = {0: {()}}
            stats[name] = {"accepted": 0, "drafted": 0, "batch_sizes": {}, "min_margin": None}
            for r in rows:
                r[f"{name}_unique_max"] = None
    firsts = {name: [first_divergence(v) for v in every[name].values()] for name in every}
    div = sorted(f for f in firsts["fast_path"] if f is not None)
    # verified: distinct outputs of a prompt over every configuration (k, order, W, B) together
    vmax = max(map(len, every["verified"].values())) if run_verified else None
    return {"by_others": rows, "verified_unique_max": vmax, "paths": which,
            "verified_by_shape": by_shape, "slot_capacity": cap,
            "measured_prompts": [list(p) for p in prompts],  # token ids, in the order of `outputs`
            "outputs": {name: [sorted(map(list, every[name][i])) for i in range(len(prompts))]
                        for name, *_ in PATHS if ran[name]},
            "fast_path_unique_max": max(r["fast_path_unique_max"] for r in rows) if run_fast else None,
            # the batch-invariant fast path (float32, packed linears, tiled attention), unverified
            "fast_path_invariant_unique_max": (max(map(len, every["fast_path_invariant"].values()))
                                               if ran["fast_path_invariant"] else None),
            # over all configurations together (k's and orders): a prompt may differ only across k
            "fast_path_unique_overall_max": max(map(len, every["fast_path"].values())) if run_fast else None,
            "verified_unique_overall_max": max(map(len, every["verified"].values())) if run_verified else None,
            "fast_path_prompts_diverged": len(div) if run_fast else None,
            "first_divergence_position": div[0] if div else None,
            "fast_path_divergence_positions": div,
            "verified_first_divergence_position": min((f for f in firsts["verified"] if f is not None),
                                                      default=None),
            "fast_batch_sizes": dict(sorted(stats["fast_path"]["batch_sizes"].items())),
            "fast_path_min_top2_margin": stats["fast_path"]["min_margin"],
            "verified_acceptance": (round(stats["verified"]["accepted"] / max(1, stats["verified"]["drafted"]), 4)
                                    if run_verified else None),
            "n_configurations": sum(r["configurations"] for r in rows), "prompts": len(prompts),
            "compiled": "; ".join(sorted({st["compiled"] for st in stats.values() if st.get("compiled")}))}


def main(config: DeterminismConfig, *, bridge=None, tok=None, progress=None) -> dict:
    """Measure and draw the chart; returns the numbers (with `verified_unique_max`, `fast_path_unique_max`,
    `first_divergence_position`)."""

    out = check_writable_parent(config.out) if config.out else None
    if config.fast_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"fast-path dtype {config.fast_dtype!r} is unknown: use float32 or bfloat16")
    if config.n < 1:
        raise ValueError(f"n={config.n}: the workload is empty, measure at least 1 prompt")
    try:
        ks = [int(k) for k in str(config.others).split(",")]
    except ValueError:
        ks = [-1]
    if not ks or min(ks) < 0:
        raise ValueError(f"others={config.others!r} must be comma-separated numbers of co-batched requests >= 0, "
                         "e.g. 0,1,3,7")
    int_list(config.window, "window"), int_list(config.verify_slots, "verify_slots")  # refused before loading
    if bridge is None:

        bridge, tok = load_model(config.model)
    rendering = model_profile(config.model).rendering
    if rendering == "toy":
        task = get_task("coinflip", rendering=rendering, fmt="cot")
        enc = lambda exs: [tok(e.prompt)["input_ids"] for e in exs]
        prompts = enc(task.examples(config.n, config.seed + 1, (3, 8)))
        pool = enc(task.examples(32, config.seed + 2, (1, 12)))
    else:  # open-ended questions: long answers with near-ties somewhere
        prompts = open_prompts(tok, config.n, config.seed)
        pool = open_prompts(tok, 24, config.seed + 500)
    res = {"model": config.model, "fast_path_dtype": config.fast_dtype, "window": config.window,
           "verify_slots": config.verify_slots, "n_others": config.n_others,
           "max_new_tokens": config.max_new_tokens, "engine": "decoding.sweep.determinism_sweep",
           **measure(bridge, prompts, pool, config, progress), "files": [out] if out else []}
    if out:
        save_fig(chart(res, config.costs), out)
    return res


def chart(res: dict | list[dict], costs: str | dict | None = None):
    """The determinism figure from one or more `main` results (e.g. a float32 and a bfloat16 fast path);
    with `costs` (a bench result or its path), a second panel of throughput vs deterministic share."""

    runs = res if isinstance(res, list) else [res]
    if isinstance(costs, str):
        with open(costs) as f:
            costs = json.load(f)
    series = {f"fast path, {r['fast_path_dtype']}" + _overall(r): ([x["others"] for x in r["by_others"]],
                                                     [x["fast_path_unique_max"] for x in r["by_others"]])
              for r in runs if r.get("fast_path_unique_max") is not None}
    inv = [r for r in runs if r.get("fast_path_invariant_unique_max") is not None]
    if inv:
        series["batch-invariant fast path, float32"] = (
            [x["others"] for x in inv[0]["by_others"]],
            [max(r["by_others"][j]["fast_path_invariant_unique_max"] for r in inv)
             for j in range(len(inv[0]["by_others"]))])
    checked = [r for r in runs if r.get("verified_unique_max") is not None]  # runs with verified requests
    if checked:
        series["verified"] = ([x["others"] for x in checked[0]["by_others"]],
                              [max(r["by_others"][j]["verified_unique_max"] for r in checked)
                               for j in range(len(checked[0]["by_others"]))])
    if not costs and len(runs) == 1 and checked and not inv and runs[0].get("fast_path_unique_max") is not None:
        r = runs[0]["by_others"]
        return plots_decoding.determinism_chart([x["others"] for x in r], [x["fast_path_unique_max"] for x in r],
                                       [x["verified_unique_max"] for x in r])
    return plots_decoding.determinism_costs_chart(series, actual_shares((costs or {}).get("models", {})))


def _overall(r: dict) -> str:
    """Legend note: what the configurations give together (a prompt may differ only across k)."""
    n, div = r.get("fast_path_unique_overall_max"), r.get("fast_path_prompts_diverged")
    return f"; all k together: up to {n}, {div}/{r['prompts']} prompts" if n and n > 1 else ""


def actual_shares(models: dict) -> dict:
    """Bench results with each row's share as run (deterministic requests / requests), not as asked."""
    out = {}
    for name, m in models.items():
        fix = lambda r, m=m: {**r, "det_share": r["deterministic_requests"] / m["n_requests"]}
        out[name] = {**m, "shares": [fix(r) for r in m["shares"]]}
    return out
