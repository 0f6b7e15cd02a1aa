"""The pictures of the Results pages (docs/scripts/results.py): `COPIED` (screenshots and figures that need a
model run, copied as committed) and `DRAWN` (drawn from the JSON by the `draw_*` functions here), the digest
of a drawn picture's inputs that its PNG carries (`picture_digest`, `DRAW_VERSION`), and `write_pictures`,
which copies and draws them into a docs folder, redrawing a picture only when its inputs change. It imports
results_doc and the JSON paths of the page modules.
"""

from __future__ import annotations

import hashlib
import json
import os

from results_decoding import DET, SPEC, TRACE
from results_doc import RES, ROOT
from results_models import INSTRUMENT

DRAW_VERSION = "1"  # part of every drawn picture's digest: bump it when a drawing function changes

COPIED = {  # docs/images/<name>: a picture that needs a model run or a browser, copied as committed
    "results-view.png": f"{RES}/view.png",
    "results-speculative-prefill.png": f"{RES}/speculative_prefill.png",
    "results-loss-smollm2-thinking.png": "checkpoints/smollm2-thinking/loss.png",
}
_DET_SWEEPS = tuple(f"{RES}/determinism_smollm2_{r}.json" for r in ("fp32", "bf16", "paths", "verified"))
DRAWN = {  # docs/images/<name>: (its JSON inputs, the function that draws it from them)
    "results-spec-acceptance.png": ((SPEC,), "draw_spec"),
    "results-cache-timeline.png": ((TRACE,), "draw_timeline"),
    "results-acceptance.png": ((TRACE,), "draw_acceptance"),
    "results-determinism.png": (_DET_SWEEPS + (DET,), "draw_determinism"),
    **{f"results-instrument-{anchor}.png": ((f"{RES}/{stem}.json",), "draw_instrument")
       for stem, _, anchor in INSTRUMENT},
    **{f"results-trajectory-{anchor}.png": ((f"{RES}/{stem}.json",), "draw_trajectory")
       for stem, _, anchor in INSTRUMENT if anchor in ("smollm2", "cups", "variables")},
}


