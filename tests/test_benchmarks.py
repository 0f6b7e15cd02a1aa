"""Smoke tests of `beliefscope bench <name> --quick`: each benchmark runs, its outputs match its
baseline (spec: plain greedy; forced: recompute; harvest: 1 vs 2 processes; probes: scikit-learn),
and the JSON it writes is well formed (headline key, machine info, finite positive ratios).
Speed is never asserted. Results go to a temp dir (BELIEFSCOPE_BENCH_OUT), never to the
committed benchmarks/results/."""

from __future__ import annotations

import importlib
import json
import math
import os

import pytest

from beliefscope.benchmarks.cli import BENCHMARKS, headline
from beliefscope.benchmarks.common import (
    OUT_ENV,
    interleaved,
    leviathan_bound,
    median_ci,
    ratio_spread,
    spread,
    write_result,
)

pytestmark = pytest.mark.slow

NEEDS = {  # benchmark -> modules whose API it times
    "forced": ["beliefscope.analyses.forced", "beliefscope.cache"],
    "spec": ["beliefscope.decoding.speculative", "beliefscope.decoding.drafters"],
    "harvest": ["beliefscope.probes.harvest", "beliefscope.probes.store"],
    "probes": ["beliefscope.probes.linear", "beliefscope.probes.controls"],
    "cache": ["beliefscope.cache"],
    "thinking": ["beliefscope.decoding.thinking", "beliefscope.models.thinking"],
}


def _missing(name):
    for mod in NEEDS[name]:
        try:
            importlib.import_module(mod)
        except ImportError as e:
            return f"{mod} has not landed yet ({e})"
    return None


def _ratios(obj, path=""):
    """Every value under a key named like a ratio (speedup*, *_over_*, overhead, share*)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{path}.{k}"
            if isinstance(v, (int, float)) and not isinstance(v, bool) and (
                    k.startswith("speedup") or "_over_" in k or k.startswith("share") or k == "median"):
                yield p, v
            yield from _ratios(v, p)


@pytest.fixture()
def out_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(OUT_ENV, str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("name", ["forced", "spec", "harvest", "probes", "cache", "thinking"])
def test_quick_benchmark(name, out_dir):
    assert _missing(name) is None, _missing(name)  # every benchmarked API has landed: a missing one fails
    from beliefscope.cli import main

    committed = os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "results", f"{name}.json")
    before = open(committed).read() if os.path.exists(committed) else None
    assert main(["bench", name, "--quick", "--json"]) == 0  # non-zero if outputs differed
    path = out_dir / f"{name}.json"
    assert path.exists(), f"{name} did not write {path}"
    res = json.loads(path.read_text())
    assert res["quick"] is True
    assert headline(name) in res
    m = res["machine"]
    assert m["torch_threads"] >= 1 and m["date"] and "torch" in m
    for p, v in _ratios(res):
        assert math.isfinite(v) and v > 0, f"{name}: {p} = {v}"
    _check_outputs(name, res)
    # the committed full result is untouched by a quick run
    after = open(committed).read() if os.path.exists(committed) else None
    assert after == before


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_keeps_the_contract(name):
    """main(quick, progress, config), a HEADLINE, and a result file of its own name (no module-level path)."""
    import inspect

    module = importlib.import_module(f"beliefscope.benchmarks.{name}")
    params = list(inspect.signature(module.main).parameters)
    assert params[:3] == ["quick", "progress", "config"], (name, params)
    assert isinstance(module.HEADLINE, str) and module.HEADLINE
    assert "write_result" in inspect.getsource(module.main)


def _check_outputs(name, res):
    """The checks behind `outputs ok` are real comparisons, recorded per model."""
    if name == "thinking":  # both models answered, and Thinking States wrote fewer tokens into its context
        assert res["answer_accuracy_thinking"] == 1.0
        assert res["context_tokens_generated_thinking"]["max"] < res["context_tokens_generated_cot"]["min"]
        batched = res["bands"]["3-4"]["batched"]  # 4 stories at once: one forward per chunk index
        assert batched["batch"] == 4 and batched["answer_accuracy_thinking"] == 1.0
        assert batched["backbone_forwards_thinking"] <= 7 and "speedup_vs_cot_batch_3_4" in res
        for band in res["bands"].values():  # speculative prefill wrote the thoughts and answer chunk by chunk did
            assert band["speculative_equals_chunked"] == 1.0
    if name == "forced":
        for row in res["toy"].values():
            assert row["positions_equal"] and row["max_abs_diff_p"] < 1e-4 and row["n_boundaries"] > 0
    elif name == "spec":
        methods = res["toy"]["methods"]
        plain = methods["ours plain greedy"]
        assert plain["identical_to_plain"] == plain["n_prompts"] == 2
        assert any(r["kind"] == "hf" and "speedup" in r for r in methods.values())
        for key, row in methods.items():
            if row["kind"] == "ours" and row.get("fixed_window", True):
                assert row["identical_to_fixed_shape_reference"] == row["n_prompts"], key
            if row["kind"] == "ours" and not row.get("fixed_window", True):  # variable windows: plain greedy
                assert row["identical_to_plain"] == row["n_prompts"], key
            if row["kind"] == "ours":
                assert 0 <= row["alpha"] <= 1 and row["leviathan_bound"] > 0 and row["tokens_per_verify_step"] >= 1
    elif name == "harvest":
        assert res["torchrun"]["n_rows"]["2"] == res["toy"]["n_tokens"]
    elif name == "cache":
        assert res["outputs_identical"] and all(r["max_abs_diff_logits"] <= 1e-4 for r in res["toy"].values())
    elif name == "probes":
        assert res["toy"]["max_accuracy_diff"] <= 0.01 and len(res["toy"]["layers"]) == res["toy"]["n_layers"]


def test_interleaved_pairs_and_rotates(monkeypatch):
    """With a fake clock, each call's duration is known: ratios are exact and the order rotates."""
    from beliefscope.benchmarks import common

    clock, calls = [0.0], []
    monkeypatch.setattr(common.time, "perf_counter", lambda: clock[0])

    def work(name, seconds):
        def fn():
            calls.append(name)
            clock[0] += seconds * (1 + len(calls) / 100)  # slow drift hits both alike
            return name
        return fn

    res = interleaved({"base": work("base", 10.0), "fast": work("fast", 2.0)}, repeats=5, warmup=1)
    assert calls[:2] == ["base", "fast"] and calls[2:4] == ["base", "fast"] and calls[4:6] == ["fast", "base"]
    assert res["base"]["seconds"]["n"] == 5 and res["fast"]["outputs"] == "fast"
    ratios = [b / f for b, f in zip(res["base"]["times_s"], res["fast"]["times_s"])]
    assert res["fast"]["speedup"]["median"] == pytest.approx(sorted(ratios)[2], abs=1e-4)
    assert 4.5 < res["fast"]["speedup"]["min"] <= res["fast"]["speedup"]["max"] < 5.5


