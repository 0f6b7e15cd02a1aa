"""Validate the belief instrument: probe, forced answer, thought and truth at every event boundary.

For each model, probes are fitted on the residual stream at event-boundary tokens of training-
length stories (1-8 events) and read on held-out prompts at the trained lengths and longer ones.
Beside the best-layer probe stand the forced answer (fork + question), the thought Z_i of a
Thinking States model, and the truth; every pair gets an agreement rate. Controls: a control task
(a random label per (token, position), Hewitt & Liang 2019, which varies along the boundaries
probed, so it can fail there) and the same probe on a randomly initialised twin. A causal check
swaps S_j at one chunk for the other state's and counts how often the downstream thoughts and
the answer follow, against random vectors of equal norm.

The probe's layer is chosen on prompts it was not fitted on: 20% of the training prompts for the
toy grammar, and for natural English other prompts of the held-out templates. A probe can learn the
training templates' words: on `smollm2-thinking` every layer from blocks.1 on reads the state 1.00
on training-template prompts, and blocks.1 only 0.47 on held-out ones.

>>> cfg = InstrumentConfig(models=("thinking",), n_train=24, n_test=8, bands=("1-4",), causal_n=4)
>>> res = main(cfg)
>>> band = res["models"]["thinking"]["bands"]["1-4"]
>>> band["thought_accuracy"], band["forced_accuracy"], band["forced_thought_agreement"]
(1.0, 1.0, 1.0)
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import torch

from beliefscope.base.files import atomic_write_json, atomic_write_text

from ..hooks import capture
from ..models.cards import checkpoint_sha256
from ..models.load import check_model_name, load_model
from ..models.profile import model_profile
from ..probes import fit_all_layers
from ..probes.controls import control_labels
from ..probes.harvest import random_init_like
from ..probes.report import layer_index
from ..tasks import get_task
from ..tasks.records import DataSource
from ..tasks.variables import VARIABLES
from . import plots
from .causal import causal_check
from .causal_readings import causal_summary, load_report
from .common import model_folders, save_fig
from .forced import forced_answers
from .instrument_table import COLUMNS, table_lines  # noqa: F401 (re-exported)
from .lens_readable import instrument_lens, tuned_lenses
from .state_strips import strips_figure


@dataclass
class InstrumentConfig(DataSource):
    """What `main` measures (with `--data`: `analyses.instrument_data.main_data` on your records)."""

    models: tuple = ("target", "direct-rope", "cot-rope", "thinking")  # shipped names or checkpoint folders
    task: str = "coinflip"  # task family the models were trained on: coinflip, cups or variables
    n_train: int = 400  # prompts (the task's training lengths, 1-8 events for coinflip) that fit the probes
    n_test: int = 200  # held-out prompts per band
    bands: tuple | None = None  # event-count bands of the held-out prompts; None: the task's first three
    seed: int = 20261123  # data seed (test prompts use seed + 1 + band index)
    causal_n: int = 200  # prompts of the causal check (Thinking States models only)
    random_init: bool = True  # also probe a randomly initialised twin of each model
    threads: int = 1  # torch CPU threads (toy models gain nothing from more; threads thrash on a busy machine)
    out: str = ""  # folder `beliefscope instrument` writes instrument.json and the agreement figure into ("": none)
    probe_offset: int = 0  # the probes read the token this many after each event's last: 0 the boundary token;
    #   1 the next, the first that a Thinking States model reads the state after the event (S_{i+1}) at
    label: str = ""  # with --data: the label whose running state is tested (default: the data's first label)
    question: str = ""  # with --data: the question appended at every event end for the forced answer
    answers: tuple = ()  # with --data: one answer word per class, in class order (default: the class names)
    acts: str = ""  # a store of your records (harvest --data) whose probes (--probes, from `probe --out`) give every
    #   probe number: only the forced answers run the model (the store's own), and --models is not read
    probes: str = ""  # with --acts: the folder `beliefscope probe --acts ACTS --out` wrote
    n: int | None = None  # with --acts: the records whose forced answers are read (None: every record)
    lens_n: int = 50  # held-out stories of the first band read through the lens (its sentence "readable from layer L
    #   at P", analyses.lens_readable; 0: none)
    interchange: tuple = ()  # `beliefscope interchange --out` folders of the models, MODEL=FOLDER (or one per model):
    #   their causal tests (IIA, DAS, erasure, verdicts per layer) join each model's table
    tuned: tuple = ()  # tuned lens folders (lens-train --out) read beside the logit lens: MODEL=FOLDER entries, or
    #   one folder per model in --models order ("-": none for that model)


def dev_prompts(config: InstrumentConfig, name: str) -> int:
    """Prompts of the held-out templates that choose the probe's layer (0 where the model's task has
    one set of templates: the toy grammar)."""
    train_task, test_task = tasks_for(name, config.task)
    return 0 if test_task is train_task else max(10, config.n_test)


def dev_examples(name: str, task: str, n: int, seed: int):
    """``n`` stories of the held-out templates at the trained lengths (seed + 50, so not the test
    stories) that choose a probe's layer; None where the model's task has one set of templates."""
    train_task, test_task = tasks_for(name, task)
    return None if test_task is train_task else test_task.examples(n, seed + 50, train_task.train_events)


def prompts_read(config: InstrumentConfig) -> int:
    """How many prompts `main` reads (the total of its progress bar): per model, the training and dev
    prompts twice (the model and its random-init twin), every band's held-out prompts, the twin's
    first band, and the first band's stories read through the lens."""
    n_bands = len(config.bands) if config.bands else 3
    lens = min(config.lens_n, config.n_test)  # the first band's stories read through the lens
    return sum(2 * (config.n_train + dev_prompts(config, m)) + config.n_test * (n_bands + 1) + lens
               for m in config.models)


