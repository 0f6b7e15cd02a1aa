"""Plot functions: arrays in, matplotlib `Figure` out (testable without a display).

>>> import numpy as np
>>> fig = belief_heatmap(np.random.rand(4, 6), ["A", "coin", "is", "heads", ".", "?"], np.zeros(6))
>>> fig.axes[1].get_xlabel()  # the token axis sits under the true-state strip
'token'
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

# Provenance colours (as in the LLM-42 paper's figure): prefill blue, draft yellow, verified green,
# rejected red; Thinking States thoughts purple.
PROVENANCE_COLORS = {0: "#5b8fd9", 1: "#f2c94c", 2: "#6fcf97", 3: "#eb5757", 4: "#bb6bd9"}
PROVENANCE_NAMES = {0: "prefill", 1: "draft", 2: "verified", 3: "rejected", 4: "thought"}

# The one colour convention for a binary belief in every figure and in the viewer: P(first state),
# e.g. P(heads), on ColorBrewer's diverging RdBu (Brewer & Harrower 2003; marked colour-blind safe):
# 1 (heads) is dark blue, 0 (tails) dark red, 0.5 near white.
BELIEF_CMAP = "RdBu"


def belief_stops(n: int = 11) -> list[str]:
    """`BELIEF_CMAP` sampled at ``n`` evenly spaced values of P(first state), 0 to 1, as hex colours
    (the viewer interpolates between them, so its colours are the figures' colours).

    >>> s = belief_stops(); len(s), s[0] != s[-1]
    (11, True)
    """
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps[BELIEF_CMAP]
    return [to_hex(cmap(i / (n - 1))) for i in range(n)]


def _token_axis(ax, tokens, rotate=True):
    ax.set_xticks(range(len(tokens)))
    ax.set_xticklabels(tokens, rotation=90 if rotate else 0, fontsize=8 if len(tokens) < 60 else 6)
    ax.set_xlabel("token")


def belief_heatmap(p_heads: np.ndarray, tokens: list[str], true_state: np.ndarray,
                   title: str | None = None, state_name="heads", layer_labels: list[str] | None = None) -> Figure:
    """Heatmap of P(state) with layers on y and tokens on x; true state marked under the tokens.

    p_heads: [n_layers, T] probabilities; true_state: [T] with 1 where the true state is `state_name`;
    layer_labels: one y label per row (default L0, L1, ...).
    """
    p = np.asarray(p_heads, dtype=float)
    n_layers, T = p.shape
    fig, (ax, ax_true) = plt.subplots(2, 1, figsize=(max(6, 0.32 * T + 2), 2.2 + min(0.45 * n_layers, 6.0)),
                                      gridspec_kw={"height_ratios": [n_layers, 1.2]}, sharex=True,
                                      constrained_layout=True)
    im = ax.imshow(p, aspect="auto", cmap=BELIEF_CMAP, vmin=0, vmax=1, interpolation="nearest")
    labels = layer_labels or [f"L{i}" for i in range(n_layers)]
    step = max(1, -(-n_layers // 16))  # at most 16 y labels, so deep models stay legible
    ax.set_yticks(range(0, n_layers, step))
    ax.set_yticklabels(labels[::step], fontsize=8)
    ax.set_ylabel("layer")
    ax.set_title(title or f"Probe readout P({state_name}): layer × position", fontsize=10)
    ax_true.imshow(np.asarray(true_state, dtype=float)[None, :], aspect="auto", cmap=BELIEF_CMAP, vmin=0, vmax=1)
    ax_true.set_yticks([0])
    ax_true.set_yticklabels([f"true: {state_name}?"], fontsize=8)
    _token_axis(ax_true, tokens)
    cb = fig.colorbar(im, ax=[ax, ax_true], shrink=0.9, pad=0.01)
    cb.set_label(f"P({state_name})")
    return fig


def belief_lines(p_heads_best: np.ndarray, tokens: list[str], true_state: np.ndarray, layer: int,
                 forced: np.ndarray | None = None, forced_positions=None, state_name="heads",
                 title: str | None = None) -> Figure:
    """P(state) at one layer over positions, with the true state as a step function.

    `forced` (optional): forced-answer P(state) at `forced_positions` (e.g. event boundaries).
    """
    T = len(tokens)
    fig, ax = plt.subplots(figsize=(max(6, 0.32 * T + 2), 3.4), constrained_layout=True)
    x = np.arange(T)
    ax.step(x, np.asarray(true_state, float), where="mid", color="0.35", lw=2, label=f"true state is {state_name}")
    ax.plot(x, p_heads_best, "o-", color="#d1495b", ms=3, lw=1.5, label=f"probe, layer {layer}")
    if forced is not None:
        ax.plot(forced_positions, forced, "s", color="#2e86ab", ms=7, label="forced answer")
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel(f"P({state_name})")
    ax.axhline(0.5, color="0.8", lw=0.8, ls="--")
    _token_axis(ax, tokens)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title(title or f"Belief trajectory at layer {layer}", fontsize=10)
    return fig


def _class_cells(p: np.ndarray, colours: list[str]) -> np.ndarray:
    """RGB cells ``[..., 3]``: the top class's colour, faded toward white as its probability falls to 1/K."""
    from matplotlib.colors import to_rgb

    K = p.shape[-1]
    rgb = np.asarray([to_rgb(c) for c in colours])[p.argmax(-1)]  # [..., 3]
    strength = np.clip((p.max(-1) - 1 / K) / (1 - 1 / K), 0, 1)[..., None]  # 0 at chance, 1 when certain
    return 1 - strength * (1 - rgb)


def class_heatmap(p: np.ndarray, tokens: list[str], truth: np.ndarray, class_names: list[str], colours: list[str],
                  layer_labels: list[str] | None = None, title: str | None = None) -> Figure:
    """Layer × position map of a K-class probe: each cell takes its top class's colour (the viewer's palette),
    shaded by that class's probability; the true class (grey where unknown) in a strip underneath.

    p: [n_layers, T, K] probabilities; truth: [T] class index, -1 where unknown; colours: one per class
    (`state_strips.state_colours`, the viewer's palette).
    """
    p = np.asarray(p, dtype=float)
    n_layers, T, K = p.shape
    fig, (ax, ax_true) = plt.subplots(2, 1, figsize=(max(6, 0.32 * T + 2.5), 2.2 + min(0.45 * n_layers, 6.0)),
                                      gridspec_kw={"height_ratios": [n_layers, 1.2]}, sharex=True,
                                      constrained_layout=True)
    ax.imshow(_class_cells(p, colours), aspect="auto", interpolation="nearest")
    labels = layer_labels or [f"L{i}" for i in range(n_layers)]
    step = max(1, -(-n_layers // 16))
    ax.set_yticks(range(0, n_layers, step))
    ax.set_yticklabels(labels[::step], fontsize=8)
    ax.set_ylabel("layer")
    ax.set_title(title or "Probe readout: top class (colour) and its probability (shade), layer × position",
                 fontsize=10)
    truth = np.asarray(truth)
    onehot = np.where(truth[:, None] == np.arange(K)[None, :], 1.0, 0.0)  # [T, K]
    cells = np.where((truth >= 0)[:, None], _class_cells(np.where(truth[:, None] >= 0, onehot, 1 / K), colours),
                     0.85)
    ax_true.imshow(cells[None], aspect="auto", interpolation="nearest")
    ax_true.set_yticks([0])
    ax_true.set_yticklabels(["truth"], fontsize=8)
    _token_axis(ax_true, tokens)
    ax.legend(handles=[Patch(color=c, label=n) for c, n in zip(colours, class_names, strict=True)], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, title="top class")
    return fig


def class_lines(p: np.ndarray, tokens: list[str], truth: np.ndarray, class_names: list[str], colours: list[str],
                layer: int, title: str | None = None) -> Figure:
    """One line per class: the probe's P(class) at one layer over positions ``p [T, K]``, with the true class
    marked as a coloured band along the top (nothing where unknown)."""
    T, K = p.shape
    fig, ax = plt.subplots(figsize=(max(6, 0.32 * T + 2.5), 3.6), constrained_layout=True)
    x = np.arange(T)
    for k in range(K):
        ax.plot(x, p[:, k], "o-", ms=2.5, lw=1.4, color=colours[k], label=f"P({class_names[k]})")
    truth = np.asarray(truth)
    for i in range(T):
        if truth[i] >= 0:
            ax.axvspan(i - 0.5, i + 0.5, ymin=0.94, ymax=1.0, color=colours[int(truth[i])], lw=0)
    ax.set_ylim(-0.05, 1.12)
    ax.set_ylabel("probability")
    _token_axis(ax, tokens)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False, title="band on top: truth")
    ax.set_title(title or f"Belief trajectory at layer {layer}, every class", fontsize=10)
    return fig


def forced_vs_probe(positions, forced: np.ndarray, probe: np.ndarray, true_state: np.ndarray,
                    labels: list[str] | None = None, state_name="heads") -> Figure:
    """Forced-answer P(state) over the probe readout at each event boundary."""
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * len(positions) + 2), 3.4), constrained_layout=True)
    x = np.arange(len(positions))
    ax.bar(x - 0.2, forced, 0.4, color="#2e86ab", label="forced answer")
    ax.bar(x + 0.2, probe, 0.4, color="#d1495b", label="probe")
    ax.plot(x, true_state, "k_", ms=18, mew=2, label="true state")
    ax.set_xticks(x)
    ax.set_xticklabels(labels or [str(p) for p in positions], rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("event boundary")
    ax.set_ylabel(f"P({state_name})")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title("Forced answer vs probe at every event", fontsize=10)
    return fig


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


def draft_vs_target_beliefs(positions, p_draft, p_target, true_state, state_name="heads") -> Figure:
    """At rejected positions: the draft's and the target's probe readouts side by side."""
    x = np.arange(len(positions))
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(x) + 2), 3.2), constrained_layout=True)
    ax.bar(x - 0.2, p_draft, 0.4, color=PROVENANCE_COLORS[1], label="draft probe")
    ax.bar(x + 0.2, p_target, 0.4, color=PROVENANCE_COLORS[2], label="target probe")
    ax.plot(x, true_state, "k_", ms=18, mew=2, label="true state")
    ax.set_xticks(x)
    names = [str(p) for p in positions]
    long = max((len(n) for n in names), default=0) > 5
    ax.set_xticklabels(names, fontsize=8, rotation=40 if long else 0, ha="right" if long else "center")
    ax.set_xlabel("where a rejected draft's claim is read")
    ax.set_ylabel(f"P({state_name})")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title("Draft vs target belief where drafts were rejected", fontsize=10)
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


