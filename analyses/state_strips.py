"""Categorical state strips: one row per signal (truth, probe, forced answer, thought), one cell per
token, coloured by the state it names and labelled with the state's name, so n-way states (three
cups, ten values) read at a glance and without relying on colour alone.

>>> fig = strips_figure([{"name": "m", "tokens": ["a", "=", "3", "."], "truth": [0, 0, 0, 4],
...                       "probe": [0, 0, 4, 4], "probe_p": [0.9, 0.8, 0.6, 1.0], "boundaries": [3],
...                       "forced": [4], "thought": [4]}], ["_", "0", "1", "2", "3"])
>>> len(fig.axes)
1
"""

from __future__ import annotations

from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .plots import belief_stops

# Okabe & Ito's colour-blind-safe palette, then two greys: distinct for up to 10 states; cells also
# carry the state's name, so a reader never has to tell two colours apart.
CATEGORICAL = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999",
               "#000000", "#B3B3B3", "#6E4A1E")
ROWS = (("truth", "truth"), ("probe", "probe (best layer)"), ("forced", "forced answer"), ("thought", "thought"))


def state_colours(n: int) -> list[str]:
    """The colour of each of ``n`` states in every categorical figure and in the viewer. Two states take
    the ends of `plots.BELIEF_CMAP` (heads dark blue, tails dark red), the binary belief's one convention.

    >>> state_colours(2) == [belief_stops()[-1], belief_stops()[0]], len(set(state_colours(3)))
    (True, 3)
    """
    if n == 2:
        stops = belief_stops()
        return [stops[-1], stops[0]]
    return [CATEGORICAL[k % len(CATEGORICAL)] for k in range(n)]


def _is_dark(colour: str) -> bool:
    """Whether white text reads better than black on ``colour`` (relative luminance below 0.4)."""

    r, g, b = to_rgb(colour)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.4


def short_names(names: list[str]) -> list[str]:
    """Cell labels: the names when they are short, else their first letters when those differ.

    >>> short_names(["heads", "tails"]), short_names(["_", "0"])
    (['h', 't'], ['_', '0'])
    """
    if max(map(len, names)) <= 2 or len({n[0] for n in names}) < len(names):
        return list(names)
    return [n[0] for n in names]


def _row(ax, y: float, xs, states, names, alphas=None) -> None:
    colours, names = state_colours(len(names)), short_names(names)
    for i, (x, k) in enumerate(zip(xs, states, strict=True)):
        if k < 0:
            continue
        alpha = 1.0 if alphas is None else max(0.15, alphas[i])
        ax.add_patch(_box(x, y, colours[k], alpha))
        ax.text(x + 0.5, y + 0.45, names[k], ha="center", va="center", fontsize=6,
                color="white" if _is_dark(colours[k]) and alpha > 0.5 else "black")


def _box(x, y, colour, alpha):

    return Rectangle((x, y), 1, 0.9, facecolor=colour, alpha=alpha, edgecolor="white", lw=0.5)


def strips_figure(panels: list[dict], state_names: list[str], title: str = "") -> Figure:
    """One block of rows per panel (a model's `instrument.story_readout`): truth and probe at every
    token (the probe's cell fades with its probability), forced answer and thought at the event
    boundaries."""
    T = max(len(p["tokens"]) for p in panels)
    rows = [(p, key, label) for p in panels for key, label in ROWS if key in p]
    fig = Figure(figsize=(min(24, 2 + 0.16 * T), 0.9 + 0.32 * len(rows) + 0.25 * len(panels)))
    ax = fig.subplots()
    y, ticks, labels = 0.0, [], []
    for panel in panels:
        for key, label in ROWS:
            if key not in panel:
                continue
            if key in ("truth", "probe"):
                xs, states = range(len(panel[key])), panel[key]
            else:
                xs, states = panel["boundaries"], panel[key]
            _row(ax, -y, list(xs), states, state_names, panel["probe_p"] if key == "probe" else None)
            ticks.append(-y + 0.45)
            labels.append(f"{panel['name']}: {label}")
            y += 1
        y += 0.6
    ax.set_yticks(ticks, labels, fontsize=7)
    tokens = panels[0]["tokens"]
    ax.set_xticks([i + 0.5 for i in range(len(tokens))], tokens, rotation=90, fontsize=6)
    ax.set_xlim(0, T)
    ax.set_ylim(-y + 0.4, 1.0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    handles = [_box(0, 0, c, 1.0) for c in state_colours(len(state_names))]
    ax.legend(handles, state_names, ncol=min(len(state_names), 11), fontsize=7, loc="lower left",
              bbox_to_anchor=(0, 1.0), frameon=False, title="state", title_fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9, y=0.995)
    fig.tight_layout()
    return fig