def _hooks(model) -> list[str]:
    return ["hook_embed"] + [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]


@torch.no_grad()
def collect(model, tok, examples, forced: bool = True, progress=None, offset: int = 0) -> dict:
    """Per event boundary: activations ``[L, n, d]`` (at the boundary token, or ``offset`` tokens
    after it: the story then runs on into its question), truth, control label, forced answer, thought."""

    hooks = _hooks(model)
    n_classes = len(examples[0].state_names)
    acts, cols = [], {k: [] for k in ("truth", "control", "forced", "thought", "prompt", "event", "values")}
    for i, ex in enumerate(examples):
        fa = forced_answers(model, tok, ex) if forced else None
        lab = ex.labels(tok, text=ex.prompt if offset else ex.prompt[: ex.events[-1].span[1]])
        pos = np.nonzero(lab.is_event_boundary)[0]
        at = pos + offset  # the rows read; every label is the one at the boundary
        if offset < 0 or (len(at) and at[-1] >= len(lab.input_ids)):
            raise ValueError(f"probe_offset={offset} reads past the prompt's {len(lab.input_ids)} tokens: use 0 or 1")
        with capture(model, hooks) as cap:
            model(torch.as_tensor(lab.input_ids)[None], return_type=None)
        acts.append(torch.stack([cap.stacked(h)[0, at] for h in hooks]).cpu())  # [L, n, d]
        cols["truth"] += lab.state[pos].tolist()
        cols["control"] += control_labels(lab.input_ids[at], at, n_classes).tolist()
        cols["forced"] += fa.p_state.argmax(-1).tolist() if fa else [-1] * len(pos)
        if lab.values is not None:  # every variable's value: [n, V]
            cols["values"] += lab.values[pos].tolist()
        th = fa.thought_state if fa is not None and fa.thought_state is not None else np.full(len(pos), -1)
        cols["thought"] += th.tolist()
        cols["prompt"] += [i] * len(pos)
        cols["event"] += list(range(1, len(pos) + 1))
        if progress:
            progress(1)
    return {"X": torch.cat(acts, 1).float(), **{k: np.asarray(v) for k, v in cols.items()}}


def fit_probes(X: torch.Tensor, y: np.ndarray, prompts: np.ndarray, n_classes: int = 2,
               dev: tuple | None = None) -> tuple:
    """Probes for every layer; returns (probe, best_layer). Without ``dev`` the best layer is the one
    most accurate on 20% of the prompts when fitted on the other 80%, then every layer is refitted on
    all rows. With ``dev = (X_dev, y_dev)`` (rows of other prompts, e.g. held-out templates) every
    layer is fitted on all rows and the best layer is the one most accurate on ``dev``: a probe that
    only learned the training templates' words then loses to one that reads the state."""

    if dev is not None:
        probe = fit_all_layers(X, torch.as_tensor(y), n_classes=n_classes)
        return probe, int(np.argmax(layer_accuracy(probe, *dev)))
    held = prompts % 5 == 0
    val = fit_all_layers(X[:, ~held], torch.as_tensor(y[~held]), n_classes=n_classes)
    acc = layer_accuracy(val, X[:, held], y[held])
    return fit_all_layers(X, torch.as_tensor(y), n_classes=n_classes), int(np.argmax(acc))


