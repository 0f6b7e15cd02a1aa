"""Belief trajectories: the probe's P(heads) at every layer and position of one prompt.

Two figures: a layer × position heatmap with the tokens on the x axis and the true state in a
strip underneath, and a line plot at the best layer with the true state as a step function (and
the forced answers at every event boundary as squares).

A Thinking States model (``thinking``, ``smollm2-thinking``) needs no probe: it writes its belief
down, so the figure shows, token by token, the truth, and at every event boundary the model's
thought and its forced answer (with a probe folder, the probe's row is added).

Usage (not run as a doctest: it needs stored activations, probes or a model)::

    res = main(BeliefsConfig(model="target", probes="runs/demo/probes/target",
                             prompt="A coin is heads . Alice flips . Bob stays . State ?", out="beliefs.png"))
    res["files"]
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from beliefscope.analyses import plots
from beliefscope.analyses.common import (
    best_probe_layer,
    check_probe_matches,
    check_writable_parent,
    load_probe,
    probe_hooks_by_layer,
    probe_readout,
    probe_state_names,
    save_fig,
    sibling,
    token_strings,
)
from beliefscope.models.profile import model_profile


@dataclass
class BeliefsConfig:
    """`beliefscope beliefs`: one prompt, one probe folder, two figures."""

    model: str = "target"  # checkpoint folder or alias (target, smollm2); must be the model the probe was fit on
    probes: str = ""  # folder written by `beliefscope probe --out` (optional for Thinking States models)
    prompt: str = ""  # free-text prompt, parsed by tasks.parse.parse_prompt
    out: str = "beliefs.png"  # heatmap PNG; the line plot goes to OUT with suffix "-line"
    task: str = "coinflip"  # task whose labeller parses the prompt
    layer: int | None = None  # layer of the line plot (default: the probe report's best layer)
    forced: bool = True  # add forced answers at the event boundaries to the line plot


@dataclass
class BeliefTrajectory:
    """Probe readout of one prompt at every probed layer."""

    tokens: list[str]  # [T] token strings
    layers: list[int]  # [L] block index of each row (-1 = embedding)
    p_state: np.ndarray  # [L, T] probe P(state 0), e.g. P(heads)
    true_state: np.ndarray  # [T] true state index after the events completed so far
    boundaries: np.ndarray  # [n_events] token index of each event boundary
    state_names: list[str]  # e.g. ["heads", "tails"]

    def row(self, layer: int) -> np.ndarray:
        if layer not in self.layers:
            raise ValueError(f"layer {layer} was not probed; the probe has layers {self.layers}")
        return self.p_state[self.layers.index(layer)]

    def accuracy(self, layer: int) -> float:
        """Agreement of the probe's argmax with the true state after the first event."""
        seen = np.arange(len(self.tokens)) >= (self.boundaries[0] if len(self.boundaries) else 0)
        pred = (self.row(layer) < 0.5).astype(int)
        return float(np.mean(pred[seen] == self.true_state[seen]))


def trajectory(bridge, tok, probe, ex) -> BeliefTrajectory:
    """Read the probe at every layer and prompt position of example `ex`."""
    lab = ex.labels(tok, text=ex.prompt)
    pairs = probe_hooks_by_layer(probe)
    p = probe_readout(bridge, probe, lab.input_ids, [h for _, h in pairs])  # [L, T]
    return BeliefTrajectory(token_strings(tok, lab.input_ids), [layer for layer, _ in pairs], p, lab.state,
                            np.nonzero(lab.is_event_boundary)[0], probe_state_names(probe, ex.state_names))


def figures(traj: BeliefTrajectory, layer: int, forced=None):
    """(heatmap, line plot) figures of a trajectory; `forced` = ForcedAnswers of the same prompt."""
    s0 = traj.state_names[0]
    labels = ["emb" if x < 0 else f"L{x}" for x in traj.layers]
    heat = plots.belief_heatmap(traj.p_state, traj.tokens, (traj.true_state == 0).astype(float),
                                state_name=s0, layer_labels=labels)
    kw = {}
    if forced is not None:
        kw = {"forced": forced.p_state[:, 0], "forced_positions": forced.positions}
    line = plots.belief_lines(traj.row(layer), traj.tokens, (traj.true_state == 0).astype(float), layer,
                              state_name=s0, **kw)
    return heat, line


