"""Plots of the decoding machinery: the KV cache's provenance through decode, verify and rollback,
accepted drafts, a token-tree verify step, and the cost of determinism. Arrays in, `Figure` out.

>>> fig = acceptance_chart([4, 4, 2], [4, 1, 0])
>>> len(fig.axes)
1
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from .plots import PROVENANCE_COLORS, PROVENANCE_NAMES


def cache_timeline(stages: list[tuple[str, list[str], list[int]]], title="KV cache through decode, verify, rollback",
                   start: int = 0) -> Figure:
    """The KV cache through decode, verify and rollback: one row per stage, one cell per cache position
    coloured by provenance.

    stages: [(stage name, tokens, provenance codes 0..3)], e.g. after prefill / decode / verify-rollback;
    cell i of every row is cache position ``start + i`` (earlier positions are not drawn).
    """
    width = max(len(t) for _, t, _ in stages)
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * width + 2.5), 0.8 * len(stages) + 1.4), constrained_layout=True)
    for row, (_, toks, prov) in enumerate(stages):
        y = len(stages) - 1 - row
        for i, (tok, p) in enumerate(zip(toks, prov, strict=True)):
            ax.add_patch(plt.Rectangle((i, y + 0.1), 0.95, 0.8, color=PROVENANCE_COLORS[int(p)],
                                       hatch="//" if int(p) == 3 else None, ec="white"))
            ax.text(i + 0.475, y + 0.5, tok, ha="center", va="center", fontsize=7, rotation=90 if len(tok) > 4 else 0)
    ax.set_xlim(0, width)
    ax.set_ylim(0, len(stages))
    ax.set_yticks([len(stages) - 1 - r + 0.5 for r in range(len(stages))])
    ax.set_yticklabels([s for s, _, _ in stages], fontsize=9)
    ax.set_xlabel("cache position")
    ticks = list(range(0, width, max(1, width // 20)))
    ax.set_xticks([t + 0.475 for t in ticks])
    ax.set_xticklabels([str(start + t) for t in ticks], fontsize=8)
    shown = sorted({0, 1, 2, 3} | {int(p) for _, _, codes in stages for p in codes})  # thoughts only if present
    ax.legend(handles=[Patch(color=PROVENANCE_COLORS[k], label=PROVENANCE_NAMES[k]) for k in shown],
              ncol=len(shown), loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10, pad=22)
    return fig


def acceptance_chart(drafted: list[int], accepted: list[int], title="Accepted draft tokens per verify step") -> Figure:
    """Stacked bars per verify step: accepted vs rejected proposals."""
    drafted, accepted = np.asarray(drafted), np.asarray(accepted)
    x = np.arange(len(drafted))
    fig, ax = plt.subplots(figsize=(max(6, 0.25 * len(x) + 3), 3), constrained_layout=True)
    ax.bar(x, accepted, color=PROVENANCE_COLORS[2], label="accepted")
    ax.bar(x, drafted - accepted, bottom=accepted, color=PROVENANCE_COLORS[3], label="rejected")
    ax.set_xlabel("verify step")
    ax.set_ylabel("draft tokens")
    ax.set_xticks(x if len(x) <= 20 else x[:: -(-len(x) // 20)])
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    alpha = accepted.sum() / max(1, drafted.sum())
    ax.set_title(f"{title} (acceptance {alpha:.0%})", fontsize=10)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def determinism_chart(n_batch: list[int], unique_fast: list[float], unique_verified: list[float]) -> Figure:
    """Unique outputs per prompt against the number of co-batched requests."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2), constrained_layout=True)
    # hollow wide markers for the fast path so that both series stay visible when they coincide
    ax.plot(n_batch, unique_fast, "o-", color="#eb5757", ms=11, mfc="none", mew=2, lw=2.5,
            label="fast path (unverified)")
    ax.plot(n_batch, unique_verified, "s--", color="#27ae60", ms=5, label="deterministic (verified)")
    ax.set_xlabel("co-batched requests")
    ax.set_ylabel("unique outputs per prompt")
    ax.set_xticks(list(n_batch))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0.5, max(max(unique_fast), max(unique_verified)) + 1.5)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title("Determinism against batch composition", fontsize=10)
    return fig