def layer_accuracy(probe, X: torch.Tensor, y: np.ndarray) -> list[float]:
    """Accuracy of ``probe``'s layer ``i`` on rows ``X[i]`` (``[L, n, d]``) against labels ``y``."""
    return [float((probe.predict(X[i], probe.hooks[i]).numpy() == y).mean()) for i in range(X.shape[0])]


def confusion(truth: np.ndarray, pred: np.ndarray, n_classes: int) -> list[list[int]]:
    """``[truth class][predicted class]`` counts.

    >>> confusion(np.array([0, 0, 2]), np.array([0, 1, 2]), 3)
    [[1, 1, 0], [0, 0, 0], [0, 0, 1]]
    """
    out = np.zeros((n_classes, n_classes), dtype=int)
    np.add.at(out, (truth, pred), 1)
    return out.tolist()


def _variable_probes(cols: dict, n_classes: int) -> dict:
    """Multi-variable tasks: a probe (and its best layer) for every variable's value; else {}."""
    if not len(cols["values"]):
        return {}

    return {v: fit_probes(cols["X"], cols["values"][:, k], cols["prompt"], n_classes)
            for k, v in enumerate(VARIABLES)}


@torch.no_grad()
def story_readout(model, tok, ex, probe=None, layer: int | None = None) -> dict:
    """One story token by token, for a figure a reader can follow: the truth and the probe's
    state (argmax and its probability) at every prompt token, the forced answer and the thought at
    every event boundary. Without a probe (``probe=None``) the probe rows are left out."""

    lab = ex.labels(tok, text=ex.prompt)
    fa = forced_answers(model, tok, ex)
    out = {"tokens": [tok.decode([int(t)]) for t in lab.input_ids], "truth": lab.state.tolist(),
           "boundaries": fa.positions.tolist(), "forced": fa.p_state.argmax(-1).tolist()}
    if probe is not None:
        hook = _hooks(model)[layer]
        with capture(model, [hook]) as cap:
            model(torch.as_tensor(lab.input_ids)[None], return_type=None)
        p = torch.softmax(probe.logits(cap.stacked(hook)[0].float().cpu(), probe.hooks[layer]), -1)  # [T, n_classes]
        out |= {"probe": p.argmax(-1).tolist(), "probe_p": [round(float(x), 3) for x in p.max(-1).values]}
    if fa.thought_state is not None:
        out["thought"] = fa.thought_state.tolist()
    return out


def agreement(cols: dict, probe_pred: np.ndarray, n_classes: int = 2) -> dict:
    """Accuracies against the truth, the probe's confusion matrix, and pairwise agreement of
    probe / forced / thought."""
    t, f, th = cols["truth"], cols["forced"], cols["thought"]
    out = {"n_boundaries": len(t), "probe_accuracy": float(np.mean(probe_pred == t)),
           "probe_confusion": confusion(t, probe_pred, n_classes)}
    if (f >= 0).all():
        out.update(forced_accuracy=float(np.mean(f == t)), probe_forced_agreement=float(np.mean(probe_pred == f)))
    if (th >= 0).any():
        out.update(thought_accuracy=float(np.mean(th == t)), probe_thought_agreement=float(np.mean(probe_pred == th)),
                   forced_thought_agreement=float(np.mean(f == th)))
    return out