def draw_spec(inputs: list[dict]):
    """Speed-up (median, IQR) and tokens per verify step against Leviathan's expectation, per method, for
    the two SmolLM2 workloads of spec.json."""
    import numpy as np
    from matplotlib.figure import Figure

    res = inputs[0]
    parts = [("smollm2", "SmolLM2, coin-flip rewrites"), ("general", "SmolLM2, docstrings")]
    n = max(len(res[p]["methods"]) for p, _ in parts)
    fig = Figure(figsize=(12, 0.3 * n * len(parts) + 1.5))
    axes = fig.subplots(len(parts), 2, squeeze=False)
    colours = {"plain": "#9e9e9e", "plain-default": "#bdbdbd", "ours": "#2e86ab"}
    for row, (p, title) in zip(axes, parts, strict=True):
        methods = [(k, m) for k, m in res[p]["methods"].items() if m.get("speedup")]
        y = np.arange(len(methods))[::-1]
        med = [m["speedup"]["median"] for _, m in methods]
        err = [[a - m["speedup"]["q1"] for a, (_, m) in zip(med, methods)],
               [m["speedup"]["q3"] - a for a, (_, m) in zip(med, methods)]]
        col = [colours.get(m.get("kind"), "#f2994a") for _, m in methods]
        row[0].barh(y, med, xerr=err, color=col, capsize=2)
        row[0].axvline(1, color="k", lw=0.7)
        row[0].set_yticks(y, [k for k, _ in methods], fontsize=7)
        row[0].set_xlabel("speed-up over plain greedy (median, IQR)", fontsize=8)
        row[0].set_title(f"{title}: speed-up (HF in orange)", fontsize=9)
        drafted = [(k, m) for k, m in methods if m.get("tokens_per_verify_step") is not None]
        y2 = np.arange(len(drafted))[::-1]
        row[1].barh(y2 + 0.2, [m["tokens_per_verify_step"] for _, m in drafted], 0.4, color="#27ae60",
                    label="tokens per verify step (measured)")
        row[1].barh(y2 - 0.2, [m["expected_tokens_per_step_at_alpha"] for _, m in drafted], 0.4, color="#bdbdbd",
                    label="expected at the measured α (Leviathan)")
        row[1].set_yticks(y2, [f"{k}  α {m['alpha']:.2f}" for k, m in drafted], fontsize=7)
        row[1].set_xlabel("tokens committed per verify step", fontsize=8)
        row[1].set_title(f"{title}: acceptance", fontsize=9)
    fig.legend(*axes[0][1].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def draw_timeline(inputs: list[dict]):
    """The cache timeline `beliefscope trace` drew, from the rows its JSON records."""
    from beliefscope.analyses.plots_decoding import cache_timeline

    tl = inputs[0]["featured"]["timeline"]
    return cache_timeline([tuple(r) for r in tl["rows"]], **({"title": tl["title"]} if tl["title"] else {}),
                          start=tl["start"])


def draw_acceptance(inputs: list[dict]):
    """Drafts proposed and accepted per verify step of the trace's featured request."""
    from beliefscope.analyses.plots_decoding import acceptance_chart

    steps = inputs[0]["featured"]["steps"]
    return acceptance_chart([len(s["proposals"]) for s in steps], [s["accepted"] for s in steps],
                            title="Drafts per verify step, featured request")


def draw_determinism(inputs: list[dict]):
    """`analyses.determinism.chart` over the SmolLM2 sweeps, with the bench result's throughput panel; the
    `paths` sweep gives only its batch-invariant series (its other series repeat the dedicated runs)."""
    from beliefscope.analyses.determinism import chart

    fp32, bf16, paths, verified, costs = inputs
    paths = {**paths, "fast_path_unique_max": None, "verified_unique_max": None}
    return chart([fp32, bf16, paths, verified], costs=costs)


def draw_instrument(inputs: list[dict]):
    from beliefscope.analyses.plots import instrument_chart

    return instrument_chart(inputs[0])


def draw_trajectory(inputs: list[dict]):
    from beliefscope.analyses.state_strips import strips_figure

    res = inputs[0]
    first = next(iter(res["models"].values()))
    panels = [{"name": name, **r["trajectory"]} for name, r in res["models"].items()]
    band = list(first["bands"])[-1]
    return strips_figure(panels, first["state_names"],
                         f"One held-out {first['task']} story ({band} events), token by token")


def picture_digest(root: str, name: str) -> str:
    """SHA-256 of a drawn picture's inputs (and `DRAW_VERSION`): stored in the PNG, checked before redrawing."""
    inputs, fn = DRAWN[name]
    h = hashlib.sha256(f"{name}\0{fn}\0{DRAW_VERSION}\0".encode())
    for rel in inputs:
        with open(os.path.join(root, rel), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _write_if_changed(path: str, data: bytes) -> None:
    from beliefscope.base.files import atomic_write_bytes

    if os.path.exists(path):
        with open(path, "rb") as f:
            if f.read() == data:
                return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_bytes(path, data)


def write_pictures(docs_dir: str, root: str = ROOT) -> list[str]:
    """Copy `COPIED` and draw `DRAWN` into ``docs_dir/images``; a drawn picture whose PNG already carries
    the digest of its current inputs is left as it is. Returns their paths."""
    import io

    out = []
    for name, rel in COPIED.items():
        path = os.path.join(docs_dir, "images", name)
        with open(os.path.join(root, rel), "rb") as f:
            _write_if_changed(path, f.read())
        out.append(path)
    for name, (inputs, fn) in DRAWN.items():
        path = os.path.join(docs_dir, "images", name)
        digest = picture_digest(root, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                if digest.encode() in f.read():
                    out.append(path)
                    continue
        import matplotlib

        matplotlib.use("Agg")
        data = []
        for rel in inputs:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                data.append(json.load(f))
        fig = globals()[fn](data)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, metadata={"Software": None, "Source": f"sha256:{digest}"})
        _write_if_changed(path, buf.getvalue())
        out.append(path)
    return out
