"""Every plot function returns a Figure with the expected axes, labels and marks on small arrays."""

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from beliefscope.analyses import plots, plots_decoding

TOKENS = ["A", "coin", "is", "heads", ".", "Bob", "flips", "."]


def _ticklabels(ax, axis="x"):
    ticks = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    return [t.get_text() for t in ticks]


def _legend(ax):
    leg = ax.get_legend() or ax.figure.legends[0]
    return [t.get_text() for t in leg.get_texts()]


def test_belief_heatmap_axes_tokens_and_true_state():
    p = np.linspace(0, 1, 3 * 8).reshape(3, 8)
    true = np.array([1, 1, 1, 1, 1, 1, 0, 0])
    fig = plots.belief_heatmap(p, TOKENS, true, layer_labels=["emb", "L0", "L1"])
    assert isinstance(fig, Figure)
    ax, ax_true, cbar = fig.axes
    assert ax.get_ylabel() == "layer" and _ticklabels(ax, "y") == ["emb", "L0", "L1"]
    assert ax_true.get_xlabel() == "token" and _ticklabels(ax_true) == TOKENS
    np.testing.assert_array_equal(ax.images[0].get_array(), p)
    np.testing.assert_array_equal(ax_true.images[0].get_array()[0], true)
    assert cbar.get_ylabel() == "P(heads)"
    assert "layer × position" in ax.get_title()


def test_belief_heatmap_thins_layer_labels_for_deep_models():
    fig = plots.belief_heatmap(np.zeros((30, 4)), TOKENS[:4], np.zeros(4))
    labels = _ticklabels(fig.axes[0], "y")
    assert labels[0] == "L0" and len(labels) == 15  # every second layer of 30


def test_belief_lines_step_probe_and_forced():
    true = np.array([1, 1, 1, 1, 1, 1, 0, 0], float)
    probe = np.linspace(0.9, 0.1, 8)
    fig = plots.belief_lines(probe, TOKENS, true, layer=2, forced=[0.2], forced_positions=[6])
    (ax,) = fig.axes
    assert ax.get_xlabel() == "token" and ax.get_ylabel() == "P(heads)"
    assert _ticklabels(ax) == TOKENS
    assert _legend(ax) == ["true state is heads", "probe, layer 2", "forced answer"]
    lines = {l.get_label(): l for l in ax.get_lines()}
    np.testing.assert_allclose(lines["probe, layer 2"].get_ydata(), probe)
    np.testing.assert_allclose(lines["forced answer"].get_xydata(), [[6, 0.2]])
    assert ax.get_title() == "Belief trajectory at layer 2"


def test_forced_vs_probe_bars():
    fig = plots.forced_vs_probe([4, 7], np.array([0.9, 0.2]), np.array([0.8, 0.3]), np.array([1, 0]),
                                labels=["1: .", "2: ."])
    (ax,) = fig.axes
    heights = [r.get_height() for r in ax.patches]
    assert heights == pytest.approx([0.9, 0.2, 0.8, 0.3])
    assert _ticklabels(ax) == ["1: .", "2: ."]
    assert ax.get_xlabel() == "event boundary" and ax.get_ylabel() == "P(heads)"
    assert _legend(ax) == ["true state", "forced answer", "probe"]


def test_cache_timeline_cells_colours_tokens_and_positions():
    stages = [("after prefill", ["A", "coin"], [0, 0]),
              ("decode", ["A", "coin", "tails", "heads"], [0, 0, 1, 1]),
              ("verify + rollback", ["A", "coin", "tails", "heads"], [0, 0, 2, 3])]
    fig = plots_decoding.cache_timeline(stages, start=10)
    (ax,) = fig.axes
    cells = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(cells) == 10
    colours = [plots.PROVENANCE_COLORS[c] for _, _, prov in stages for c in prov]
    import matplotlib.colors as mc
    assert [mc.to_hex(c.get_facecolor()) for c in cells] == [mc.to_hex(c) for c in colours]
    assert [t.get_text() for t in ax.texts] == [t for _, toks, _ in stages for t in toks]
    assert _ticklabels(ax, "y") == ["after prefill", "decode", "verify + rollback"]
    assert _ticklabels(ax)[0] == "10" and ax.get_xlabel() == "cache position"
    assert _legend(ax) == ["prefill", "draft", "verified", "rejected"]


def test_acceptance_chart_stacks_and_reports_rate():
    fig = plots_decoding.acceptance_chart([4, 4, 2], [4, 1, 0])
    (ax,) = fig.axes
    heights = [r.get_height() for r in ax.patches]
    assert heights == [4, 1, 0, 0, 3, 2]  # accepted bars, then rejected on top
    assert "acceptance 50%" in ax.get_title()  # 5 of 10
    assert ax.get_xlabel() == "verify step" and ax.get_ylabel() == "draft tokens"


def test_draft_vs_target_beliefs():
    fig = plots.draft_vs_target_beliefs(["p0 pos 9 (ev 2)", "p1 pos 4"], [0.3, np.nan], [0.9, 0.1], [1.0, 0.0])
    (ax,) = fig.axes
    assert _ticklabels(ax) == ["p0 pos 9 (ev 2)", "p1 pos 4"]
    assert _legend(ax) == ["true state", "draft probe", "target probe"]
    assert ax.get_ylabel() == "P(heads)"


def test_determinism_chart():
    fig = plots_decoding.determinism_chart([0, 1, 3], [1, 2, 3], [1, 1, 1])
    (ax,) = fig.axes
    assert ax.get_xlabel() == "co-batched requests" and ax.get_ylabel() == "unique outputs per prompt"
    ys = {l.get_label(): list(l.get_ydata()) for l in ax.get_lines()}
    assert ys == {"fast path (unverified)": [1, 2, 3], "deterministic (verified)": [1, 1, 1]}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_determinism_costs_chart_draws_every_series(n):
    series = {f"path {i}": ([0, 7, 15], [1, 1 + i % 2, 1]) for i in range(n)}
    fig = plots_decoding.determinism_costs_chart(series, {})
    (ax,) = fig.axes
    assert {l.get_label(): list(l.get_ydata()) for l in ax.get_lines()} == {k: v for k, (_, v) in series.items()}


def test_agreement_by_event():
    fig = plots.agreement_by_event([1, 2, 3], [1.0, 0.9, 0.8], [0.95, 0.9, 0.7], [0.95, 0.85, 0.7], layer=3)
    (ax,) = fig.axes
    assert ax.get_xlabel() == "events completed"
    assert _legend(ax)[1] == "probe = true state (layer 3)"
    assert [int(t) for t in ax.get_xticks()] == [1, 2, 3]


def test_steering_chart():
    fig = plots.steering_chart(0.9, [0.0, 0.1, 0.05], layer=2, alpha=1.0)
    (ax,) = fig.axes
    widths = [r.get_width() for r in ax.patches]
    assert widths == pytest.approx([0.9, 0.05])
    assert _ticklabels(ax, "y") == ["random", "probe"] and ax.get_xlabel() == "fraction of answers flipped"
    assert "layer 2" in ax.get_title()


def test_loss_curve_draws_each_part_and_the_marks():
    from beliefscope.analyses.plots import loss_curve

    history = [{"loss": 2.0 / s, "lm": 1.0 / s, "thought": 1.0 / s} for s in range(1, 11)]
    fig = loss_curve(history, marks={6: "warm start"})
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert {"loss", "lm", "thought"} <= set(lines)
    assert list(lines["loss"].get_ydata()) == [h["loss"] for h in history]
    marks = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [6, 6]
    assert any(t.get_text() == "warm start" for t in ax.texts)
