"""Determinism among other requests: distinct outputs per prompt vs the number of co-batched requests.

For each prompt (the *request*) and each number k of other requests, the request is decoded in
several batch compositions (which others, and where the request sits in the batch = arrival order):

- **fast path (unverified):** greedy decoding in one dynamic, left-padded batch whose composition
  changes as the others finish (each stops after its own budget);
- **verified (LLM-42 style):** the fast path drafts W-1 tokens, then one verify forward of a fixed
  shape [B slots, fixed length] checks them: the request always sits in slot 0, the other slots
  carry the co-batched requests or dummy rows. The longest matching prefix is kept, then the
  verifier's token. The verified tokens depend only on the request and the verifier's shape.

Distinct outputs are counted per prompt over all compositions. (This is the analysis' own small
engine over the decoding primitives; `decoding.Scheduler` is the production one.)

>>> res = main(DeterminismConfig(model="target", prompts=2, others="0,1", out="det.png"))  # doctest: +SKIP
>>> res["verified_unique_max"]  # doctest: +SKIP
1
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from analyses import plots
from analyses.common import check_writable_parent, save_fig


@dataclass
class DeterminismConfig:
    """`beliefscope determinism-chart` (or `determinism` when decoding does not register one)."""

    model: str = "target"  # checkpoint folder or alias
    prompts: int = 8  # requests (prompts) checked
    others: str = "0,1,3,7"  # numbers of co-batched requests, comma-separated
    out: str = "determinism.png"  # chart PNG
    max_new_tokens: int = 16  # tokens per request
    quick: bool = False  # 2 arrival orders instead of 3
    window: int = 5  # verify window W (W-1 drafts + the pending token)
    slots: int | None = None  # fixed verify batch B (default 1 + max others; the same for every composition)
    seed: int = 0  # prompt and composition seed
    dtype: str = "float32"  # fast-path precision: float32 or bfloat16


@torch.no_grad()
def _next_tokens(hf, seqs: list[list[int]], pad: int) -> list[int]:
    """Greedy next token of every row of a dynamic left-padded batch (the fast path)."""
    n = max(len(s) for s in seqs)
    ids = torch.tensor([[pad] * (n - len(s)) + s for s in seqs])  # [b, n]
    mask = (torch.arange(n)[None] >= torch.tensor([n - len(s) for s in seqs])[:, None]).long()  # [b, n]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]  # [b, vocab]
    return logits.argmax(-1).tolist()


def _fast_path(hf, rows: list[list[int]], budgets: list[int], pad: int, steps: int) -> list[list[int]]:
    """Decode all rows together; a row leaves the batch when its budget is spent."""
    out = [[] for _ in rows]
    for _ in range(steps):
        live = [i for i in range(len(rows)) if len(out[i]) < budgets[i]]
        if not live:
            break
        nxt = _next_tokens(hf, [rows[i] + out[i] for i in live], pad)
        for i, t in zip(live, nxt, strict=True):
            out[i].append(t)
    return out


@torch.no_grad()
def _verify(hf, slot0: list[int], others: list[list[int]], length: int, slots: int, pad: int) -> torch.Tensor:
    """Logits of slot 0 from one fixed-shape forward [slots, length] (right padding, causal)."""
    rows = [slot0] + [o[:length] for o in others][: slots - 1]
    rows += [[pad]] * (slots - len(rows))  # dummy rows
    ids = torch.tensor([r + [pad] * (length - len(r)) for r in rows])  # [slots, length]
    return hf(input_ids=ids).logits[0]  # [length, vocab]


def _verified(hf, fast, req, others, budgets, cfg: DeterminismConfig, pad: int, length: int, slots: int) -> list[int]:
    done: list[int] = []
    while len(done) < cfg.max_new_tokens:
        rows = [req + done] + [o for o in others]
        drafts = _fast_path(fast, rows, [cfg.window - 1] + [min(b, cfg.window - 1) for b in budgets], pad,
                            cfg.window - 1)[0]
        x = req + done + drafts
        logits = _verify(hf, x, others, length, slots, pad)
        ref = logits[len(req) + len(done) - 1: len(x)].argmax(-1).tolist()  # [len(drafts) + 1]
        k = 0
        while k < len(drafts) and drafts[k] == ref[k]:  # accept the longest matching prefix,
            k += 1
        done += drafts[:k] + [ref[k]]  # then the verifier's own token
    return done[: cfg.max_new_tokens]


def measure(hf, prompts: list[list[int]], pool: list[list[int]], cfg: DeterminismConfig, pad: int,
            fast=None, progress=None) -> dict:
    """Distinct outputs per prompt for every k in `cfg.others`, fast path and verified."""
    fast = fast or hf
    ks = [int(k) for k in str(cfg.others).split(",")]
    slots = cfg.slots or max(ks) + 1
    if max(ks) + 1 > slots:
        raise ValueError(f"--others up to {max(ks)} needs at least {max(ks) + 1} verify slots; got {slots}")
    rng = random.Random(cfg.seed)
    length = max(len(p) for p in prompts + pool) + cfg.max_new_tokens + cfg.window
    n_orders = 2 if cfg.quick else 3
    rows = []
    for k in ks:
        fast_u, ver_u, n_conf = [], [], 0
        for req in prompts:
            outs_f, outs_v = set(), set()
            for order in range(n_orders if k else 1):
                others = rng.sample(pool, k)
                budgets = [rng.randint(2, cfg.max_new_tokens) for _ in others]
                at = [0, k // 2, k][order]  # arrival order: the request joins first, in the middle or last
                batch = others[:at] + [req] + others[at:]
                bud = budgets[:at] + [cfg.max_new_tokens] + budgets[at:]
                outs_f.add(tuple(_fast_path(fast, batch, bud, pad, cfg.max_new_tokens)[at]))
                outs_v.add(tuple(_verified(hf, fast, req, others, budgets, cfg, pad, length, slots)))
                n_conf += 1
            fast_u.append(len(outs_f))
            ver_u.append(len(outs_v))
            if progress:
                progress(1)
        rows.append({"others": k, "fast_path_unique_max": max(fast_u), "verified_unique_max": max(ver_u),
                     "fast_path_unique_mean": sum(fast_u) / len(fast_u),
                     "verified_unique_mean": sum(ver_u) / len(ver_u), "configurations": n_conf})
    return {"by_others": rows, "verified_unique_max": max(r["verified_unique_max"] for r in rows),
            "fast_path_unique_max": max(r["fast_path_unique_max"] for r in rows), "slots": slots,
            "n_configurations": sum(r["configurations"] for r in rows), "prompts": len(prompts)}


def main(config: DeterminismConfig, *, bridge=None, tok=None, progress=None) -> dict:
    """Measure and draw the chart; returns the numbers (with `verified_unique_max`, `fast_path_unique_max`)."""
    import copy

    from tasks import get_task

    out = check_writable_parent(config.out)
    if bridge is None:
        from models.load import load_model

        bridge, tok = load_model(config.model)
    hf = getattr(bridge, "original_model", bridge)
    fast = hf if config.dtype == "float32" else copy.deepcopy(hf).to(getattr(torch, config.dtype))
    rendering = "natural" if config.model == "smollm2" else "toy"
    task = get_task("coinflip", rendering=rendering, fmt="cot" if rendering == "toy" else "direct")
    enc = lambda exs: [tok(e.prompt)["input_ids"] for e in exs]
    prompts = enc(task.examples(config.prompts, config.seed + 1, (3, 8)))
    pool = enc(task.examples(32, config.seed + 2, (1, 12)))
    res = measure(hf, prompts, pool, config, tok.pad_token_id or 0, fast, progress)
    rows = res["by_others"]
    save_fig(plots.determinism_chart([r["others"] for r in rows], [r["fast_path_unique_max"] for r in rows],
                                     [r["verified_unique_max"] for r in rows]), out)
    return {"model": config.model, "fast_path_dtype": config.dtype, "window": config.window,
            "max_new_tokens": config.max_new_tokens, **res, "files": [out]}
