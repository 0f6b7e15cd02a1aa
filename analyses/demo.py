"""`beliefscope demo --out DIR`: every analysis on the shipped toy checkpoints (or SmolLM2), one report.

Runs eval, harvest (model, random-init twin, draft), probes with controls, a belief trajectory,
forced answers, a speculative-decoding trace, the determinism check and a steering check, then
writes ``report.html`` (figures inlined), the PNGs and ``summary.json``. Everything is written to
a temporary folder next to DIR and renamed at the end: a failed run leaves nothing behind.

Usage: ``main(DemoConfig(out="runs/demo"))["probe"]["best_layer"]`` (the CLI: ``beliefscope demo``).
"""

from __future__ import annotations

import html
import json
import os
import time
import typing
from dataclasses import asdict, dataclass, field

import torch

from ..decoding import ModelDrafter, make_drafter
from ..models.evaluate import evaluate
from ..models.load import load_model
from ..models.profile import model_profile
from ..probes.harvest import HarvestConfig, harvest, make_examples, random_init_like
from ..probes.linear import LinearProbe
from ..probes.report import ReportConfig, probe_report
from ..probes.steering import SteerConfig, steer_experiment
from ..probes.store import atomic_write_json
from ..tasks import get_task
from . import beliefs, demo_view, determinism, forced, plots, readings, report, spec_trace, thinking_view
from .common import (
    check_writable_parent,
    progress_bar,
    save_fig,
    staged_output,
    write_json,
)
from .demo_view import eval_section, probe_section, section

SIZES = {  # prompts per step: (full toy, quick toy for tests, smollm2)
    "n_eval": (200, 40, 100), "n_harvest": (300, 60, 120), "n_forced": (40, 8, 20), "n_trace": (20, 6, 4),
    "n_steer": (100, 16, 30), "n_determinism": (4, 2, 2),
}


@dataclass
class DemoConfig:
    """What `beliefscope demo` runs."""

    out: str = "runs/demo"  # report folder (replaced atomically)
    model: str = "target"  # "target" (toy checkpoints) or "smollm2" (the real model, natural prompts)
    draft: str = "draft"  # toy draft model (ignored for smollm2, which drafts with early exit)
    quick: bool = False  # tiny sizes (tests); numbers are then noisy
    seed: int = 0  # harvest seed; other steps use fixed seeds that differ from it
    folds: int = 5  # GroupKFold folds of the probe report (3 with quick)
    steer_alpha: float = 3.0  # steering norm in units of the mean residual norm (toy: 3 flips ~90%)
    progress: bool = True  # tqdm bars on stderr

    def size(self, key: str) -> int:
        full, quick, real = SIZES[key]
        return real if self.real else quick if self.quick else full

    @property
    def real(self) -> bool:
        return model_profile(self.model).pretrained


def _plan(cfg: DemoConfig) -> dict:
    """Per-model settings: rendering, events, hooks, drafter."""
    if cfg.real:
        return {"rendering": "natural", "events": "1-6", "train_events": "1-4", "split": "train+heldout",
                "layers": "2,5,8,11,14,17,20,23,26,29", "dtype": "float16", "drafter": "early-exit:9",
                "trace_events": "2-5", "eval_events": "1-6", "determinism": {"others": "0,1,3",
                                                                                   "max_new_tokens": 8}}
    return {"rendering": "toy", "events": "1-12", "train_events": "1-8", "split": "train", "layers": "all",
            "dtype": "float32", "drafter": f"draft:{cfg.draft}", "trace_events": "4-12", "eval_events": "1-8",
            "determinism": {"others": "0,1,3,7", "max_new_tokens": 12}}


