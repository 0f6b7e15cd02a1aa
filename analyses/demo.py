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
from dataclasses import asdict, dataclass

import torch
from beliefscope.analyses import demo_view, plots, report
from beliefscope.analyses.common import (
    check_writable_parent,
    progress_bar,
    save_fig,
    staged_output,
    write_json,
)
from beliefscope.models.profile import model_profile

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
    from beliefscope.probes.harvest import HarvestConfig, harvest, make_examples, random_init_like

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
    from beliefscope.probes.report import ReportConfig, probe_report
    from beliefscope.probes.store import atomic_write_json

    rc = ReportConfig(label="state", positions=positions, folds=3 if cfg.quick else cfg.folds,
                      train_events=plan["train_events"])
    bar = bar_factory(f"probe {os.path.basename(folder)}")
    rep = probe_report(stores[0], rc, stores[1] if len(stores) > 1 else None, out=folder,
                       progress=lambda m: bar.set_postfix_str(m))
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
    from beliefscope.probes.linear import LinearProbe
    from beliefscope.probes.store import atomic_write_json

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
    from beliefscope.tasks import get_task

    if plan["rendering"] == "toy":
        return get_task("coinflip", rendering="toy").examples(1, 31337, (8, 8))[0].prompt
    return get_task("coinflip", rendering="natural", split="heldout").examples(1, 31337, (5, 5))[0].prompt


def main(cfg: DemoConfig) -> dict:
    """Run the whole demo into ``cfg.out``; returns the summary (also written as summary.json)."""
    out = check_writable_parent(cfg.out)  # fail before any work if DIR's parent is not writable
    t_all = time.perf_counter()
    plan = _plan(cfg)
    steps = "load eval harvest probes beliefs forced trace determinism steering thinking view report".split()
    outer = progress_bar("demo", total=len(steps), disable=not cfg.progress)
    bars = lambda desc, total=None: progress_bar(desc, total, disable=not cfg.progress)
    timings, summary, sections = {}, {}, []

    def step(name):
        outer.set_postfix_str(name)
        timings[name] = time.perf_counter()

    def done(name):
        timings[name] = round(time.perf_counter() - timings[name], 2)
        outer.update(1)

    threads = torch.get_num_threads()
    if not cfg.real:  # toy matmuls are too small to gain from threads, and threads thrash on a busy CPU
        torch.set_num_threads(1)
    try:
        return _run(cfg, out, plan, t_all, outer, bars, step, done, timings, summary, sections)
    finally:
        torch.set_num_threads(threads)
        outer.close()