def probe_layers_chart(layers, acc, control, random_init, embedding: float, majority: float) -> Figure:
    """Probe accuracy per layer with its controls."""
    fig, ax = plt.subplots(figsize=(7.5, 3.4), constrained_layout=True)
    ax.plot(layers, acc, "o-", color="#d1495b", label="probe (held out by prompt)")
    ax.plot(layers, control, "^--", color="0.5", label="control task")
    ax.plot(layers, random_init, "v--", color="#8e44ad", label="random-init model")
    ax.axhline(embedding, color="#2e86ab", ls=":", label="embedding only")
    ax.axhline(majority, color="0.2", ls="-.", lw=0.8, label="majority class")
    ax.set_xlabel("layer")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0.3, 1.02)
    ax.set_xticks(list(layers))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title("State probe accuracy by layer, with controls", fontsize=10)
    return fig


def agreement_by_event(events, forced_acc, probe_acc, agreement, layer: int | None = None) -> Figure:
    """Per event index: how often the forced answer and the probe are right, and how often they agree."""
    fig, ax = plt.subplots(figsize=(6, 3.4), constrained_layout=True)
    ax.plot(events, forced_acc, "s-", color="#2e86ab", label="forced answer = true state")
    if probe_acc is not None:  # no probe: forced answers alone
        ax.plot(events, probe_acc, "o-", color="#d1495b",
                label="probe = true state" + ("" if layer is None else f" (layer {layer})"))
        ax.plot(events, agreement, "^--", color="0.3", label="probe agrees with forced answer")
    ax.set_xlabel("events completed")
    ax.set_ylabel("fraction of prompts")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(list(events))
    ax.axhline(0.5, color="0.85", lw=0.8, ls=":")
    ax.legend(fontsize=8, loc="lower left", frameon=False)
    ax.set_title("Forced answers and probe readout at every event boundary", fontsize=10)
    return fig


def steering_chart(flip_rate: float, random_rates, layer: int, alpha: float) -> Figure:
    """Answer flip rate along the probe direction vs random directions of the same norm."""
    r = np.asarray(random_rates, dtype=float)
    fig, ax = plt.subplots(figsize=(7, 2.6), constrained_layout=True)
    ax.barh([1], [flip_rate], color="#d1495b", height=0.5, label="probe direction")
    ax.barh([0], [r.mean() if len(r) else 0.0], color="0.7", height=0.5, label="random directions (mean)")
    ax.plot(r, np.zeros_like(r), "k|", ms=14, label="each random direction")
    ax.set_yticks([0, 1])
    ax.set_yticklabels(["random", "probe"])
    ax.set_xlim(0, 1.12)
    for y, v in ((1, flip_rate), (0, r.mean() if len(r) else 0.0)):
        ax.text(v + 0.01, y, f"{v:.0%}", va="center", fontsize=9)
    ax.set_xlabel("fraction of answers flipped")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title(f"Steering at layer {layer}, α = {alpha} × mean residual norm", fontsize=10)
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
    accepted path, rejected = rolled back and kept in ``cache.rejected``).

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


def loss_curve(history: list[dict], title: str = "Training loss", marks: dict | None = None) -> Figure:
    """Loss per optimiser step (log scale) from a training history: the total, and its parts
    (``lm``, ``thought``) where recorded; ``marks`` ({step: label}) draws a dashed line at each
    step where the run changed (a warm start on other data, say)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2), constrained_layout=True)
    steps = np.arange(1, len(history) + 1)
    for key, color in (("loss", "0.2"), ("lm", "#2e86ab"), ("thought", "#d1495b")):
        vals = [h.get(key) for h in history]
        if all(v is not None for v in vals):
            ax.plot(steps, vals, color=color, lw=1, label=key)
    for step, label in (marks or {}).items():
        ax.axvline(step, color="0.5", ls="--", lw=0.8)
        right = step > 0.6 * len(history)  # a late mark's label goes on its left, inside the axes
        ax.annotate(label, (step, 1), xycoords=("data", "axes fraction"), xytext=(-3 if right else 3, -4),
                    textcoords="offset points", fontsize=7, color="0.35", va="top", ha="right" if right else "left")
    ax.set_yscale("log")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    return fig
