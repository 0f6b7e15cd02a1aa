"""The per-layer figure of `beliefscope probe --out DIR` (``DIR/probe-layers.png``): the out-of-fold probe with
its 95% interval band, the random-init twin's band at each block, the control task where it is defined, every
baseline of the report as a line with its band, and chance at 1/k. It reads the report's JSON alone.

>>> rep = {"label": "box", "n_groups": 40, "class_names": ["A", "B"], "scored_on": "out-of-fold",
...        "control": {"defined": True}, "baselines": {"majority": {"accuracy": 0.5, "interval": [0.4, 0.6],
...        "description": "the fold-wise majority class"}}, "layers": [{"layer": 0, "accuracy": 0.7,
...        "accuracy_interval": [0.6, 0.8], "control_accuracy": 0.55, "random_init_accuracy": 0.5,
...        "random_init_interval": [0.4, 0.6]}]}
>>> [float(v) for v in probe_layers_figure(rep).axes[0].get_ylim()]
[0.0, 1.02]
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BASELINE_COLOURS = ["0.25", "#e67e22", "#16a085", "#2e86ab", "#7f8c8d", "#c0392b"]


def probe_layers_figure(rep: dict):
    """Accuracy by block with intervals and baselines, from a `ProbeReport` JSON."""
    rows = rep["layers"]
    x = [r["layer"] for r in rows]
    width = min(12.0, max(6.0, 0.28 * len(x) + 4.0))  # readable at 30 blocks, not a strip at 3
    fig, ax = plt.subplots(figsize=(width, 3.8), constrained_layout=True)
    for k, (name, b) in enumerate(rep.get("baselines", {}).items()):
        c = BASELINE_COLOURS[k % len(BASELINE_COLOURS)]
        ax.axhline(b["accuracy"], color=c, ls="--", lw=1, label=f"{b.get('description', name)} ({b['accuracy']:.2f})")
        ax.axhspan(*b["interval"], color=c, alpha=0.08, lw=0)
    if any(r.get("random_init_accuracy") is not None for r in rows):
        ax.plot(x, [r.get("random_init_accuracy") for r in rows], "v-", color="#8e44ad", ms=3, lw=1,
                label="random-init twin")
        if all(r.get("random_init_interval") for r in rows):
            ax.fill_between(x, *zip(*[r["random_init_interval"] for r in rows]), color="#8e44ad", alpha=0.12, lw=0)
    if rep.get("control", {}).get("defined", True) and any(r.get("control_accuracy") is not None for r in rows):
        ax.plot(x, [r.get("control_accuracy") for r in rows], "^:", color="0.55", ms=3, lw=1, label="control task")
    if all(r.get("mass_mean_accuracy") is not None for r in rows):
        ax.plot(x, [r["mass_mean_accuracy"] for r in rows], "s-", color="#f4a259", ms=3, lw=1,
                label="mass-mean probe")
    ax.plot(x, [r["accuracy"] for r in rows], "o-", color="#d1495b", ms=4, label=f"probe ({rep.get('scored_on')})")
    if all(r.get("accuracy_interval") for r in rows):
        ax.fill_between(x, *zip(*[r["accuracy_interval"] for r in rows]), color="#d1495b", alpha=0.2, lw=0)
    k = len(rep.get("class_names") or ()) or 2
    ax.axhline(1 / k, color="0.75", lw=0.8, ls=":", label=f"chance (1/{k})")
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("block (blocks.N.hook_resid_post)")
    ax.set_ylabel("accuracy")
    step = max(1, len(x) // 16)
    ax.set_xticks(x[::step])
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    defined = rep.get("control", {}).get("defined", True)
    note = "" if defined else "\ncontrol task left out: not defined here (report.json)"
    fig.suptitle(f"Probe for {rep['label']!r} by block\nout-of-fold over {rep.get('n_groups')} record groups, "
                 f"95% intervals{note}", fontsize=9.5)
    return fig
