"""Belief trajectories: the probe's distribution over states at every layer and position of one text.

Any text can be read; the truth strip appears when the truth is known: a prompt of a task (parsed),
a record of your data (``data`` + ``index``) or events given with the text. Two figures: a layer ×
position heatmap with the tokens on the x axis and the true state in a strip underneath, and a line
plot at the best layer with the true state as a step function (and the forced answers at every event
boundary as squares). Accuracy is the argmax over every class against the true class.

A Thinking States model (``thinking``, ``smollm2-thinking``) needs no probe: it writes its belief
down, so the figure shows, token by token, the truth, and at every event boundary the model's
thought and its forced answer (with a probe folder, the probe's row is added).

Usage (not run as a doctest: it needs stored activations, probes or a model)::

    res = main(BeliefsConfig(model="target", probes="runs/demo/probes/target",
                             prompt="A coin is heads . Alice flips . Bob stays . State ?", out="beliefs.png"))
    res["files"]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import singledispatch

import numpy as np

from ..models.load import load_model
from ..models.thinking.model import ThinkingStates
from ..tasks.parse import parse_prompt
from ..tasks.records import DataConfig, load_data
from . import plots
from .common import (
    best_probe_layer,
    check_probe_matches,
    check_probe_states,
    check_writable_parent,
    load_probe,
    probe_distribution,
    probe_for_record,
    probe_hooks_by_layer,
    probe_state_names,
    save_fig,
    sibling,
    token_strings,
)
from .forced import forced_answers
from .instrument import story_readout
from .lens_readable import lens_answers, one_token_classes
from .state_strips import state_colours, strips_figure


@dataclass
class BeliefsConfig:
    """`beliefscope beliefs`: one text, one probe folder, two figures."""

    model: str = "target"  # checkpoint folder or alias (target, smollm2); must be the model the probe was fit on
    probes: str = ""  # folder written by `beliefscope probe --out` (optional for Thinking States models)
    prompt: str = ""  # any text; with a task (or a probe fitted on one) it is parsed for the truth strip
    out: str = "beliefs.png"  # heatmap PNG; the line plot goes to OUT with suffix "-line"
    task: str | None = None  # task whose parser gives the truth (coinflip, cups, variables); None: the probe's own
    #   task when it was fitted on one, else no parser (any text)
    data: str = ""  # your records (as for harvest --data): read record --index, with its labels as the truth
    index: int = 0  # which record of --data
    events: str = ""  # the truth of --prompt as JSON events, e.g. '[{"end": 23, "state": "hall"}]'
    layer: int | None = None  # layer of the line plot (default: the probe report's best layer)
    forced: bool = True  # add forced answers at the event boundaries to the line plot (tasks only)


@dataclass
class BeliefTrajectory:
    """Probe readout of one text at every probed layer."""

    tokens: list[str]  # [T] token strings
    layers: list[int]  # [L] block index of each row (-1 = embedding)
    p: np.ndarray  # [L, T, K] the probe's distribution over the K classes
    true_state: np.ndarray  # [T] true class index (-1 where unknown or unlabelled)
    boundaries: np.ndarray  # [n_events] token index of each event boundary
    state_names: list[str]  # the K class names, e.g. ["heads", "tails"]
    scored_on: str | None = None  # how the probe read this text: out-of-fold, held-out, or None (unknown)

    @property
    def p_state(self) -> np.ndarray:
        """``[L, T]`` P(first class), e.g. P(heads)."""
        return self.p[..., 0]

    def row(self, layer: int) -> np.ndarray:
        """``[T]`` P(first class) at `layer`."""
        return self.probs(layer)[:, 0]

    def probs(self, layer: int) -> np.ndarray:
        """``[T, K]`` the probe's distribution at `layer`."""
        if layer not in self.layers:
            raise ValueError(f"layer {layer} was not probed; the probe has layers {self.layers}")
        return self.p[self.layers.index(layer)]

    def scored(self) -> np.ndarray:
        """``[T]`` bool: tokens whose truth is known, from the first event on."""
        start = self.boundaries[0] if len(self.boundaries) else 0
        return (np.arange(len(self.tokens)) >= start) & (self.true_state >= 0)

    def accuracy(self, layer: int) -> float | None:
        """Agreement of the probe's argmax over every class with the true class, on `scored` tokens (None
        when no token has a known truth)."""
        seen = self.scored()
        if not seen.any():
            return None
        pred = self.probs(layer).argmax(-1)
        return float(np.mean(pred[seen] == self.true_state[seen]))