def main(config: BeliefsConfig, *, bridge=None, tok=None) -> dict:
    """Parse the prompt, check the probe belongs to the model, write both figures; returns a summary."""
    from beliefscope.analyses.forced import forced_answers
    from beliefscope.tasks.parse import parse_prompt

    out = check_writable_parent(config.out)
    ex = parse_prompt(config.prompt, config.task)  # fails clearly before any model is loaded
    thinking = bridge is not None and hasattr(bridge, "thinking_config") or model_profile(config.model).thinking
    if not config.probes and not thinking:
        raise ValueError(f"{config.model!r} writes no thoughts, so its beliefs are read with a probe: fit one with "
                         f"`beliefscope harvest` and `beliefscope probe --out DIR`, then pass --probes DIR")
    probe = load_probe(config.probes) if config.probes else None
    if bridge is None:
        from beliefscope.models.load import load_model

        bridge, tok = load_model(config.model)
    if thinking:
        return _thinking_beliefs(config, bridge, tok, ex, probe, out)
    check_probe_matches(probe, bridge, config.model)
    layer = config.layer if config.layer is not None else best_probe_layer(probe, config.probes)
    traj = trajectory(bridge, tok, probe, ex)
    forced = forced_answers(bridge, tok, ex) if config.forced else None
    heat, line = figures(traj, layer, forced)
    line_path = sibling(out, "-line")
    save_fig(heat, out)
    save_fig(line, line_path)
    res = {"prompt": config.prompt, "model": config.model, "probes": os.path.abspath(config.probes),
           "layer": layer, "tokens": traj.tokens, "layers": traj.layers,
           "p_state0": np.round(traj.p_state, 4).tolist(), "state_names": traj.state_names,
           "true_state": traj.true_state.tolist(), "event_boundaries": traj.boundaries.tolist(),
           "accuracy_at_layer": round(traj.accuracy(layer), 4), "answer": ex.answer, "files": [out, line_path]}
    if forced is not None:
        res["forced_p_state0"] = np.round(forced.p_state[:, 0], 4).tolist()
    return res


def _thinking_beliefs(config: BeliefsConfig, model, tok, ex, probe, out: str) -> dict:
    """A Thinking States model's own beliefs on one prompt: truth, thought and forced answer at
    every event boundary (and the probe at every token when one is given), as categorical strips."""
    from beliefscope.analyses.instrument import story_readout
    from beliefscope.analyses.state_strips import strips_figure

    layer = None
    if probe is not None:
        check_probe_matches(probe, model, config.model)
        layer = config.layer if config.layer is not None else best_probe_layer(probe, config.probes)
    r = story_readout(model, tok, ex, probe, layer)
    names = list(ex.state_names)
    title = f"{config.model}: thoughts and forced answers at each event (answer {ex.answer})"
    save_fig(strips_figure([{"name": config.model, **r}], names, title), out)
    truth = [r["truth"][b] for b in r["boundaries"]]
    thoughts = [names[k] if k is not None and k >= 0 else None for k in r.get("thought", [])]
    res = {"prompt": config.prompt, "model": config.model, "probes": os.path.abspath(config.probes) if probe else None,
           "layer": layer, "tokens": r["tokens"], "state_names": names, "true_state": r["truth"],
           "event_boundaries": r["boundaries"], "truth_at_boundaries": [names[k] for k in truth],
           "thoughts": thoughts, "forced": [names[k] for k in r["forced"]],
           "thought_accuracy": round(float(np.mean([t == names[k] for t, k in zip(thoughts, truth)])), 4)
           if thoughts else None, "answer": ex.answer, "files": [out]}
    if probe is not None:
        res["probe"] = [names[k] for k in r["probe"]]
        res["accuracy_at_layer"] = round(float(np.mean(np.array(r["probe"]) == np.array(r["truth"]))), 4)
    return res
