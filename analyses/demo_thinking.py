"""`beliefscope demo --model smollm2-thinking` (or any Thinking States model): the report on a model
that writes its belief down.

Four sections, each opened by a sentence computed from its numbers: answers and thoughts by length
band (held-out wordings for natural English); the belief instrument on the model beside the same
kind of model without thoughts (SmolLM2 zero-shot for ``smollm2-thinking``, the lazy toy
``target`` for the toy ones), with the random-init and control baselines; one held-out story token
by token (truth, thought and forced answer at every event); and the causal check (swapping S at one
chunk). Written like the main demo: into a temporary folder renamed at the end.

Usage: ``main(DemoConfig(out="runs/demo-thinking", model="smollm2-thinking"))``.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict

from ..models.evaluate import evaluate_bands
from ..models.load import load_model
from ..models.profile import model_profile
from . import readings, report
from .beliefs import BeliefsConfig
from .beliefs import main as beliefs_main
from .common import check_writable_parent, progress_bar, staged_output, write_json
from .demo import DemoConfig, featured_prompt
from .demo_view import section
from .instrument import InstrumentConfig, prompts_read, table_lines, write
from .instrument import main as instrument_main

# prompts per step: (full, quick for tests)
THINKING_SIZES = {"n_eval": (40, 6), "n_train": (60, 16), "n_test": (20, 6), "causal_n": (20, 4)}


def _size(cfg: DemoConfig, key: str) -> int:
    full, quick = THINKING_SIZES[key]
    return quick if cfg.quick else full


def _eval_section(ev: dict) -> dict:
    rows = [{"events": band, "answer accuracy": r["answer_accuracy"], "thought accuracy": r.get("thought_accuracy")}
            for band, r in ev.items()]
    first, last = rows[0], rows[-1]
    reading = (f"The model answers {readings.pct(first['answer accuracy'])} of {first['events']}-event stories "
               f"correctly and {readings.pct(last['answer accuracy'])} at {last['events']} events; its thoughts "
               f"name the true state after {readings.pct(first['thought accuracy'])} and "
               f"{readings.pct(last['thought accuracy'])} of the chunks.")
    return {"title": "What the model answers, and what it thinks, by story length", "reading": reading,
            "figures": [], "html": report.table(rows, ["events", "answer accuracy", "thought accuracy"])}


def main(cfg: DemoConfig) -> dict:
    """Run the Thinking States demo into ``cfg.out``; returns the summary (also summary.json)."""

    profile = model_profile(cfg.model)
    if not profile.thinking:
        raise ValueError(f"{cfg.model!r} is not a Thinking States model: run `beliefscope demo --model {cfg.model}` "
                         "without thoughts through the main demo (target or smollm2)")
    out = check_writable_parent(cfg.out)
    t_all = time.perf_counter()
    contrast = "smollm2" if profile.rendering == "natural" else "target"
    bar = progress_bar("demo", total=4, disable=not cfg.progress)
    summary, sections = {"model": cfg.model, "contrast": contrast, "config": asdict(cfg)}, []
    with staged_output(out) as tmp:
        figs = os.path.join(tmp, "figures")
        os.makedirs(figs)
        bar.set_postfix_str("eval")
        model, tok = load_model(cfg.model)
        bands = ("1-8", "9-16", "17-32")
        summary["eval"] = evaluate_bands(model, tok, "coinflip", _size(cfg, "n_eval"), bands=bands,
                                         rendering=profile.rendering)
        sections.append(_eval_section(summary["eval"]))
        bar.update(1)

        bar.set_postfix_str("instrument")
        icfg = InstrumentConfig(models=(cfg.model, contrast), n_train=_size(cfg, "n_train"),
                                n_test=_size(cfg, "n_test"), bands=bands, causal_n=_size(cfg, "causal_n"))
        inner = progress_bar("prompts read", total=prompts_read(icfg), disable=not cfg.progress)
        inst = instrument_main(icfg, progress=inner.update)
        inner.close()
        files = write(inst, os.path.join(figs, "instrument"))
        summary["instrument"] = inst
        verdicts = " ".join(f"{r['verdict']}." for r in inst["models"].values())
        table = "<pre>" + "\n".join(table_lines(inst)).replace("&", "&amp;").replace("<", "&lt;") + "</pre>"
        sections.append(section(f"The belief instrument: {cfg.model} beside {contrast}", verdicts, files[2:3],
                                 ["Accuracy against the true state at every event boundary of held-out stories: the "
                                  "best-layer probe, the forced answer, the thought, and the probe on a control "
                                  "task."], table))
        bar.update(1)

        bar.set_postfix_str("beliefs")
        story = os.path.join(figs, "story.png")
        b = beliefs_main(BeliefsConfig(model=cfg.model, prompt=featured_prompt({"rendering": profile.rendering}),
                                       out=story), bridge=model, tok=tok)
        summary["beliefs"] = b
        reading = (f"On one held-out story of {len(b['thoughts'])} events the thoughts name the true state at "
                   f"{readings.pct(b['thought_accuracy'])} of the events; the answer is {b['answer']}.")
        sections.append(section("One story, token by token", reading, [story],
                                 ["Truth at every token; the model's thought and its forced answer at every event "
                                  "boundary."]))
        bar.update(1)

        bar.set_postfix_str("report")
        c = inst["models"][cfg.model]["causal"]
        sections.append({"title": "Is the state causal? Swapping S at one chunk", "figures": [], "html": "",
                         "reading": f"Swapping S at one chunk for another state's changes the answer in "
                                    f"{readings.pct(c['answer_flip_rate_swap'])} of {c['n']} stories and every later "
                                    f"thought follows the swapped state in "
                                    f"{readings.pct(c['downstream_thoughts_follow_swap'])}; random vectors of equal "
                                    f"norm change the answer in {readings.pct(c['answer_flip_rate_random'])}."})
        summary["seconds_total"] = round(time.perf_counter() - t_all, 1)
        meta = (f"model <code>{cfg.model}</code> · {time.strftime('%Y-%m-%d %H:%M')} · "
                f"{summary['seconds_total']} s on {os.cpu_count()} CPU cores"
                + (" · quick sizes (noisy numbers)" if cfg.quick else ""))
        with open(os.path.join(tmp, "report.html"), "w") as fh:
            fh.write(report.render(f"beliefscope demo: {cfg.model}", meta, sections))
        summary["files"] = sorted(os.path.relpath(os.path.join(r, x), tmp) for r, _, fs in os.walk(figs) for x in fs)
        write_json(os.path.join(tmp, "summary.json"), summary)
        bar.update(1)
    bar.close()
    return summary