def _run(cfg, out, plan, t_all, outer, bars, step, done, timings, summary, sections) -> dict:
    with staged_output(out) as tmp:
        figs = os.path.join(tmp, "figures")
        os.makedirs(figs)
        step("load")
        from beliefscope.models.load import load_model

        model, tok = load_model(cfg.model)
        draft = None if cfg.real else load_model(cfg.draft)
        done("load")

        step("eval")
        from beliefscope.models.evaluate import evaluate

        n_eval, ev_seed = cfg.size("n_eval"), 12345
        summary["eval"] = evaluate(model, "coinflip", plan["eval_events"], n_eval, ev_seed, tokenizer=tok,
                                   rendering=plan["rendering"])
        summary["eval"]["model"] = cfg.model
        sections.append(_eval_section(summary["eval"]))
        done("eval")

        step("harvest")
        stores, hcfg = _harvest(model, tok, cfg.model, plan, cfg, os.path.join(tmp, "acts", "target"), True, bars)
        dstores = None
        if draft is not None:
            dstores, _ = _harvest(draft[0], draft[1], cfg.draft, plan, cfg, os.path.join(tmp, "acts", "draft"),
                                  False, bars)
        summary["harvest"] = {"config": hcfg, "target_rows": stores[0].n_rows,
                              "target_store": stores[0].path, "draft_store": dstores[0].path if dstores else None}
        done("harvest")

        step("probes")
        pdir = os.path.join(tmp, "probes", "target")
        summary["probe"] = _probe(stores, pdir, plan, cfg, bars)
        if dstores:
            summary["draft_probe"] = _probe(dstores, os.path.join(tmp, "probes", "draft"), plan, cfg, bars)
        # The toy target computes the state at the question token rather than keeping a running
        # state (probes at event tokens stay far below the answer-token probe): fit that readout
        # too, and steer with it.
        pdir_last = os.path.join(tmp, "probes", "target-answer-token")
        summary["probe_answer_token"] = _probe(stores, pdir_last, plan, cfg, bars, positions="last")
        sections.append(_probe_section(summary, figs))
        sections.append(_probe_section(summary, figs, key="probe_answer_token"))
        done("probes")
        best = summary["probe"]["best_layer"]

        step("beliefs")
        from beliefscope.analyses import beliefs

        b = beliefs.main(beliefs.BeliefsConfig(model=cfg.model, probes=pdir, prompt=featured_prompt(plan),
                                               out=os.path.join(figs, "beliefs.png"), layer=best),
                         bridge=model, tok=tok)
        summary["beliefs"] = b
        sections.append(_section("Belief trajectory of one story", report.reading_beliefs(b), b["files"],
                                 ["Probe P(heads) at every layer and token; the strip below marks the true state.",
                                  f"Layer {best} over the tokens, true state as a step, forced answers as squares."],
                                 f"<p>Prompt: <code>{html.escape(b['prompt'])}</code></p>"))
        done("beliefs")

        step("forced")
        from beliefscope.analyses import forced

        bar = bars("forced answers", cfg.size("n_forced"))
        f = forced.main(forced.ForcedConfig(model=cfg.model, probes=pdir, out=os.path.join(figs, "forced.png"),
                                            n=cfg.size("n_forced"), seed=4242, events=plan["events"],
                                            rendering=plan["rendering"], layer=best),
                        bridge=model, tok=tok, progress=bar.update)
        bar.close()
        summary["forced"] = f
        sections.append(_section("Forced answers vs probe at every event", report.reading_forced(f), f["files"],
                                 ["Accuracy of both readouts and their agreement, by number of events completed.",
                                  "One story: forced answer (fork the KV cache, append the question) and probe."]))
        done("forced")

        step("trace")
        from beliefscope.analyses import spec_trace
        from beliefscope.decoding import ModelDrafter, make_drafter

        drafter = ModelDrafter(draft[0]) if draft is not None else make_drafter(plan["drafter"], model)
        tcfg = spec_trace.TraceConfig(model=cfg.model, drafter=plan["drafter"], probes=pdir,
                                      draft_probes=os.path.join(tmp, "probes", "draft") if dstores else "",
                                      prompt=None, n=cfg.size("n_trace"), seed=777, events=plan["trace_events"],
                                      fmt="cot" if not cfg.real else "direct", rendering=plan["rendering"],
                                      gamma=4, max_new_tokens=24 if not cfg.real else 12,
                                      out=os.path.join(figs, "trace.png"))
        bar = bars("speculative trace", cfg.size("n_trace") + (0 if tcfg.prompt is None else 1))
        t = spec_trace.main(tcfg, target=model, tok=tok, drafter=drafter, progress=bar.update)
        bar.close()
        summary["trace"] = t
        sections.append({"group": "decoding", **_section("Speculative decoding: draft, verify, rollback",
                                                         report.reading_trace(t), t["files"],
                                 ["The target's KV cache around the first rejected draft of one request, coloured "
                                  "by the cache's own provenance labels (rejected entries kept for study).",
                                  "Drafted tokens accepted and rejected at each verify step of that request.",
                                  "At each rejection: the draft's and the target's probe P(heads) where the "
                                  "rejected token's claim is made, with the true state."])})
        done("trace")

        step("determinism")
        n_det = cfg.size("n_determinism")
        if n_det:
            from beliefscope.analyses import determinism

            dk = plan["determinism"]
            bar = bars("determinism", 2 * len(dk["others"].split(",")))
            d = determinism.main(determinism.DeterminismConfig(model=cfg.model, prompts=n_det, out=os.path.join(
                                 figs, "determinism.png"), quick=cfg.quick, fast_dtype="bfloat16", **dk), bridge=model,
                                 tok=tok, progress=bar.update)
            bar.close()
            summary["determinism"] = d
            sections.append({"group": "decoding", **_section(
                "Determinism among other requests", report.reading_determinism(d), d["files"],
                ["Distinct outputs per prompt against the number of co-batched requests."])})
        done("determinism")

        step("steering")
        summary["steering"] = _steering(model, tok, pdir_last, summary["probe_answer_token"]["best_layer"], plan,
                                        cfg, bars)
        st = summary["steering"]
        save_fig(plots.steering_chart(st["flip_rate"], st["random"]["flip_rates"], st["layer"], st["alpha"]),
                 os.path.join(figs, "steering.png"))
        sections.append(_section("Steering along the probe direction", report.reading_steering(st),
                                 [os.path.join(figs, "steering.png")],
                                 ["Answers flipped by adding the probe direction, and by random directions of "
                                  "the same norm (one tick each)."],
                                 report.table([st], ["layer", "alpha", "added_norm", "flip_rate",
                                                     "baseline_accuracy", "n_prompts"])))
        done("steering")

        step("thinking")
        if not cfg.real:
            _thinking(model, tok, pdir, plan, cfg, bars, tmp, figs, summary, sections)
        done("thinking")

        step("view")
        if not cfg.real:
            sections.append(demo_view.viewer_section(cfg, tmp, summary, bars))
        done("view")
        # the report leads with what is true: the validated instrument on the model whose beliefs are
        # known, then the lazy target as the contrast, then decoding and determinism, then the viewer
        sections.sort(key=lambda sec: demo_view.GROUPS.index(sec.get("group", "target")))

        step("report")
        summary["model"] = cfg.model
        summary["config"] = asdict(cfg)
        summary["timings_seconds"] = timings
        summary["seconds_total"] = round(time.perf_counter() - t_all, 1)
        summary = _relocate_paths(summary, tmp, out)
        summary["files"] = sorted(os.path.relpath(os.path.join(r, x), tmp) for r, _, fs in os.walk(figs) for x in fs)
        meta = (f"model <code>{cfg.model}</code> · {time.strftime('%Y-%m-%d %H:%M')} · "
                f"{summary['seconds_total']} s on {os.cpu_count()} CPU cores"
                + (" · quick sizes (noisy numbers)" if cfg.quick else ""))
        html_text = report.render(f"beliefscope demo: {cfg.model}", meta, sections)
        with open(os.path.join(tmp, "report.html"), "w") as fh:
            fh.write(html_text)
        done("report")
        summary["timings_seconds"] = timings
        write_json(os.path.join(tmp, "summary.json"), summary)
        _fix_probe_folders(tmp, out)
    return summary