def trajectory(bridge, tok, probe, ex, *, model_name: str = "", checked: bool = False) -> BeliefTrajectory:
    """Read the probe at every layer and position of `ex` (an `Example`, or any text). The probe is refused
    unless it was fitted on this model, and (for an example) on these states, as on the command line. A probe
    loaded from a `probe --out` folder reads an example it was fitted on with the fold probe that did not see it
    (`scored_on` says which), as the command line does; a probe fitted in memory is read as it is."""

    if not checked:
        check_probe_matches(probe, bridge, model_name)
    scored_on = None
    if isinstance(ex, str):
        ids = np.asarray(tok(ex)["input_ids"])
        truth, bnd = np.full(len(ids), -1), np.zeros(0, dtype=int)
        names = probe_state_names(probe, [str(k) for k in range(probe.n_classes)])
    else:
        if probe.folder:
            probe, scored_on = probe_for_record(probe, probe.folder, ex)
        check_probe_states(probe, ex)
        lab = ex.labels(tok, text=ex.prompt)
        ids, truth, bnd = lab.input_ids, lab.state, np.nonzero(lab.is_event_boundary)[0]
        names = list(ex.meta.get("classes") or ex.state_names)
    pairs = probe_hooks_by_layer(probe)
    p = probe_distribution(bridge, probe, ids, [h for _, h in pairs])  # [L, T, K]
    return BeliefTrajectory(token_strings(tok, ids), [layer for layer, _ in pairs], p, np.asarray(truth), bnd, names,
                            scored_on)


def figures(traj: BeliefTrajectory, layer: int, forced=None):
    """(heatmap, line plot) figures of a trajectory; `forced` = ForcedAnswers of the same prompt. Two classes
    share one diverging scale (P(first class)); more get their own colour, shaded by the probability."""
    labels = ["emb" if x < 0 else f"L{x}" for x in traj.layers]
    if len(traj.state_names) > 2:

        colours = state_colours(len(traj.state_names))
        return (plots.class_heatmap(traj.p, traj.tokens, traj.true_state, traj.state_names, colours,
                                    layer_labels=labels),
                plots.class_lines(traj.probs(layer), traj.tokens, traj.true_state, traj.state_names, colours, layer,
                                  boundaries=traj.boundaries,
                                  **({"forced": forced.p_state, "forced_positions": forced.positions} if forced
                                     is not None else {})))
    s0 = traj.state_names[0]
    truth = np.where(traj.true_state < 0, np.nan, (traj.true_state == 0).astype(float))
    heat = plots.belief_heatmap(traj.p_state, traj.tokens, truth, state_name=s0, layer_labels=labels)
    kw = {}
    if forced is not None:
        kw = {"forced": forced.p_state[:, 0], "forced_positions": forced.positions}
    line = plots.belief_lines(traj.row(layer), traj.tokens, truth, layer, state_name=s0, boundaries=traj.boundaries,
                              **kw)
    return heat, line


def _truth_example(config: BeliefsConfig, probe):
    """The example whose labels are the truth strip (None: read the text alone)."""

    if config.data:
        return _record_example(config, probe)
    if not config.prompt:
        raise ValueError("give the text to read: --prompt TEXT, or --data FILE --index I")
    if config.events:

        try:
            events = json.loads(config.events)
        except json.JSONDecodeError as e:
            raise ValueError(f"--events is not JSON ({e.msg}): give a list such as "
                             '\'[{"end": 23, "state": "hall"}]\'') from None
        names = probe_state_names(probe, []) if probe is not None else []
        data = load_data([{"text": config.prompt, "events": events}],
                         classes=(f"events={','.join(names)}",) if names else ())
        return data.example(0, "events")
    hc = (probe.meta.get("harvest_config") or {}) if probe is not None else {}
    task = config.task or (hc.get("task") if probe is not None and probe.meta.get("source", "task") == "task" else None)
    if probe is None and task is None:
        task = "coinflip"
    return parse_prompt(config.prompt, task) if task else None


def _record_example(config: BeliefsConfig, probe):

    dc = ((probe.meta.get("harvest_config") or {}).get("data_config") if probe is not None else None) or {}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in dc.items() if k in DataConfig.__dataclass_fields__}
    data = load_data(config.data, DataConfig(**fields))
    if not 0 <= config.index < len(data):
        raise ValueError(f"--index {config.index} is outside the {len(data)} records of {config.data}")
    label = probe.meta.get("label") if probe is not None else None
    label = data.label_names[0] if label in (None, "state") else label
    return data.example(config.index, label)


def main(config: BeliefsConfig, *, bridge=None, tok=None) -> dict:
    """Read the probe on the text, check the probe belongs to the model (and to the text's states, when the
    truth is known), write both figures; returns a summary with every position's class probabilities."""

    out = check_writable_parent(config.out)
    if config.task and not (config.data or config.events):

        parse_prompt(config.prompt, config.task)  # a prompt the named task cannot parse fails first
    probe = load_probe(config.probes) if config.probes else None
    ex = _truth_example(config, probe)  # fails clearly before any model is loaded
    if probe is not None and ex is not None:
        check_probe_states(probe, ex)
    if bridge is None:

        bridge, tok = load_model(config.model)
    return _read(bridge, tok, config, ex, probe, out)


