"""Determinism among other requests: distinct outputs per prompt vs the number of co-batched requests.

A thin layer over ``decoding.scheduler.determinism_sweep`` (the `Scheduler` of deterministic
requests): for every k in `others`, the measured prompts run among k-request batches in several
arrival orders, once flagged deterministic (verified in fixed-shape windows) and once not (the
fast path's tokens as they come). The chart shows the largest number of distinct outputs any one
prompt produced, for both.

>>> res = main(DeterminismConfig(model="target", prompts=2, others="0,1", out="det.png"))  # doctest: +SKIP
>>> res["verified_unique_max"]  # doctest: +SKIP
1
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from beliefscope.analyses import plots
from beliefscope.analyses.common import check_writable_parent, save_fig
from beliefscope.models.profile import model_profile


@dataclass
class DeterminismConfig:
    """`beliefscope determinism-chart` (or `determinism` when decoding does not register one)."""

    model: str = "target"  # checkpoint folder or alias
    prompts: int = 8  # measured prompts (requests)
    others: str = "0,1,3,7"  # batch sizes beyond one request (the Scheduler's max_batch = k + 1), comma-separated
    out: str | None = "determinism.png"  # chart PNG (None: numbers only)
    max_new_tokens: int = 12  # tokens per request
    quick: bool = False  # 2 arrival orders instead of 3
    window: int = 4  # verify window W (pending token + W-1 fast-path drafts)
    seed: int = 0  # prompt seed
    dtype: str = "float32"  # fast-path precision: float32 or bfloat16


def measure(model, prompts, pool, cfg: DeterminismConfig, progress=None) -> dict:
    """Distinct outputs per prompt for every k, verified and fast path (``decoding.Scheduler``)."""
    from beliefscope.decoding.scheduler import determinism_sweep

    ks = [int(k) for k in str(cfg.others).split(",")]
    orders = 2 if cfg.quick else 3
    dtype = getattr(torch, cfg.dtype)
    rows = []
    for k in ks:
        row = {"others": k, "configurations": 1 if k == 0 else orders}
        for name, flag in (("verified", True), ("fast_path", False)):
            seen = determinism_sweep(model, prompts, pool, others=(k,), orders=1 if k == 0 else orders,
                                     window=cfg.window, max_new_tokens=cfg.max_new_tokens, fast_dtype=dtype,
                                     deterministic=flag)
            counts = [len(v) for v in seen.values()]
            row[f"{name}_unique_max"] = max(counts)
            row[f"{name}_unique_mean"] = round(sum(counts) / len(counts), 4)
            if progress:
                progress(1)
        rows.append(row)
    return {"by_others": rows, "verified_unique_max": max(r["verified_unique_max"] for r in rows),
            "fast_path_unique_max": max(r["fast_path_unique_max"] for r in rows),
            "n_configurations": sum(r["configurations"] for r in rows), "prompts": len(prompts)}


def main(config: DeterminismConfig, *, bridge=None, tok=None, progress=None) -> dict:
    """Measure and draw the chart; returns the numbers (with `verified_unique_max`, `fast_path_unique_max`)."""
    from beliefscope.tasks import get_task

    out = check_writable_parent(config.out) if config.out else None
    if config.dtype not in ("float32", "bfloat16"):
        raise ValueError(f"fast-path dtype {config.dtype!r} is unknown: use float32 or bfloat16")
    if bridge is None:
        from beliefscope.models.load import load_model

        bridge, tok = load_model(config.model)
    rendering = model_profile(config.model).rendering
    task = get_task("coinflip", rendering=rendering, fmt="cot" if rendering == "toy" else "direct")
    enc = lambda exs: [tok(e.prompt)["input_ids"] for e in exs]
    prompts = enc(task.examples(config.prompts, config.seed + 1, (3, 8)))
    pool = enc(task.examples(32, config.seed + 2, (1, 12)))
    res = measure(bridge, prompts, pool, config, progress)
    rows = res["by_others"]
    if out:
        save_fig(plots.determinism_chart([r["others"] for r in rows], [r["fast_path_unique_max"] for r in rows],
                                         [r["verified_unique_max"] for r in rows]), out)
    return {"model": config.model, "fast_path_dtype": config.dtype, "window": config.window,
            "max_new_tokens": config.max_new_tokens, "engine": "decoding.scheduler.determinism_sweep", **res,
            "files": [out] if out else []}