def determinism_costs_chart(series: dict, costs: dict) -> Figure:
    """Left: unique outputs per prompt by co-batched requests, one line per series (``label -> (k's,
    values)``). Right (when ``costs`` has models): throughput as a ratio to the all-fast-path run
    against the deterministic share, median with quartile bars, baselines as dotted lines."""
    fig, axes = plt.subplots(1, 2 if costs else 1, figsize=(11 if costs else 5.5, 3.4), constrained_layout=True,
                             squeeze=False)
    ax = axes[0][0]
    # one style per series, big hollow markers first so that equal lines stay visible under later ones
    styles = [("o-", "#eb5757", 13, "none"), ("D-", "#f2994a", 10, "none"), ("^-", "#2e86ab", 7, "none"),
              ("s--", "#27ae60", 5, None)]
    picked = styles if len(series) >= 4 else [styles[0], styles[1], styles[3]] if len(series) == 3 else styles[::3]
    for i, (label, (ks, vals)) in enumerate(series.items()):
        m, c, ms, mfc = picked[i % len(picked)]
        ax.plot(ks, vals, m, color=c, ms=ms, mfc=mfc, mew=2, lw=2, label=label)
    ax.set_xlabel("co-batched requests (max batch - 1)")
    ax.set_ylabel("unique outputs per prompt (max)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0.5, max(max(v) for _, v in series.values()) + 1.5)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title("Distinct outputs of one prompt across batches", fontsize=10)
    if costs:
        ax = axes[0][1]
        colors = ["#2e86ab", "#d1495b", "#8e44ad", "#27ae60"]
        for (name, m), c in zip(costs.items(), colors):
            for prefix, fmt, what in (("share ", "o-", "verified (row-invariant)"),
                                      ("fixed-shape verify, ", "s:", "verified (fixed shape, before)"),
                                      ("batch-invariant fast path, ", "^--", "batch-invariant fast path")):
                rows = [r for r in m.get("rows", m["shares"]) if r["config"].startswith(prefix)]
                if not rows:
                    continue
                x = [100 * r["det_share"] for r in rows]
                med = [r["ratio"]["median"] for r in rows]
                err = [[a - r["ratio"]["q1"] for a, r in zip(med, rows)],
                       [r["ratio"]["q3"] - a for a, r in zip(med, rows)]]
                ax.errorbar(x, med, yerr=err, fmt=fmt, color=c, capsize=3, mfc="none" if "fixed" in prefix else c,
                            label=f"{name}: {what}")
            if "fixed shape" in m.get("baselines", {}):
                ax.axhline(m["baselines"]["fixed shape"]["ratio"]["median"], color=c, ls="-.", lw=1,
                           label=f"{name}: fixed shape, no fast path")
        for share, goal in ((50, 0.9), (100, 0.8)):  # the goals: throughput kept at 50% and 100% deterministic
            ax.plot([share / 1.6, share * 1.25], [goal, goal], color="#27ae60", lw=2.5, alpha=0.7,
                    label="goal" if share == 50 else None)
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set_xscale("symlog", linthresh=2)
        ax.set_xticks([0, 2, 10, 25, 50, 100])
        ax.set_xticklabels(["0", "2", "10", "25", "50", "100"])
        ax.set_xlabel("deterministic requests (% of the workload)")
        ax.set_ylabel("throughput / all fast path")
        top = max(r["ratio"]["q3"] for m in costs.values() for r in m.get("rows", m["shares"]))
        ax.set_ylim(0, max(1.15, top + 0.1))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        ax.set_title("Cost of determinism", fontsize=10)
    return fig


def tree_step(tokens: list[str], parents: list[int], codes: list[int], root: str, title="One token-tree verify step"
              ) -> Figure:
    """A drafted token tree: the pending token at the left, each node at x = its depth, edges to its
    parent, every node coloured by the provenance code the cache holds for it (verified = the
    accepted path, rejected = rolled back and kept in ``cache.recorder.rejected``).

    >>> fig = tree_step(["a", "b", "c"], [-1, 0, -1], [2, 3, 3], "x")
    >>> len(fig.axes[0].patches)
    4
    """
    depth, rows, next_row = [], [], [0]
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        depth.append(1 if p < 0 else depth[p] + 1)
        kids.setdefault(p, []).append(i)
    rows = [0] * len(tokens)

    def place(node: int, row: int) -> None:  # depth-first: the first child stays on its parent's row
        for j, c in enumerate(kids.get(node, [])):
            if j:
                next_row[0] += 1
            rows[c] = row if j == 0 else next_row[0]
            place(c, rows[c])
    place(-1, 0)
    n_rows = next_row[0] + 1
    fig, ax = plt.subplots(figsize=(1.3 * (max(depth, default=0) + 1) + 2.5, 0.55 * n_rows + 1.6),
                           constrained_layout=True)
    xy = {-1: (0, 0)}
    for i in range(len(tokens)):
        xy[i] = (depth[i], rows[i])
    for i, p in enumerate(parents):
        (x0, y0), (x1, y1) = xy[p], xy[i]
        ax.plot([x0 + 0.4, x1 - 0.4], [-y0, -y1], color="#999999", lw=1, zorder=0)
    ax.add_patch(plt.Rectangle((-0.4, -0.3), 0.8, 0.6, color=PROVENANCE_COLORS[2], ec="black"))
    ax.text(0, 0, root, ha="center", va="center", fontsize=8)
    for i, (tok, code) in enumerate(zip(tokens, codes, strict=True)):
        x, y = xy[i]
        ax.add_patch(plt.Rectangle((x - 0.4, -y - 0.3), 0.8, 0.6, color=PROVENANCE_COLORS[int(code)],
                                   hatch="//" if int(code) == 3 else None, ec="white"))
        ax.text(x, -y, tok, ha="center", va="center", fontsize=8)
    ax.set_xlim(-0.6, max(depth, default=0) + 0.6)
    ax.set_ylim(-n_rows + 0.4, 0.6)
    ax.set_yticks([])
    ax.set_xticks(range(max(depth, default=0) + 1))
    ax.set_xticklabels(["pending"] + [f"depth {d}" for d in range(1, max(depth, default=0) + 1)], fontsize=8)
    shown = sorted(set(int(c) for c in codes) | {2})
    ax.legend(handles=[Patch(color=PROVENANCE_COLORS[k], label=PROVENANCE_NAMES[k]) for k in shown],
              ncol=len(shown), loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10, pad=22)
    return fig