@singledispatch
def _read(bridge, tok, config: BeliefsConfig, ex, probe, out: str) -> dict:
    """`main` on a loaded model: its beliefs read with the probe (a Thinking States model: its overload)."""
    if probe is None:
        raise ValueError(f"{config.model!r} writes no thoughts, so its beliefs are read with a probe: fit one with "
                         f"`beliefscope harvest` and `beliefscope probe --out DIR`, then pass --probes DIR")
    check_probe_matches(probe, bridge, config.model)
    layer = config.layer if config.layer is not None else best_probe_layer(probe, config.probes)
    # a text the probe was fitted on is read by the fold probe that did not see it (`trajectory` picks it)
    traj = trajectory(bridge, tok, probe, ex if ex is not None else config.prompt, checked=True)
    scored_on = traj.scored_on
    asks = ex is not None and (ex.task != "data" or bool(ex.meta.get("question")))  # a record with its own question
    forced = forced_answers(bridge, tok, ex) if config.forced and asks else None
    heat, line = figures(traj, layer, forced)
    line_path = sibling(out, "-line")
    save_fig(heat, out)
    save_fig(line, line_path)
    names, at, seen = traj.state_names, traj.probs(layer), traj.scored()
    # "truth" exactly where accuracy_at_layer scores (from the first event on), so the JSON recomputes it
    positions = [{"token": t, "p": [round(float(x), 4) for x in at[i]], "pred": names[int(at[i].argmax())],
                  **({"truth": names[int(traj.true_state[i])]} if seen[i] else {})}
                 for i, t in enumerate(traj.tokens)]
    acc = traj.accuracy(layer)
    res = {"prompt": ex.prompt if ex is not None else config.prompt, "model": config.model,
           "probes": os.path.abspath(config.probes), "label": probe.meta.get("label"), "layer": layer,
           "tokens": traj.tokens, "layers": traj.layers, "state_names": names, "positions": positions,
           "p_state0": np.round(traj.p_state, 4).tolist(), "true_state": traj.true_state.tolist(),
           "event_boundaries": traj.boundaries.tolist(),
           "accuracy_at_layer": None if acc is None else round(acc, 4), "scored_tokens": int(traj.scored().sum()),
           "scored_on": scored_on,
           "answer": ex.answer if ex is not None and ex.events else None, "files": [out, line_path]}
    if forced is not None:
        res["forced_p_state0"] = np.round(forced.p_state[:, 0], 4).tolist()
        res.update(lens_part(bridge, tok, ex, forced, out, res["files"]))
    return res


@_read.register(ThinkingStates)
def _read_thoughts(model, tok, config: BeliefsConfig, ex, probe, out: str) -> dict:
    """A Thinking States model's beliefs are the thoughts it writes (a probe, when given, is read beside them)."""
    if ex is None:
        raise ValueError("a Thinking States model reads its own stories: pass --task with a story it parses")
    return _thinking_beliefs(config, model, tok, ex, probe, out)


def lens_part(model, tok, ex, forced, out: str, files: list) -> dict:
    """The trajectory through the logit lens (`analyses.lens_readable`): every block's answer at every token, the
    block from which the model's answer is readable at each (None: not there), and a layer x token figure
    (``-lens`` beside the others) of the lens's distribution over the class words. Nothing where the class
    words are not one token each."""
    if not one_token_classes(tok, ex.state_names):
        return {}
    r = lens_answers(model, tok, ex, forced=forced)
    names, share = list(ex.state_names), r["share"]["logit"]  # [L, T, K]
    tokens, truth = token_strings(tok, ex.labels(tok, text=ex.prompt).input_ids), ex.labels(tok, text=ex.prompt).state
    path = sibling(out, "-lens")
    labels = [f"L{x}" for x in range(share.shape[0])]
    title = "logit lens: the class words at every block and token"
    if len(names) > 2:
        fig = plots.class_heatmap(share, tokens, truth, names, state_colours(len(names)), layer_labels=labels,
                                  title=title)
    else:
        fig = plots.belief_heatmap(share[..., 0], tokens, np.where(truth < 0, np.nan, (truth == 0).astype(float)),
                                   title=title, state_name=names[0], layer_labels=labels)
    save_fig(fig, path)
    files.append(path)
    return {"lens": [[names[k] for k in row] for row in r["logit"].T.tolist()],  # [T][L]
            "lens_readable_from": r["readable_from"]}


def _thinking_beliefs(config: BeliefsConfig, model, tok, ex, probe, out: str) -> dict:
    """A Thinking States model's own beliefs on one prompt: truth, thought and forced answer at
    every event boundary (and the probe at every token when one is given), as categorical strips."""

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
    res.update(lens_part(model, tok, ex, forced_answers(model, tok, ex), out, res["files"]))
    if probe is not None:
        res["probe"] = [names[k] for k in r["probe"]]
        res["accuracy_at_layer"] = round(float(np.mean(np.array(r["probe"]) == np.array(r["truth"]))), 4)
    return res