def _harvest(model, tok, name, plan, cfg: DemoConfig, out, random_init: bool, bar_factory):
    """Harvest exactly as `beliefscope harvest` would (same config hash), with an in-memory model."""

    hc = HarvestConfig(model=name, task="coinflip", rendering=plan["rendering"], fmt="direct", split=plan["split"],
                       n=cfg.size("n_harvest"), seed=cfg.seed, events=plan["events"], hooks="resid_post",
                       layers=plan["layers"], dtype=plan["dtype"], random_init_seed=0)
    examples = make_examples(hc)
    targets = [(model, out, "model")]
    if random_init:
        targets.append((random_init_like(model, hc.random_init_seed), os.path.join(out, "random_init"),
                        "random_init"))
    stores = []
    for m, path, role in targets:
        bar = bar_factory(f"harvest {os.path.basename(path)}")
        stores.append(harvest(m, tok, examples, hc.hooks, hc.layers, path, config={**asdict(hc), "role": role},
                              dtype=hc.dtype, progress=lambda n, t, b=bar: (setattr(b, "total", t),
                                                                            b.update(n - b.n))))
        bar.close()
    return stores, asdict(hc)


def _probe(stores, folder, plan, cfg: DemoConfig, bar_factory, positions: str = "after_first_event") -> dict:

    rc = ReportConfig(label="state", positions=positions, folds=3 if cfg.quick else cfg.folds,
                      train_events=plan["train_events"])
    bar = bar_factory(f"probe {os.path.basename(folder)}")
    bar.total = len(stores[0].hooks)
    rep = probe_report(stores[0], rc, stores[1] if len(stores) > 1 else None, out=folder, progress=bar.update)
    bar.close()
    data = rep.to_json()
    atomic_write_json(os.path.join(folder, "report.json"), data)
    return data


def _relocate_paths(obj, old: str, new: str):
    """Replace the temporary folder prefix in every string of a JSON-like object."""
    if isinstance(obj, str):
        return obj.replace(old, new)
    if isinstance(obj, list):
        return [_relocate_paths(x, old, new) for x in obj]
    if isinstance(obj, dict):
        return {k: _relocate_paths(v, old, new) for k, v in obj.items()}
    return obj


def _fix_probe_folders(tmp: str, final: str) -> None:
    """Probe folders record their store's absolute path: point them at the final folder."""

    for name in ("target", "target-answer-token", "draft"):
        folder = os.path.join(tmp, "probes", name)
        if not os.path.isdir(folder):
            continue
        probe = LinearProbe.load(folder)
        probe.meta = _relocate_paths(probe.meta, tmp, final)
        probe.save(folder)
        rpath = os.path.join(folder, "report.json")
        with open(rpath) as f:
            atomic_write_json(rpath, _relocate_paths(json.load(f), tmp, final))


def featured_prompt(plan) -> str:
    """A held-out story with many events (toy: 8; natural: 5), written out as text and parsed back."""

    if plan["rendering"] == "toy":
        return get_task("coinflip", rendering="toy").examples(1, 31337, (8, 8))[0].prompt
    return get_task("coinflip", rendering="natural", split="heldout").examples(1, 31337, (5, 5))[0].prompt


@dataclass
class DemoRun:
    """What the demo's steps share: each step reads what earlier ones left here and adds its own."""

    cfg: DemoConfig  # the demo's settings
    plan: dict  # per-model settings (_plan)
    tmp: str  # staging folder, renamed to cfg.out at the end
    bars: typing.Callable  # bars(desc, total=None) -> a progress bar (silent without cfg.progress)
    summary: dict = field(default_factory=dict)  # what summary.json will hold, by step
    sections: list = field(default_factory=list)  # report sections, in the order the steps add them
    model: typing.Any = None  # the target (a TransformerBridge), loaded by the first step
    tok: typing.Any = None  # its tokenizer
    draft: tuple | None = None  # (draft model, tokenizer); None for a pretrained target
    stores: list = field(default_factory=list)  # the target's activation stores: model, random-init twin
    draft_stores: list | None = None  # the draft's store (toy only)

    @property
    def figs(self) -> str:
        return os.path.join(self.tmp, "figures")

    def probes(self, name: str = "target") -> str:
        return os.path.join(self.tmp, "probes", name)