def test_spread_and_ratio_by_hand():
    s = spread([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s["median"], s["min"], s["max"], s["q1"], s["q3"]) == (3.0, 1.0, 5.0, 2.0, 4.0)
    assert ratio_spread([2.0, 6.0], [1.0, 2.0])["median"] == 2.5
    with pytest.raises(ValueError, match="pair"):
        ratio_spread([1.0], [1.0, 2.0])


def test_median_ci_matches_scipy_binomial_coverage():
    """The interval is the narrowest order-statistic pair whose coverage (from scipy's binomial) is >= 95%."""
    from scipy.stats import binom

    for n in (6, 10, 20, 40, 41):
        lo, hi = median_ci([float(i) for i in range(n)])
        j = int(lo)
        assert hi == n - 1 - j
        coverage = 1 - 2 * binom.cdf(j, n, 0.5)  # P(x_(j) <= median <= x_(n-1-j)), 0-indexed
        tighter = 1 - 2 * binom.cdf(j + 1, n, 0.5)
        assert coverage >= 0.95 > tighter
    with pytest.raises(ValueError, match="at least 6"):
        median_ci([1.0, 2.0])


def test_leviathan_bound_matches_formula():
    a, g, c = 0.7, 3, 0.1
    assert leviathan_bound(a, g, c) == pytest.approx((1 - a ** (g + 1)) / ((1 - a) * (g * c + 1)))
    assert leviathan_bound(1.0, 4, 0.0) == 5  # every draft accepted, free drafter: gamma + 1 tokens per step
    assert leviathan_bound(0.0, 4, 0.0) == 1
    with pytest.raises(ValueError):
        leviathan_bound(1.5, 4, 0.1)


def test_write_result_is_atomic_and_quick_goes_elsewhere(tmp_path, monkeypatch):
    from beliefscope.benchmarks import common

    monkeypatch.delenv(OUT_ENV, raising=False)
    assert common.result_path("x", True) != common.result_path("x", False)
    assert os.path.dirname(common.result_path("x", True)).endswith(os.path.join("results", "quick"))
    monkeypatch.setenv(OUT_ENV, str(tmp_path))
    p = write_result("x", {"a": float("nan"), "b": (1, 2), "t": {"outputs": object(), "v": 1}}, quick=True)
    assert json.loads(open(p).read()) == {"a": None, "b": [1, 2], "t": {"v": 1}}
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []
