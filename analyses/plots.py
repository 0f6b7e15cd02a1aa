"""Plot functions: arrays in, matplotlib `Figure` out (testable without a display).

>>> import numpy as np
>>> fig = belief_heatmap(np.random.rand(4, 6), ["A", "coin", "is", "heads", ".", "?"], np.zeros(6))
>>> fig.axes[1].get_xlabel()  # the token axis sits under the true-state strip
'token'
"""

from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import colormaps
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..cache import Provenance
from ..models.thinking.config import THOUGHT

# Provenance colours (as in the LLM-42 paper's figure): prefill blue, draft yellow, verified green (a draft the
# verifier accepted: a darker green), rejected red; Thinking States thoughts (its own cache tag) purple. Keyed by
# the code a cache stores.
PROVENANCE_COLORS = {int(Provenance.PREFILL): "#5b8fd9", int(Provenance.DRAFT): "#f2c94c",
                     int(Provenance.VERIFIED): "#6fcf97", int(Provenance.ACCEPTED): "#2e9e5b",
                     int(Provenance.REJECTED): "#eb5757", int(THOUGHT): "#bb6bd9"}
PROVENANCE_NAMES = {int(p): p.name.lower() for p in (*Provenance, THOUGHT)}

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

    cmap = colormaps[BELIEF_CMAP]
    return [to_hex(cmap(i / (n - 1))) for i in range(n)]


MAX_WIDTH = 18.0  # inches: a long text's figure stays readable on a screen (every k-th token labelled)
MAX_TOKEN_LABELS = 90  # token labels on one axis; beyond, every k-th token is labelled


def _token_width(T: int, extra: float = 2.0) -> float:
    """Figure width for `T` tokens on x: 0.32 in a token, between 6 and `MAX_WIDTH` inches."""
    return min(MAX_WIDTH, max(6.0, 0.32 * T + extra))


def _token_axis(ax, tokens, rotate=True):
    step = max(1, -(-len(tokens) // MAX_TOKEN_LABELS))
    ax.set_xticks(range(0, len(tokens), step))
    ax.set_xticklabels(tokens[::step], rotation=90 if rotate else 0, fontsize=8 if len(tokens) < 60 else 6)
    ax.set_xlabel("token" if step == 1 else f"token (every {step}th labelled)")


def _event_marks(ax, boundaries) -> None:
    """A faint vertical line at each event boundary (the token that completes an event)."""
    for k, b in enumerate(boundaries if boundaries is not None else ()):
        ax.axvline(b, color="0.55", lw=0.7, ls=":", label="event ends" if k == 0 else None)


def belief_heatmap(p_heads: np.ndarray, tokens: list[str], true_state: np.ndarray,
                   title: str | None = None, state_name="heads", layer_labels: list[str] | None = None) -> Figure:
    """Heatmap of P(state) with layers on y and tokens on x; true state marked under the tokens.

    p_heads: [n_layers, T] probabilities; true_state: [T] with 1 where the true state is `state_name`;
    layer_labels: one y label per row (default L0, L1, ...).
    """
    p = np.asarray(p_heads, dtype=float)
    n_layers, T = p.shape
    fig, (ax, ax_true) = plt.subplots(2, 1, figsize=(_token_width(T), 2.2 + min(0.45 * n_layers, 6.0)),
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
                 title: str | None = None, boundaries=None) -> Figure:
    """P(state) at one layer over positions, with the true state as a step function.

    `forced` (optional): forced-answer P(state) at `forced_positions` (e.g. event boundaries).
    """
    T = len(tokens)
    fig, ax = plt.subplots(figsize=(_token_width(T), 3.4), constrained_layout=True)
    x = np.arange(T)
    ax.step(x, np.asarray(true_state, float), where="mid", color="0.35", lw=2, label=f"true state is {state_name}")
    ax.plot(x, p_heads_best, "o-", color="#d1495b", ms=3, lw=1.5, label=f"probe, layer {layer}")
    if forced is not None:
        ax.plot(forced_positions, forced, "s", color="#2e86ab", ms=7, label="forced answer")
    _event_marks(ax, boundaries)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel(f"P({state_name})")
    ax.axhline(0.5, color="0.8", lw=0.8, ls="--")
    _token_axis(ax, tokens)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title(title or f"Belief trajectory at layer {layer}", fontsize=10)
    return fig


def _class_cells(p: np.ndarray, colours: list[str]) -> np.ndarray:
    """RGB cells ``[..., 3]``: the top class's colour, faded toward white as its probability falls to 1/K."""

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
    fig, (ax, ax_true) = plt.subplots(2, 1, figsize=(_token_width(T, 2.5), 2.2 + min(0.45 * n_layers, 6.0)),
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
                layer: int, title: str | None = None, boundaries=None, forced=None, forced_positions=None) -> Figure:
    """One line per class: the probe's P(class) at one layer over positions ``p [T, K]``, with the true class
    marked as a coloured band along the top (nothing where unknown), the event ends dotted and, when given,
    the forced answer's P(class) at each event end (``forced [n, K]`` at ``forced_positions``) as squares."""
    T, K = p.shape
    fig, ax = plt.subplots(figsize=(_token_width(T, 2.5), 3.6), constrained_layout=True)
    x = np.arange(T)
    for k in range(K):
        ax.plot(x, p[:, k], "o-", ms=2.5, lw=1.4, color=colours[k], label=f"P({class_names[k]})")
    truth = np.asarray(truth)
    for i in range(T):
        if truth[i] >= 0:
            ax.axvspan(i - 0.5, i + 0.5, ymin=0.94, ymax=1.0, color=colours[int(truth[i])], lw=0)
    if forced is not None:
        for k in range(K):
            ax.plot(forced_positions, np.asarray(forced)[:, k], "s", ms=6, color=colours[k], mec="k", mew=0.6,
                    label=f"forced P({class_names[k]})")
    _event_marks(ax, boundaries)
    ax.set_ylim(-0.05, 1.12)
    ax.set_ylabel("probability")
    _token_axis(ax, tokens)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False, title="band on top: truth")
    ax.set_title(title or f"Belief trajectory at layer {layer}, every class", fontsize=10)
    return fig


def forced_vs_probe(positions, forced: np.ndarray, probe: np.ndarray, true_state: np.ndarray | None,
                    labels: list[str] | None = None, state_name="heads", chance: float | None = None) -> Figure:
    """Forced-answer P(state) over the probe readout at each event boundary. With more than two classes pass
    each one's P(true class) and ``chance`` (1/k, drawn dotted) with ``true_state=None``: P(first class) alone
    would hide the others."""
    fig, ax = plt.subplots(figsize=(min(14, max(5, 0.5 * len(positions) + 2)), 3.4), constrained_layout=True)
    x = np.arange(len(positions))
    ax.bar(x - 0.2, forced, 0.4, color="#2e86ab", label="forced answer")
    ax.bar(x + 0.2, probe, 0.4, color="#d1495b", label="probe")
    if true_state is not None:
        ax.plot(x, true_state, "k_", ms=18, mew=2, label="true state")
    if chance is not None:
        ax.axhline(chance, color="0.4", lw=0.8, ls=":", label=f"chance (1/{round(1 / chance)})")
    ax.set_xticks(x)
    ax.set_xticklabels(labels or [str(p) for p in positions], rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("event boundary")
    ax.set_ylabel("P(true class)" if true_state is None else f"P({state_name})")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title("Forced answer vs probe at every event", fontsize=10)
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


def agreement_by_event(events, forced_acc, probe_acc, agreement, layer: int | None = None,
                       chance: float = 0.5) -> Figure:
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
    ax.axhline(chance, color="0.6", lw=0.8, ls=":", label=f"chance ({chance:.2f})")
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
    for step, label in (marks or {}).items():  # labels run down beside their line, so close marks never collide
        ax.axvline(step, color="0.5", ls="--", lw=0.8)
        ax.annotate(label, (step, 1), xycoords=("data", "axes fraction"), xytext=(2, -4), rotation=90,
                    textcoords="offset points", fontsize=7, color="0.35", va="top", ha="left")
    ax.set_yscale("log")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))  # clear of the marks
    ax.set_title(title, fontsize=10)
    return fig


def instrument_chart(res: dict) -> Figure:
    """`beliefscope instrument`'s grouped bars (``res``: its JSON): for each model and band, probe / forced / thought
    accuracy beside the control task, chance dotted."""
    keys = [("probe_accuracy", "probe", "#5b8fd9"), ("forced_accuracy", "forced answer", "#f2994a"),
            ("thought_accuracy", "thought", "#bb6bd9"), ("control_accuracy", "control task", "#bdbdbd")]
    models = list(res["models"])
    bands = list(next(iter(res["models"].values()))["bands"])
    fig = Figure(figsize=(2.2 + 2.6 * len(models), 3.4))
    axes = fig.subplots(1, len(models), sharey=True, squeeze=False)[0]
    for ax, name in zip(axes, models, strict=True):
        r = res["models"][name]
        for k, (key, label, color) in enumerate(keys):
            vals = [r["bands"][b].get(key, np.nan) for b in bands]
            ax.bar(np.arange(len(bands)) + (k - 1.5) * 0.2, vals, 0.2, color=color, label=label)
        ax.axhline(1 / len(r.get("state_names", (0, 1))), color="k", lw=0.6, ls=":")  # chance
        ax.set_xticks(range(len(bands)), [f"{b} ev." for b in bands], fontsize=8)
        ax.set_title(f"{name}\nprobe at {r['hook']}", fontsize=9)
        ax.set_ylim(0, 1.05)
    axes[0].set_ylabel("accuracy at event boundaries")
    axes[-1].legend(fontsize=7, loc="lower right")
    title = "The belief instrument: probe, forced answer and thought against the truth, by story length"
    fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() / 0.075)), fontsize=10)  # about 0.075 in a character
    fig.tight_layout()
    return fig