def verdict(name: str, bands: dict, chance: float = 0.5) -> str:
    """Words computed from the numbers: does the model keep a running state at event boundaries?
    With several variables the question is not asked yet at a boundary, so the state is every
    variable's value: the verdict reads the per-variable probes (their mean)."""
    if all("variable_probe_accuracy" in b for b in bands.values()):
        each = [float(np.mean(list(b["variable_probe_accuracy"].values()))) for b in bands.values()]
        worst = min(min(b["variable_probe_accuracy"].values()) for b in bands.values())  # every variable, not the mean
        if worst >= 0.9:
            return (f"{name} keeps every variable: probes read each variable's value at every event boundary "
                    f"with accuracy >= {worst:.2f} for every variable in every band")
        written = [b.get("thought_accuracy", 0.0) for b in bands.values()]
        if written[0] >= 0.9:  # the binding is in the thoughts (and S, which the next chunk receives)
            return (f"{name} writes every binding down: its thoughts name the variables' values at the event "
                    f"boundaries with accuracy >= {min(written):.2f} in every band, while per-variable probes of the "
                    f"residual stream read {each[0]:.2f} on average in the first band and {each[-1]:.2f} in the last "
                    f"(chance {chance:.2f})")
        return (f"{name} keeps no complete readable binding at the event boundaries: the per-variable probes "
                f"read {each[0]:.2f} on average in the first band and {each[-1]:.2f} in the last (chance {chance:.2f})")
    probe = min(b["probe_accuracy"] for b in bands.values())
    forced = min(b.get("forced_accuracy", float("nan")) for b in bands.values())
    thought = min(b.get("thought_accuracy", 0.0) for b in bands.values())  # 0: the model writes no thoughts
    first = next(iter(bands))
    if probe >= 0.9:
        return (f"{name} keeps a running state: its best-layer probe reads the state at every event boundary "
                f"with accuracy >= {probe:.2f} in every band")
    last = list(bands)[-1]
    if bands[first].get("thought_accuracy", 0.0) >= 0.9:  # a written state is not a lazy one, even where it decays
        acc, where = ((thought, "in every band") if thought >= 0.9 else
                      (bands[first]["thought_accuracy"],
                       f"at {first} events ({bands[last]['thought_accuracy']:.2f} at {last})"))
        best = max(b["probe_accuracy"] for b in bands.values())
        p_first, p_last = bands[first]["probe_accuracy"], bands[last]["probe_accuracy"]
        probe_words = (f"and its best-layer probe reads it at the boundary too ({p_first:.2f} at {first} events, "
                       f"{p_last:.2f} at {last})" if p_first >= 0.9 else
                       f"while its best-layer probe at the boundary reads at most {best:.2f} (chance {chance:.2f})")
        return (f"{name} writes its running state down: its thoughts name the state at every event boundary with "
                f"accuracy >= {acc:.2f} {where}, {probe_words}")
    if bands[first].get("forced_accuracy", 0) >= 0.9 and bands[first]["probe_accuracy"] < 0.8:
        return (f"{name} computes the state lazily: asked at a boundary it answers "
                f"{bands[first]['forced_accuracy']:.2f} correctly, but no linear probe reads the state there "
                f"({bands[first]['probe_accuracy']:.2f})")
    if probe >= chance + (1 - chance) / 2:
        return (f"{name} keeps a partly readable running state: its best-layer probe reads >= {probe:.2f} in every "
                f"band (chance {chance:.2f}), forced answers >= {forced:.2f}")
    return (f"{name} keeps no readable running state (probe >= {probe:.2f}, forced answers >= {forced:.2f} "
            f"across bands; chance is {chance:.2f})")


def tasks_for(name: str, task: str = "coinflip"):
    """(train task, test task) in the model's own rendering: natural English fits on the train
    templates and names and tests on the held-out ones; the toy grammar has one set."""

    if model_profile(name).rendering == "natural":
        return (get_task(task, rendering="natural", fmt="direct", split="train"),
                get_task(task, rendering="natural", fmt="direct", split="heldout"))
    t = get_task(task, fmt="direct")
    return t, t


