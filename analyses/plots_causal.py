"""The interchange figure: IIA per layer and position (heatmap), and per position the readings and causal
tests across layers (held-out probe, majority class, IIA with the whole activation, the probe's subspace, a
random subspace and DAS), each IIA with its 95% interval."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .common import save_fig  # noqa: E402

SERIES = (("probe", "held-out probe", "tab:blue", "-"), ("majority", "majority class", "tab:gray", ":"),
          ("bag_of_words", "bag-of-words (text so far)", "tab:brown", ":"),
          ("iia_full", "IIA, whole activation", "black", "-"), ("iia_probe", "IIA, probe subspace", "tab:orange", "-"),
          ("iia_massmean", "IIA, mass-mean subspace", "tab:purple", "-"),
          ("iia_random", "IIA, random subspace", "tab:red", "--"), ("iia_das", "IIA, DAS", "tab:green", "-"))


def interchange_figure(res: dict, path: str) -> bytes:
    """Draw ``res`` (`analyses.interchange_report.main`'s result) to ``path``; returns the PNG bytes."""
    rows = res["sites"]
    layers = sorted({r["layer"] for r in rows})
    rules = list(dict.fromkeys(r["position"] for r in rows))
    grid = np.full((len(layers), len(rules)), np.nan)
    for r in rows:
        grid[layers.index(r["layer"]), rules.index(r["position"])] = r["iia_full"]["accuracy"]
    cols = min(3, 1 + len(rules))
    n_rows = -(-(1 + len(rules)) // cols)
    fig, grid_axes = plt.subplots(n_rows, cols, figsize=(4.6 * cols, 3.7 * n_rows + 0.5), squeeze=False)
    axes = list(grid_axes.flat)
    for ax in axes[1 + len(rules):]:
        ax.axis("off")
    ax = axes[0]
    im = ax.imshow(grid, aspect="auto", origin="lower", vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(rules)), rules, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(layers)), layers, fontsize=7 if len(layers) > 12 else 9)
    ax.set_ylabel("layer")
    ax.set_title("IIA, whole activation", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.08)
    for ax, rule in zip(axes[1: 1 + len(rules)], rules):
        mine = sorted((r for r in rows if r["position"] == rule), key=lambda r: r["layer"])
        xs = [r["layer"] for r in mine]
        for key, name, color, style in SERIES:
            pts = [(x, r[key]) for x, r in zip(xs, mine) if r.get(key)]
            if not pts:
                continue
            x = [p[0] for p in pts]
            acc = [p[1]["accuracy"] for p in pts]
            ax.plot(x, acc, style, color=color, label=name, marker="o" if key == "iia_das" else None, ms=4)
            if key.startswith("iia") or key == "probe":
                lo = [p[1]["interval"][0] for p in pts]
                hi = [p[1]["interval"][1] for p in pts]
                ax.fill_between(x, lo, hi, color=color, alpha=0.12, lw=0)
        ax.set_ylim(-0.03, 1.03)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer")
        ax.set_title(f"position: {rule}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[len(rules)].legend(fontsize=7, loc="best")
    fig.suptitle(f"Is the label used? {res['model']} on {res['source']}: {res['n_heldout_pairs']} held-out pairs "
                 f"(base answers right: {res['base_correct']:.0%})", fontsize=10)
    fig.tight_layout()
    return save_fig(fig, path)
