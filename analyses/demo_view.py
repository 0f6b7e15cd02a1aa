"""Sections of the demo's report: a generic one (title, reading, figures with captions), the task
accuracy, the probe layers with their controls, the validated instrument on ``thinking`` (the
report's opening: thought and forced-answer accuracy by band, probe vs thought, the causal check)
and the belief viewer on the demo's stories (a link to ``view.html`` beside the report)."""

from __future__ import annotations

import html
import os

from ..probes.chart import probe_layers_figure
from . import readings, report
from .common import save_fig
from .instrument import InstrumentConfig, table_lines
from .instrument import main as instrument_main
from .view import ViewConfig
from .view import main as view_main

GROUPS = ("instrument", "target", "decoding", "viewer")  # the report's order of sections


def instrument_section(cfg, summary: dict) -> dict:
    """`instrument` on ``thinking`` alone (two bands, the causal check); numbers into ``summary``."""

    q = cfg.quick
    inst = instrument_main(InstrumentConfig(models=("thinking",), n_train=16 if q else 60, n_test=6 if q else 20,
                                            bands=("1-8", "9-16"), causal_n=4 if q else 20))
    summary["thinking_instrument"] = inst
    table = "<pre>" + html.escape("\n".join(table_lines(inst))) + "</pre>"
    return {"title": "The validated instrument: thinking, a model whose beliefs are known", "figures": [],
            "reading": readings.reading_instrument(inst["models"]["thinking"]), "html": table, "group": "instrument"}


def viewer_section(cfg, tmp: str, summary: dict, bars) -> dict:
    """The belief viewer on the demo's stories: thinking beside the target, decoded speculatively."""

    n = 2 if cfg.quick else 6
    bar = bars("viewer", 3 * n)
    v = view_main(ViewConfig(models=("thinking", cfg.model), events="9-16", n=n, n_train=40 if cfg.quick else 120,
                             drafter=f"draft:{cfg.draft}", out=os.path.join(tmp, "view.html")), progress=bar.update)
    bar.close()
    v["out"], v["files"] = "view.html", ["view.html"]
    summary["view"] = v
    return {"title": "The belief viewer: every token, every layer", "figures": [], "reading": readings.reading_view(v),
            "group": "viewer",
            "html": f"<p><a href='view.html'>view.html</a> ({v['bytes']:,} bytes, one file, no network): hover or "
                    "focus a token for the truth, the probe at every layer, the forced answer, the thought and the "
                    "KV-cache provenance of the speculative decode.</p>"}


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def section(title, reading, files, captions, extra="") -> dict:
    return {"title": title, "reading": reading, "html": extra,
            "figures": [(_read(p), c) for p, c in zip(files, captions)]}


def eval_section(ev: dict) -> dict:
    rows = [{"events": k, "answer accuracy": v,
             "chain-of-thought exact match": ev.get("exact_match_by_events", {}).get(k)}
            for k, v in ev["answer_accuracy_by_events"].items()]
    return {"title": "Task accuracy", "reading": readings.reading_eval(ev), "figures": [],
            "html": report.table(rows, ["events", "answer accuracy", "chain-of-thought exact match"])}


def probe_section(summary: dict, figs: str, key: str = "probe") -> dict:
    rep = summary[key]
    rows = rep["layers"]
    fig = probe_layers_figure(rep)  # probe, twin, control where defined, every baseline, with intervals
    path = os.path.join(figs, "probe_layers.png" if key == "probe" else f"{key}_layers.png")
    data = save_fig(fig, path)
    reading = readings.reading_probe(rep, "the target")
    if key != "probe":
        return {"title": "Probe at the question token (where the toy target computes its answer)",
                "reading": reading + " Steering below uses this probe's direction.",
                "figures": [(data, "Same controls, rows restricted to the last prompt token.")],
                "html": report.table(rep["layers"], [c for c in ("layer", "accuracy", "control_accuracy",
                                                                 "selectivity", "random_init_accuracy")
                                                     if any(r.get(c) is not None for r in rows)])}
    if "draft_probe" in summary:
        d = summary["draft_probe"]
        dbest = next(r for r in d["layers"] if r["layer"] == d["best_layer"])
        reading += (" The draft model's own probe (needed for the trace below) reaches "
                    f"{readings.pct(dbest['accuracy'])} at its best layer L{d['best_layer']}.")
    cols = ["layer", "accuracy", "control_accuracy", "selectivity", "random_init_accuracy",
            "accuracy_event_tokens", "accuracy_other_tokens", "heldout_length_accuracy", "heldout_template_accuracy"]
    cols = [c for c in cols if any(r.get(c) is not None for r in rows)]
    return {"title": "Linear probes of the coin's state, with controls", "reading": reading,
            "figures": [(data, "Out-of-fold accuracy per layer (folds by prompt) with its 95% interval, beside the "
                               "random-init model, the control task where it is defined and every baseline.")],
            "html": report.table(rows, cols)}