def main(config: InstrumentConfig, progress=None) -> dict:
    """Run the validation for every model; returns a JSON-able dict."""

    for name in config.models:  # every name before any work
        check_model_name(name)
    tuned = tuned_lenses(config.models, config.tuned)
    causal = model_folders(config.models, config.interchange, "--interchange")
    for folder in causal.values():  # every report readable before any model loads
        load_report(folder)
    torch.set_num_threads(config.threads)
    read = functools.partial(collect, offset=config.probe_offset)  # the probes' rows
    out = {"config": {k: getattr(config, k) for k in config.__dataclass_fields__}, "models": {}}
    for name in config.models:
        train_task, test_task = tasks_for(name, config.task)
        bands = tuple(config.bands or train_task.bands[:3])
        n_classes = len(train_task.state_names)
        train = train_task.examples(config.n_train, config.seed, train_task.train_events)
        tests = {b: test_task.examples(config.n_test, config.seed + 1 + i, b) for i, b in enumerate(bands)}
        # held-out templates: the layer is chosen on other prompts of them (the trained lengths), so a
        # probe that learned the training templates' words cannot win by a tie at 1.0
        dev = dev_examples(name, config.task, dev_prompts(config, name), config.seed)
        model, tok = load_model(name)
        if tuned.get(name) is not None:
            tuned[name].check_model(model, name)
        tr = read(model, tok, train, forced=False, progress=progress)
        dv = read(model, tok, dev, forced=False, progress=progress) if dev else None
        probe, layer = fit_probes(tr["X"], tr["truth"], tr["prompt"], n_classes,
                                  dev=(dv["X"], dv["truth"]) if dv else None)
        control, _ = fit_probes(tr["X"], tr["control"], tr["prompt"], n_classes)  # read at the state probe's layer
        per_var = _variable_probes(tr, n_classes)
        res = {"task": config.task, "model_sha256": checkpoint_sha256(name),
               "state_names": list(train_task.state_names), "best_layer": layer_index(_hooks(model)[layer]),
               "hook": _hooks(model)[layer], "bands": {},
               "layer_chosen_on": (f"{len(dev)} other prompts of the held-out templates" if dev else
                                   "20% of the training prompts")}
        if dv:
            res["dev_accuracy_by_layer"] = dict(zip(_hooks(model), layer_accuracy(probe, dv["X"], dv["truth"])))
        for band, exs in tests.items():
            te = read(model, tok, exs, progress=progress)
            pred = probe.predict(te["X"][layer], probe.hooks[layer]).numpy()
            b = res["bands"][band] = agreement(te, pred, n_classes)
            b["control_accuracy"] = float((control.predict(te["X"][layer], control.hooks[layer]).numpy()
                                           == te["control"]).mean())
            b["selectivity"] = b["probe_accuracy"] - b["control_accuracy"]
            if per_var:
                b["variable_probe_accuracy"] = {
                    v: float((p.predict(te["X"][lv], p.hooks[lv]).numpy() == te["values"][:, k]).mean())
                    for k, (v, (p, lv)) in enumerate(per_var.items())}
        if per_var:
            res["variable_probe_layers"] = {v: _hooks(model)[lv] for v, (_, lv) in per_var.items()}
        if config.random_init:
            twin = random_init_like(model)
            tr0 = read(twin, tok, train, forced=False, progress=progress)
            dv0 = read(twin, tok, dev, forced=False, progress=progress) if dev else None
            p0, l0 = fit_probes(tr0["X"], tr0["truth"], tr0["prompt"], n_classes,
                                dev=(dv0["X"], dv0["truth"]) if dv0 else None)
            te0 = read(twin, tok, tests[bands[0]], forced=False, progress=progress)
            res["random_init_probe_accuracy"] = float(
                (p0.predict(te0["X"][l0], p0.hooks[l0]).numpy() == te0["truth"]).mean())
        causal_result = causal_check(model, tok, config.causal_n, config.seed + 99, test_task)  # None: no thoughts
        if causal_result is not None:
            res["causal"] = causal_result
        res["trajectory"] = story_readout(model, tok, tests[bands[-1]][0], probe, layer)
        if config.lens_n:
            res["lens"] = instrument_lens(model, tok, tests[bands[0]][: config.lens_n], tuned.get(name), progress)
        if name in causal:  # measured on this checkpoint, or refused
            res["causal_tests"] = causal_summary(load_report(causal[name], model))
        res["verdict"] = verdict(name, res["bands"], 1 / n_classes)
        out["models"][name] = res
    return out


def write(res: dict, folder: str) -> list[str]:
    """``instrument.json``, ``instrument.md``, ``instrument.png`` (probe / forced / thought accuracy
    by band for each model) and ``trajectory.png`` (one story, token by token) into `folder`, atomically."""

    os.makedirs(folder, exist_ok=True)
    names = ("instrument.json", "instrument.md", "instrument.png", "trajectory.png")
    paths = [os.path.join(folder, f) for f in names]
    atomic_write_json(paths[0], res, sort_keys=False)
    atomic_write_text(paths[1], "\n".join(table_lines(res)) + "\n")
    save_fig(plots.instrument_chart(res), paths[2])
    first = next(iter(res["models"].values()))
    if not all("trajectory" in r for r in res["models"].values()):  # --acts: no story was run token by token
        return paths[:3]
    panels = [{"name": name, **r["trajectory"]} for name, r in res["models"].items()]
    band = list(first["bands"])[-1]
    save_fig(strips_figure(panels, first["state_names"], f"One held-out {first['task']} story ({band} events), "
                           "token by token"), paths[3])
    return paths
