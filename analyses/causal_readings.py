"""A `beliefscope interchange` report read into the instrument and the viewer: per layer and position rule, the
held-out probe beside its strongest baseline, IIA with the probe's subspace and with DAS, the erasure drop, and
the verdict ("readable and used", "readable but not used", "not readable"), each with its numbers.

The report is the JSON `analyses.interchange_report.main` writes (``interchange.json`` in its ``--out``); it names
the checkpoint it was measured on, and a report of another model is refused.
"""

from __future__ import annotations

import json
import os

from ..probes.twin import checkpoint_hash

BASELINES = ("majority", "bag_of_words")  # the report's baselines of the held-out probe


def load_report(path: str, model=None) -> dict:
    """The report at ``path`` (an ``interchange.json``, or the folder holding one); with ``model``, refused unless
    it was measured on that model's checkpoint."""
    file = os.path.join(path, "interchange.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no interchange report at {path!r}: write one with `beliefscope interchange --model M "
                                "... --out FOLDER` and pass that folder")
    with open(file) as f:
        report = json.load(f)
    if "sites" not in report and "chunks" not in report:
        raise ValueError(f"{file} is not an interchange report (no 'sites'): pass the --out folder of `beliefscope "
                         "interchange`")
    if model is not None:
        want, got = checkpoint_hash(model), report.get("checkpoint_hash")
        if got != want:
            raise ValueError(f"the interchange report {file} was measured on checkpoint {got or 'unrecorded'}, not on "
                             f"this model ({want}): run `beliefscope interchange` on this model")
    return report


def _acc(reading: dict | None) -> dict | None:
    return None if not reading else {"accuracy": reading["accuracy"], "interval": reading["interval"]}


def causal_table(report: dict) -> list[dict]:
    """One row per site of a plain model's report: ``layer``, ``position``, ``probe``, ``baseline`` (the stronger
    of the majority class and the bag-of-words regression, by name), ``iia_full``, ``iia_probe``, ``iia_massmean``,
    ``iia_random``, ``iia_das`` (None where DAS was not trained), ``erasure_drop`` (LEACE at that layer's last
    token, beside a random erasure; None where the layer was not erased), and ``verdict``."""
    erased = report.get("erasure") or {}
    rows = []
    for site in report.get("sites", []):
        base = max(BASELINES, key=lambda b: site[b]["accuracy"])
        drop = erased.get(str(site["layer"])) if site["position"] == "last" else None
        rows.append({
            "layer": site["layer"], "position": site["position"], "probe": _acc(site.get("probe")),
            "baseline": {"name": base, **_acc(site[base])}, "iia_full": _acc(site.get("iia_full")),
            "iia_probe": _acc(site.get("iia_probe")), "iia_massmean": _acc(site.get("iia_massmean")),
            "iia_random": _acc(site.get("iia_random")), "iia_das": _acc(site.get("iia_das")),
            "erasure_drop": None if drop is None else {"leace": drop["drop_leace"], "random": drop["drop_random"]},
            "verdict": site["verdict"]})
    return rows


def iia_by_layer(report: dict) -> dict[str, list]:
    """``{position rule: [whole-activation IIA per block, None where not measured]}``, or for a Thinking States
    report ``{"thought": [IIA of the written-state swap per chunk]}``: what the viewer's hover shows."""
    if "sites" not in report:
        return {"thought": [c.get("iia_swap", {}).get("accuracy") for c in report.get("chunks", [])]}
    n = 1 + max(s["layer"] for s in report["sites"])
    out: dict[str, list] = {}
    for site in report["sites"]:
        out.setdefault(site["position"], [None] * n)[site["layer"]] = (site.get("iia_full") or {}).get("accuracy")
    return out


def causal_summary(report: dict) -> dict:
    """What the instrument keeps of a report: its table, the per-block IIA and the lines it prints."""
    return {"model": report.get("model"), "source": report.get("source"), "rows": causal_table(report),
            "iia_by_layer": iia_by_layer(report), "lines": causal_lines(report)}


def _fmt(x: dict | None) -> str:
    return "-" if x is None else f"{x['accuracy']:.2f} [{x['interval'][0]:.2f}, {x['interval'][1]:.2f}]"


def causal_lines(report: dict) -> list[str]:
    """The table, a line per site, as the instrument prints it."""
    if "chunks" in report:  # a Thinking States model: its written state S swapped, chunk by chunk
        return [f"causal test: swap {report['site']} ({report['scored_on']}):"] + [
            f"  chunk {c['chunk']}: IIA {_fmt(c['iia_swap'])} vs a random state at the same distance "
            f"{_fmt(c['iia_random'])}" for c in report["chunks"]]
    lines = [f"causal tests ({report.get('scored_on', 'held-out pairs')}; {report.get('n_heldout_pairs', '?')} "
             f"held-out pairs; DAS rank {report.get('das_rank', '?')}):"]
    for r in causal_table(report):
        drop = r["erasure_drop"]
        erase = "" if drop is None else (f"; LEACE drop {drop['leace']['drop']:+.2f} vs random "
                                         f"{drop['random']['drop']:+.2f}")
        lines.append(f"  block {r['layer']:>2} {r['position']:<10} probe {_fmt(r['probe'])} vs {r['baseline']['name']} "
                     f"{_fmt(r['baseline'])}; IIA whole {_fmt(r['iia_full'])}, probe {_fmt(r['iia_probe'])}, mass-mean "
                     f"{_fmt(r['iia_massmean'])}, random {_fmt(r['iia_random'])}, DAS {_fmt(r['iia_das'])}{erase}: "
                     f"{r['verdict'].split(' (')[0]}")
    return lines