def _load(run: DemoRun) -> None:

    run.model, run.tok = load_model(run.cfg.model)
    run.draft = None if run.cfg.real else load_model(run.cfg.draft)


def _evaluate(run: DemoRun) -> None:

    ev = evaluate(run.model, "coinflip", run.plan["eval_events"], run.cfg.size("n_eval"), 12345, tokenizer=run.tok,
                  rendering=run.plan["rendering"])
    run.summary["eval"] = {**ev, "model": run.cfg.model}
    run.sections.append(eval_section(run.summary["eval"]))


def _harvest_step(run: DemoRun) -> None:
    cfg, plan = run.cfg, run.plan
    run.stores, hcfg = _harvest(run.model, run.tok, cfg.model, plan, cfg, os.path.join(run.tmp, "acts", "target"),
                                True, run.bars)
    if run.draft is not None:
        run.draft_stores, _ = _harvest(run.draft[0], run.draft[1], cfg.draft, plan, cfg,
                                       os.path.join(run.tmp, "acts", "draft"), False, run.bars)
    run.summary["harvest"] = {"config": hcfg, "target_rows": run.stores[0].n_rows, "target_store": run.stores[0].path,
                              "draft_store": run.draft_stores[0].path if run.draft_stores else None}


def _probes(run: DemoRun) -> None:
    s = run.summary
    s["probe"] = _probe(run.stores, run.probes(), run.plan, run.cfg, run.bars)
    if run.draft_stores:
        s["draft_probe"] = _probe(run.draft_stores, run.probes("draft"), run.plan, run.cfg, run.bars)
    # The toy target computes the state at the question token rather than keeping a running state
    # (probes at event tokens stay far below the answer-token probe): fit that readout too, and
    # steer with it.
    s["probe_answer_token"] = _probe(run.stores, run.probes("target-answer-token"), run.plan, run.cfg, run.bars,
                                     positions="last")
    run.sections.append(probe_section(s, run.figs))
    run.sections.append(probe_section(s, run.figs, key="probe_answer_token"))


def _beliefs(run: DemoRun) -> None:

    best = run.summary["probe"]["best_layer"]
    b = beliefs.main(beliefs.BeliefsConfig(model=run.cfg.model, probes=run.probes(), prompt=featured_prompt(run.plan),
                                           out=os.path.join(run.figs, "beliefs.png"), layer=best),
                     bridge=run.model, tok=run.tok)
    run.summary["beliefs"] = b
    run.sections.append(section("Belief trajectory of one story", readings.reading_beliefs(b), b["files"],
                                 ["Probe P(heads) at every layer and token; the strip below marks the true state.",
                                  f"Layer {best} over the tokens, true state as a step, forced answers as squares.",
                                  "Logit lens: the class words' probability at every block and token, read through "
                                  "the model's own final norm and unembedding."],
                                 f"<p>Prompt: <code>{html.escape(b['prompt'])}</code></p>"))


def _forced(run: DemoRun) -> None:

    n = run.cfg.size("n_forced")
    with run.bars("forced answers", n) as bar:
        f = forced.main(forced.ForcedConfig(model=run.cfg.model, probes=run.probes(),
                                            out=os.path.join(run.figs, "forced.png"), n=n, seed=4242,
                                            events=run.plan["events"], rendering=run.plan["rendering"],
                                            layer=run.summary["probe"]["best_layer"]),
                        bridge=run.model, tok=run.tok, progress=bar.update)
    run.summary["forced"] = f
    run.sections.append(section("Forced answers vs probe at every event", readings.reading_forced(f), f["files"],
                                 ["Accuracy of both readouts and their agreement, by number of events completed.",
                                  "One story: forced answer (fork the KV cache, append the question) and probe."]))


