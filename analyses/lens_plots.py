"""Figures of the lens analyses: arrays and result dicts in, matplotlib `Figure` out.

>>> import numpy as np
>>> res = {"layers": [0, 1], "position_classes": ["boundary", "answer"], "majority": {"boundary": 0.5, "answer": 0.5},
...        "in_place": {"logit": {"boundary": [0.5, 0.6], "answer": [0.5, 1.0]}}, "forced": {}}
>>> len(forming_figure(res).axes)  # one panel per lens, and the colour bar
2
>>> kl_figure([3.0, 1.0, 0.0], [1.0, 0.5, 0.0]).axes[0].get_ylabel()
'KL(final || lens), nats'
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


def forming_figure(res: dict) -> Figure:
    """Lens accuracy per layer (rows) and position class (columns), one panel per lens; the forced answer
    (question appended at each event boundary, read at its answer position) as the last column."""
    lenses = list(res["in_place"])
    cols = list(res["position_classes"]) + (["forced"] if res.get("forced") else [])
    L = len(res["layers"])
    fig, axes = plt.subplots(1, len(lenses), figsize=(1.3 * len(cols) * len(lenses) + 1.5, 0.28 * L + 2.2),
                             squeeze=False)
    im = None
    for ax, lens in zip(axes[0], lenses):
        rows = {**res["in_place"][lens], **({"forced": res["forced"][lens]} if lens in res.get("forced", {}) else {})}
        grid = np.array([[np.nan] * L if rows.get(c) is None else rows[c] for c in cols]).T  # [L, C]
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=1)
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v) and (L <= 12 or i % max(1, L // 10) == 0 or i == L - 1):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w" if v < 0.6 else "k")
        maj = res.get("majority", {})
        ax.set_xticks(range(len(cols)),
                      [f"{c}\n(maj {maj[c]:.2f})" if maj.get(c) is not None else c for c in cols], fontsize=8)
        step = max(1, L // 15)
        ax.set_yticks(range(0, L, step), [str(x) for x in res["layers"][::step]])
        ax.set_ylabel("layer (blocks.L.hook_resid_post)")
        ax.set_title(f"{lens} lens: accuracy of the class words")
    fig.colorbar(im, ax=axes[0].tolist(), fraction=0.04, label="accuracy")
    return fig


def example_figure(p_true: np.ndarray, tokens: list[str], cls: np.ndarray, state_names) -> Figure:
    """One story: the lens's P(true state) among the class words, layer x token (boundaries marked)."""
    L, T = p_true.shape
    fig, ax = plt.subplots(figsize=(max(6.0, 0.32 * T + 2), 0.3 * L + 2))
    im = ax.imshow(p_true, origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(T), tokens, rotation=90, fontsize=7)
    for t in np.nonzero(cls == 0)[0]:
        ax.axvline(t, color="w", lw=0.6, ls=":")
    ax.set_yticks(range(0, L, max(1, L // 15)))
    ax.set_ylabel("layer")
    ax.set_title(f"logit lens: P(true state) among {', '.join(map(str, state_names))} (dotted: event boundaries)",
                 fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    return fig


def kl_figure(logit: list, tuned: list, title: str = "") -> Figure:
    """Held-out KL(final || lens) per layer, logit lens vs tuned lens."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    x = np.arange(len(logit))
    ax.plot(x, logit, "o-", label="logit lens", ms=3)
    ax.plot(x, tuned, "s-", label="tuned lens", ms=3)
    ax.set_xlabel("layer (blocks.L.hook_resid_post)")
    ax.set_ylabel("KL(final || lens), nats")
    ax.set_title(title or "held-out KL to the model's final distribution", fontsize=9)
    ax.legend()
    fig.tight_layout()
    return fig


def attention_figure(att: dict) -> Figure:
    """The answer position's attention mass on the evidence vs the last-named distractor: per layer (mean over
    heads, with intervals over stories), and per layer x head (evidence minus distractor)."""
    ev, di = np.asarray(att["evidence_mass"]), np.asarray(att["distractor_mass"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    x = np.arange(len(ev))
    for vals, ci, label in ((ev, att["evidence_interval"], "true evidence"),
                            (di, att["distractor_interval"], "last-named distractor")):
        a.plot(x, vals, "o-", ms=3, label=label)
        a.fill_between(x, [c[0] for c in ci], [c[1] for c in ci], alpha=0.2)
    a.set_xticks(x[:: max(1, len(x) // 15)])
    a.set_xlabel("layer")
    a.set_ylabel("attention mass (mean over heads)")
    a.set_title(f"answer position, {att['n_scored']} stories where the two differ", fontsize=9)
    a.legend(fontsize=8)
    diff = np.asarray(att["evidence_by_head"]) - np.asarray(att["distractor_by_head"])  # [L, H]
    lim = float(np.abs(diff).max()) or 1.0
    im = b.imshow(diff, origin="lower", aspect="auto", cmap="RdBu", vmin=-lim, vmax=lim)
    b.set_xticks(range(diff.shape[1]))
    b.set_yticks(range(0, diff.shape[0], max(1, diff.shape[0] // 15)))
    b.set_xlabel("head")
    b.set_ylabel("layer")
    b.set_title("evidence minus distractor mass, per head (blue: evidence)", fontsize=9)
    fig.colorbar(im, ax=b, fraction=0.04)
    fig.tight_layout()
    return fig
