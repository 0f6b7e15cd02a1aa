"""`beliefscope instrument --acts STORE --probes DIR`: the instrument on your records, read from the store.

`instrument --data` runs the model over every record again (twice with the random-init twin) and fits its own
probes. With `--acts` it reads what `harvest --data` and `probe --out` already computed: every block's
out-of-fold accuracy, its strongest baseline and the margin over it, with intervals (`probe`'s report.json).
Only the forced answers need the model: they are read at every event end of the first `--n` records, beside
the probe at the report's best block, each record read by the fold probe that did not see it.

The verdict says two things, each with its numbers: whether any block reads the label beyond the strongest
baseline (out-of-fold), and how often the model's own answer names the state (forced answers against chance
and against the probe).

Usage (not run as a doctest: it loads a model)::

    res = main_store(InstrumentConfig(acts="acts/tracking", probes="probes/tracking", n=100))
    res["models"]["smollm2"]["verdict"]
"""

from __future__ import annotations

import json
import os

from ..models.load import load_model
from ..probes.crossfit import CrossFitted
from ..probes.honest import describe
from ..probes.report import is_data_store
from ..probes.store import ActivationStore
from ..tasks.records import DataConfig, load_data
from .common import check_probe_matches, load_probe
from .forced import forced_vs_probe_many


def checked_inputs(config) -> tuple:
    """(store, report, probe, cross-fitted probes, data, label): every refusal before the model loads."""
    store = ActivationStore.open(config.acts)
    if not is_data_store(store):
        raise ValueError(f"--acts {config.acts} holds a built-in task's prompts; --acts reads a store of your records "
                         "(harvest --data); for a task, run the instrument with --models")
    if not config.probes:
        raise ValueError("--acts needs the probes fitted on it: pass --probes DIR (from `beliefscope probe --acts "
                         f"{config.acts} --label NAME --out DIR`)")
    path = os.path.join(config.probes, "report.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: fit the probes with `beliefscope probe --acts {config.acts} --out "
                                f"{config.probes}`")
    with open(path) as f:
        report = json.load(f)
    if report.get("store_hash") != store.hash:
        raise ValueError(f"the probes at {config.probes} were fitted on another store ({report.get('store')}, "
                         f"config {report.get('store_hash')}), not {config.acts} ({store.hash}): fit them on this one")
    probe = load_probe(config.probes)
    crossfit = CrossFitted.load(config.probes, probe)
    if crossfit is None:
        raise ValueError(f"{config.probes} holds no cross-fitted probes (an older `probe --out`): fit it again")
    label = report["label"]
    if config.label and config.label != label:
        raise ValueError(f"--label {config.label!r}, but the probes at {config.probes} read {label!r}: pass --label "
                         f"{label} or fit probes for {config.label!r}")
    mapping = store.manifest["config"].get("data_config") or {}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in mapping.items()
              if k in DataConfig.__dataclass_fields__}
    data = load_data(config.data or store.manifest.get("data_source"), DataConfig(**fields))
    data.check_label(label)
    if not config.question.strip() and not data.has_questions():
        raise ValueError("the instrument forces an answer at every event end: pass --question (or a template over the "
                         f"record's fields), or give every record a {data.config.question_field!r} field")
    if config.n is not None and config.n < 1:
        raise ValueError(f"--n {config.n}: read at least 1 record")
    return store, report, probe, crossfit, data, label


def main_store(config, progress=None) -> dict:
    """The instrument from a store and its probes; a JSON-able dict shaped like `main_data`'s (one band, "all")."""
    store, report, probe, crossfit, data, label = checked_inputs(config)
    name = store.manifest["config"]["model"]
    best = next(r for r in report["layers"] if r["layer"] == report["best_layer"])
    n = len(data) if config.n is None else min(config.n, len(data))
    examples = [data.example(i, label, question=config.question, answers=config.answers) for i in range(n)]
    model, tok = load_model(name)
    check_probe_matches(probe, model, name)
    res = forced_vs_probe_many(model, tok, probe, best["hook"], examples, progress, crossfit=crossfit)
    rates, ci = res.rates(), res.intervals()
    band = {"n_boundaries": rates["n_boundaries"], "probe_accuracy": rates["probe_accuracy"],
            "forced_accuracy": rates["forced_accuracy"], "probe_forced_agreement": rates["agreement"],
            "intervals": ci, "scored_on": res.scored_on}
    out = {"task": f"data:{label}", "state_names": list(data.classes[label]), "best_layer": best["layer"],
           "hook": best["hook"],
           "layer_chosen_on": f"out-of-fold accuracy over every labelled token ({report['store']})",
           "bands": {"all": band}, "probe_layers": [_compact(r) for r in report["layers"]],
           "baselines": report.get("baselines", {}), "random_init_probe_accuracy": best.get("random_init_accuracy"),
           "verdict": store_verdict(name, label, best, band, report.get("n_groups"))}
    cfg = {"acts": config.acts, "probes": config.probes, "data": data.source, "label": label,
           "question": config.question or f"each record's {data.config.question_field!r}", "n_records": n}
    return {"config": cfg, "models": {name: out}}


def _compact(row: dict) -> dict:
    keys = ("layer", "hook", "accuracy", "accuracy_interval", "strongest_baseline", "strongest_baseline_accuracy",
            "margin", "mass_mean_accuracy", "random_init_accuracy")
    return {k: row[k] for k in keys if k in row}


def store_verdict(name: str, label: str, best: dict, band: dict, n_groups) -> str:
    """Readable (the best block against its strongest baseline) and answered (forced answers), with numbers."""
    m, lo, hi = best["margin"]
    base = describe(best["strongest_baseline"])
    alo, ahi = best["accuracy_interval"]
    read = (f"{best['hook']} reads {label!r} at {best['accuracy']:.2f} [{alo:.2f}, {ahi:.2f}] out-of-fold over "
            f"{n_groups} record groups, against {base} {best['strongest_baseline_accuracy']:.2f} (margin {m:+.2f} "
            f"[{lo:+.2f}, {hi:+.2f}])")
    read = (f"{name}: " + (read + ": readable beyond the strongest baseline" if lo > 0 else
                           "no block reads it beyond the strongest baseline: " + read))
    ci = band["intervals"]
    flo, fhi = ci["forced_accuracy"]
    told = (f"; its own answer names the state at {band['forced_accuracy']:.2f} [{flo:.2f}, {fhi:.2f}] of "
            f"{band['n_boundaries']} event ends (chance {ci['chance']:.2f}), and agrees with the probe at "
            f"{band['probe_forced_agreement']:.2f}")
    return read + told