def _trace(run: DemoRun) -> None:

    cfg, plan = run.cfg, run.plan
    drafter = ModelDrafter(run.draft[0]) if run.draft is not None else make_drafter(plan["drafter"], run.model)
    tcfg = spec_trace.TraceConfig(model=cfg.model, drafter=plan["drafter"], probes=run.probes(),
                                  draft_probes=run.probes("draft") if run.draft_stores else "",
                                  prompt=None, n=cfg.size("n_trace"), seed=777, events=plan["trace_events"],
                                  fmt="cot" if not cfg.real else "direct", rendering=plan["rendering"],
                                  gamma=4, max_new_tokens=24 if not cfg.real else 12,
                                  out=os.path.join(run.figs, "trace.png"))
    with run.bars("speculative trace", tcfg.n) as bar:
        t = spec_trace.main(tcfg, target=run.model, tok=run.tok, drafter=drafter, progress=bar.update)
    run.summary["trace"] = t
    run.sections.append({"group": "decoding", **section(
        "Speculative decoding: draft, verify, rollback", readings.reading_trace(t), t["files"],
        ["The target's KV cache around the first rejected draft of one request, coloured by the cache's own "
         "provenance labels (rejected entries kept for study).",
         "Drafted tokens accepted and rejected at each verify step of that request.",
         "At each rejection: the draft's and the target's probe P(heads) where the rejected token's claim is made, "
         "with the true state."])})


def _determinism(run: DemoRun) -> None:

    n = run.cfg.size("n_determinism")
    if not n:
        return
    dk = run.plan["determinism"]
    with run.bars("determinism", 2 * len(dk["others"].split(","))) as bar:
        d = determinism.main(determinism.DeterminismConfig(model=run.cfg.model, n=n,
                                                           out=os.path.join(run.figs, "determinism.png"),
                                                           quick=run.cfg.quick, fast_dtype="bfloat16", **dk),
                             bridge=run.model, tok=run.tok, progress=bar.update)
    run.summary["determinism"] = d
    run.sections.append({"group": "decoding", **section(
        "Determinism among other requests", readings.reading_determinism(d), d["files"],
        ["Distinct outputs per prompt against the number of co-batched requests."])})


def _steering_step(run: DemoRun) -> None:
    st = _steering(run.model, run.tok, run.probes("target-answer-token"),
                   run.summary["probe_answer_token"]["best_layer"], run.plan, run.cfg, run.bars)
    run.summary["steering"] = st
    path = os.path.join(run.figs, "steering.png")
    save_fig(plots.steering_chart(st["flip_rate"], st["random"]["flip_rates"], st["layer"], st["alpha"]), path)
    run.sections.append(section("Steering along the probe direction", readings.reading_steering(st), [path],
                                 ["Answers flipped by adding the probe direction, and by random directions of the "
                                  "same norm (one tick each)."],
                                 report.table([st], ["layer", "alpha", "added_norm", "flip_rate",
                                                     "baseline_accuracy", "n_prompts"])))


def _thinking_step(run: DemoRun) -> None:
    if not run.cfg.real:
        _thinking(run.model, run.tok, run.probes(), run.plan, run.cfg, run.bars, run.tmp, run.figs, run.summary,
                  run.sections)


def _view(run: DemoRun) -> None:
    if not run.cfg.real:
        run.sections.append(demo_view.viewer_section(run.cfg, run.tmp, run.summary, run.bars))


# The demo, in order: (name, step). Each step is one analysis's run on what the earlier steps left
# in the DemoRun; the report is written after the last.
STEPS = (("load", _load), ("eval", _evaluate), ("harvest", _harvest_step), ("probes", _probes),
         ("beliefs", _beliefs), ("forced", _forced), ("trace", _trace), ("determinism", _determinism),
         ("steering", _steering_step), ("thinking", _thinking_step), ("view", _view))