def _thinking(model, tok, pdir, plan, cfg: DemoConfig, bars, tmp, figs, summary, sections) -> None:
    """Thinking States beside the lazy target: harvest + probe it like the target, then the pair figure."""
    from beliefscope.analyses import thinking_view
    from beliefscope.models.load import load_model

    thinking, ttok = load_model("thinking")
    stores, _ = _harvest(thinking, ttok, "thinking", plan, cfg, os.path.join(tmp, "acts", "thinking"), False, bars)
    tdir = os.path.join(tmp, "probes", "thinking")
    summary["thinking_probe"] = _probe(stores, tdir, plan, cfg, bars)
    th = thinking_view.demo_step(model, tok, pdir, tdir, featured_prompt(plan), figs)
    summary["thinking"] = th
    sections.append(demo_view.instrument_section(cfg, summary))
    sections.append({**_section(thinking_view.TITLE, report.reading_thinking(th), th["files"], thinking_view.CAPTIONS),
                     "group": "instrument"})


def _steering(model, tok, pdir, layer, plan, cfg: DemoConfig, bars) -> dict:
    from beliefscope.probes.linear import LinearProbe
    from beliefscope.probes.steering import SteerConfig, steer_experiment
    from beliefscope.tasks import get_task

    probe = LinearProbe.load(pdir)
    examples = get_task("coinflip", rendering=plan["rendering"], fmt="direct", split="all").examples(
        cfg.size("n_steer"), 777, (1, 8) if not cfg.real else (1, 4))
    bar = bars("steering", len(examples))
    res = steer_experiment(model, tok, probe, examples, SteerConfig(layer, cfg.steer_alpha), progress=bar.update)
    bar.close()
    return res


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _section(title, reading, files, captions, extra="") -> dict:
    return {"title": title, "reading": reading, "html": extra,
            "figures": [(_read(p), c) for p, c in zip(files, captions)]}


def _eval_section(ev: dict) -> dict:
    rows = [{"events": k, "answer accuracy": v,
             "chain-of-thought exact match": ev.get("exact_match_by_events", {}).get(k)}
            for k, v in ev["answer_accuracy_by_events"].items()]
    return {"title": "Task accuracy", "reading": report.reading_eval(ev), "figures": [],
            "html": report.table(rows, ["events", "answer accuracy", "chain-of-thought exact match"])}


def _probe_section(summary: dict, figs: str, key: str = "probe") -> dict:
    rep = summary[key]
    rows = rep["layers"]
    fig = plots.probe_layers_chart([r["layer"] for r in rows], [r["accuracy"] for r in rows],
                                   [r["control_accuracy"] for r in rows],
                                   [r["random_init_accuracy"] or float("nan") for r in rows],
                                   rep["embedding_accuracy"], rep["majority_accuracy"])
    path = os.path.join(figs, "probe_layers.png" if key == "probe" else f"{key}_layers.png")
    data = save_fig(fig, path)
    reading = report.reading_probe(rep, "the target")
    if key != "probe":
        return {"title": "Probe at the question token (where the toy target computes its answer)",
                "reading": reading + " Steering below uses this probe's direction.",
                "figures": [(data, "Same controls, rows restricted to the last prompt token.")],
                "html": report.table(rep["layers"], ["layer", "accuracy", "control_accuracy", "selectivity",
                                                     "random_init_accuracy"])}
    if "draft_probe" in summary:
        d = summary["draft_probe"]
        dbest = next(r for r in d["layers"] if r["layer"] == d["best_layer"])
        reading += (" The draft model's own probe (needed for the trace below) reaches "
                    f"{report._pct(dbest['accuracy'])} at its best layer L{d['best_layer']}.")
    cols = ["layer", "accuracy", "control_accuracy", "selectivity", "random_init_accuracy",
            "accuracy_event_tokens", "accuracy_other_tokens", "heldout_length_accuracy", "heldout_template_accuracy"]
    cols = [c for c in cols if any(r.get(c) is not None for r in rows)]
    return {"title": "Linear probes of the coin's state, with controls", "reading": reading,
            "figures": [(data, "Held-out-by-prompt accuracy per layer, with the control task, a random-init "
                               "model, the embedding-only probe and the majority class.")],
            "html": report.table(rows, cols)}