def main(cfg: DemoConfig) -> dict:
    """Run the whole demo into ``cfg.out``; returns the summary (also written as summary.json)."""
    out = check_writable_parent(cfg.out)  # fail before any work if DIR's parent is not writable
    t_all = time.perf_counter()
    threads = torch.get_num_threads()
    if not cfg.real:  # toy matmuls are too small to gain from threads, and threads thrash on a busy CPU
        torch.set_num_threads(1)
    timings = {}
    try:
        with staged_output(out) as tmp, progress_bar("demo", total=len(STEPS) + 1, disable=not cfg.progress) as outer:
            run = DemoRun(cfg=cfg, plan=_plan(cfg), tmp=tmp,
                          bars=lambda desc, total=None: progress_bar(desc, total, disable=not cfg.progress))
            os.makedirs(run.figs)
            for name, step in STEPS:
                outer.set_postfix_str(name)
                t = time.perf_counter()
                step(run)
                timings[name] = round(time.perf_counter() - t, 2)
                outer.update(1)
            outer.set_postfix_str("report")
            t = time.perf_counter()
            summary = _write_report(run, out, t_all, timings)
            timings["report"] = round(time.perf_counter() - t, 2)
            write_json(os.path.join(tmp, "summary.json"), summary)
            _fix_probe_folders(tmp, out)
            outer.update(1)
    finally:
        torch.set_num_threads(threads)
    return summary


def _write_report(run: DemoRun, out: str, t_all: float, timings: dict) -> dict:
    """report.html from the steps' sections (the validated instrument first, then the lazy target as
    the contrast, then decoding and determinism, then the viewer); the summary, paths made final."""
    cfg, tmp = run.cfg, run.tmp
    run.sections.sort(key=lambda sec: demo_view.GROUPS.index(sec.get("group", "target")))
    summary = {**run.summary, "model": cfg.model, "config": asdict(cfg), "timings_seconds": timings,
               "seconds_total": round(time.perf_counter() - t_all, 1)}
    summary = _relocate_paths(summary, tmp, out)
    summary["timings_seconds"] = timings  # the same dict: the report step's time lands in it
    summary["files"] = sorted(os.path.relpath(os.path.join(r, x), tmp) for r, _, fs in os.walk(run.figs) for x in fs)
    meta = (f"model <code>{cfg.model}</code> · {time.strftime('%Y-%m-%d %H:%M')} · "
            f"{summary['seconds_total']} s on {os.cpu_count()} CPU cores"
            + (" · quick sizes (noisy numbers)" if cfg.quick else ""))
    with open(os.path.join(tmp, "report.html"), "w") as fh:
        fh.write(report.render(f"beliefscope demo: {cfg.model}", meta, run.sections))
    return summary


def _thinking(model, tok, pdir, plan, cfg: DemoConfig, bars, tmp, figs, summary, sections) -> None:
    """Thinking States beside the lazy target: harvest + probe it like the target, then the pair figure."""

    thinking, ttok = load_model("thinking")
    stores, _ = _harvest(thinking, ttok, "thinking", plan, cfg, os.path.join(tmp, "acts", "thinking"), False, bars)
    tdir = os.path.join(tmp, "probes", "thinking")
    summary["thinking_probe"] = _probe(stores, tdir, plan, cfg, bars)
    th = thinking_view.demo_step(model, tok, pdir, tdir, featured_prompt(plan), figs)
    summary["thinking"] = th
    sections.append(demo_view.instrument_section(cfg, summary))
    sections.append({**section(thinking_view.TITLE, readings.reading_thinking(th), th["files"], thinking_view.CAPTIONS),
                     "group": "instrument"})


def _steering(model, tok, pdir, layer, plan, cfg: DemoConfig, bars) -> dict:

    probe = LinearProbe.load(pdir)
    examples = get_task("coinflip", rendering=plan["rendering"], fmt="direct", split="all").examples(
        cfg.size("n_steer"), 777, (1, 8) if not cfg.real else (1, 4))
    bar = bars("steering", len(examples))
    res = steer_experiment(model, tok, probe, examples, SteerConfig(layer, cfg.steer_alpha), progress=bar.update)
    bar.close()
    return res
