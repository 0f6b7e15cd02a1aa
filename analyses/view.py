"""`beliefscope view`: one self-contained HTML page to explore beliefs token by token.

For a list of stories and one or more models, the page shows every token coloured by the probe's
belief at a chosen layer (a slider per model), and on hover or focus: the truth, the probe's
P(state) at every layer, the forced answer (early answering, Lanham et al. 2023), the thought of a
Thinking States model (Amos et al. 2026), and, for stories decoded speculatively, the KV cache's
provenance of every position with each verify step's drafted, accepted and rolled-back tokens
(Leviathan et al. 2023). It is the per-token view CircuitsVis's ``colored_tokens`` and
Neuronpedia's token activations give for a single signal, with every readout side by side.

Everything the page draws is in one JSON object (`build`), embedded in the page; the page loads
nothing else (no CDN, no network). Probes come from ``probes`` folders (hash-checked against the
model) or are fitted here on training-length stories at event boundaries, as `instrument` does.

Usage (not run as a doctest: it loads models)::

    res = main(ViewConfig(models=("thinking", "target"), events="9-16", n=6, out="view.html"))
    res["bytes"]
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from beliefscope.base.files import atomic_write_json, atomic_write_text

from ..decoding import SpecConfig, make_drafter, speculative_generate
from ..hooks import capture
from ..models.cards import read_card
from ..models.load import check_model_name, load_model
from ..models.names import checkpoint_path
from ..models.profile import model_profile, writes_thoughts
from ..tasks import get_task, parse_events_range
from ..tasks.parse import parse_prompt
from ..tasks.records import DataSource
from .causal_readings import iia_by_layer, load_report
from .common import (
    best_probe_layer,
    check_probe_matches,
    check_probe_rendering,
    check_writable_parent,
    load_probe,
    model_folders,
    probe_for_record,
    probe_hooks_by_layer,
    probe_state_names,
    token_strings,
)
from .forced import forced_answers
from .instrument import _hooks as hooks
from .instrument import collect, dev_examples, fit_probes, tasks_for
from .lens_readable import lens_answers, lens_hover, one_token_classes
from .plots import PROVENANCE_COLORS, PROVENANCE_NAMES, belief_stops
from .state_strips import state_colours
from .view_page import render


@dataclass
class ViewConfig(DataSource):
    """What `beliefscope view` draws (with `--data`: your records, read with `--probes`)."""

    models: tuple = ("thinking", "target")  # model names shown side by side (shipped names or folders)
    task: str = "coinflip"  # task family of the stories: coinflip, cups or variables
    events: str = "9-16"  # events per story, an inclusive range LO-HI
    n: int = 6  # stories
    seed: int = 2029  # seed of the sampled stories (the probes' own stories use seed + 1)
    prompts: tuple = ()  # stories given as text instead of sampled ones (parsed with the task's parser)
    probes: tuple = ()  # one probe folder per model ("" = fit one here); same order as `models`
    n_train: int = 120  # training-length stories whose event boundaries fit the probes fitted here
    decode: str = "auto"  # model decoded speculatively ("auto": the first model that writes no thoughts; "" none)
    drafter: str = "draft:draft"  # decoding.make_drafter spec of the speculative decode
    gamma: int = 4  # tokens drafted per verify step
    max_new_tokens: int = 24  # generation budget of each decoded story
    out: str = "view.html"  # the page (written atomically); the JSON it was built from goes to `json_out`
    json_out: str = ""  # also write the page's data as JSON here ("" = only inside the page)
    threads: int = 1  # torch CPU threads (toy models gain nothing from more)
    label: str = ""  # with --data: the label drawn (default: the probe's)
    question: str = ""  # with --data: the question asked at every event end for the forced answer
    answers: tuple = ()  # with --data: one answer word per class, in class order (default: the class names)
    interchange: tuple = ()  # `beliefscope interchange --out` folders, MODEL=FOLDER (or one per model): the hover
    #   shows each block's interchange accuracy at event boundaries and the last token


def model_task(name: str) -> str | None:
    """The task a checkpoint was trained on, from its model card (None when the card does not say)."""

    path = checkpoint_path(name, must_exist=False)
    card = read_card(path) if path else {}
    return (card.get("train_config") or {}).get("task") or card.get("task")


def check_model_task(name: str, task: str) -> None:
    """Refuse stories of one task on a model trained on another: its beliefs would be drawn as if right."""
    trained = model_task(name)
    if trained and trained != task:
        raise ValueError(f"model {name!r} was trained on the {trained!r} task, not {task!r}: its probe and answers "
                         f"mean nothing on {task} stories; pick a {task} model (e.g. thinking-{task}) "
                         f"or --task {trained}")


def check_story_tokens(name: str, tok, examples) -> None:
    """Refuse stories the model's tokenizer cannot spell (an unknown token has no honest label)."""
    unk = getattr(tok, "unk_token_id", None)
    for ex in examples:
        ids = tok(ex.prompt)["input_ids"]
        if unk is not None and unk in ids:
            raise ValueError(f"story {ex.prompt[:60]!r}... has words model {name!r}'s tokenizer does not know "
                             f"({tok.unk_token!r}): its labels would not match the tokens; use the model's rendering")


def _hooks(model) -> list[str]:

    return hooks(model)


def fit_here(model, tok, name: str, task: str, n_train: int, seed: int):
    """Probes at every layer fitted on `n_train` training-length stories (event boundaries), as
    `instrument` fits them. Returns (probe, [(layer, model hook, probe hook)], best row, source)."""

    train_task, _ = tasks_for(name, task)
    exs = train_task.examples(n_train, seed, train_task.train_events)
    cols = collect(model, tok, exs, forced=False)
    dev = dev_examples(name, task, max(10, n_train // 2), seed)  # held-out templates choose the layer
    dv = collect(model, tok, dev, forced=False) if dev else None
    probe, best = fit_probes(cols["X"], cols["truth"], cols["prompt"], len(train_task.state_names),
                             dev=(dv["X"], dv["truth"]) if dv else None)
    rows = [(k - 1, h, probe.hooks[k]) for k, h in enumerate(_hooks(model))]
    return probe, rows, best, {"fitted": f"here, on the event boundaries of {n_train} stories "
                                         f"({train_task.train_events[0]}-{train_task.train_events[1]} events)"}


def load_checked(folder: str, model, name: str, rendering: str, state_names) -> tuple:
    """A probe folder, refused unless it was fitted on this model (checkpoint hash), on this
    rendering, and for these states. Returns (probe, rows, best row, source)."""

    probe = load_probe(folder)
    check_probe_matches(probe, model, name)
    check_probe_rendering(probe, rendering)
    names = probe_state_names(probe, state_names)
    if list(names) != list(state_names) or probe.n_classes != len(state_names):
        raise ValueError(f"the probe at {folder} reads states {names} ({probe.n_classes} classes) but these stories "
                         f"have states {list(state_names)}: fit a probe on this task's labels")
    pairs = probe_hooks_by_layer(probe)
    best_layer = best_probe_layer(probe, folder)
    best = next((k for k, (layer, _) in enumerate(pairs) if layer == best_layer), len(pairs) - 1)
    return probe, [(layer, h, h) for layer, h in pairs], best, {"folder": os.path.abspath(folder),
                                                                  "checkpoint_hash": (probe.meta.get("harvest_config")
                                                                                      or {}).get("checkpoint_hash")}


@torch.no_grad()
def readout(model, probe, rows, ids) -> np.ndarray:
    """The probe's distribution over states at every row's layer and every token: ``[L, T, K]``."""

    hooks = [h for _, h, _ in rows]
    with capture(model, hooks) as cap:
        model(torch.as_tensor(np.asarray(ids), dtype=torch.long)[None], return_type=None)
    return np.stack([torch.softmax(probe.logits(cap.stacked(h)[0].float().cpu(), ph), -1).numpy()
                     for _, h, ph in rows])


def story_panel(model, tok, probe, rows, ex) -> dict:
    """One model on one story: probe at every layer and token, forced answer and thought at every
    event boundary (the forced answers of `analyses.forced`), and the logit lens's answer at every block and
    token (``lens [T][L]``) with the block it is readable from (``lens_from [T]``) where the class words are one
    token each."""

    lab = ex.labels(tok, text=ex.prompt)
    p = readout(model, probe, rows, lab.input_ids)
    out = {"p": np.round(p, 3).tolist()}
    if ex.meta.get("question") == "":  # a record read without a question: no forced answer row
        return out
    fa = forced_answers(model, tok, ex)
    out["forced"] = np.round(fa.p_state, 3).tolist()
    if fa.thought_state is not None:
        out["thought"] = [int(k) for k in fa.thought_state]
    if one_token_classes(tok, ex.state_names):  # every layer's lens answer beside the probe (analyses.lens_readable)
        r = lens_answers(model, tok, ex, forced=fa)
        out.update(lens=lens_hover(r), lens_from=r["readable_from"])
    return out


def decode_story(model, tok, drafter, ex, gamma: int, max_new_tokens: int) -> dict:
    """Speculative decoding of one story (its chain-of-thought rendering when the task has one):
    every cache position's provenance after the run, and each verify step's drafts."""

    ids = ex.labels(tok, text=ex.prompt).input_ids.tolist()
    gen = speculative_generate(model, drafter, torch.tensor(ids), SpecConfig(
        gamma=gamma, max_new_tokens=max_new_tokens, keep_rejected=True, trace=True), tokenizer=tok)
    seq = ids + list(gen.tokens)
    prov = gen.cache.recorder.provenance_of(0).tolist()
    steps = [{"index": s.index, "position": s.position, "drafted": token_strings(tok, s.proposals),
              "accepted": s.accepted, "committed": token_strings(tok, s.committed),
              "rejected": token_strings(tok, s.rejected)} for s in gen.trace.steps]
    # the step that committed each generated position (the run's last token may not be cached yet)
    by_pos = {}
    for s in gen.trace.steps:
        for j in range(len(s.committed)):
            by_pos[s.position + 1 + j] = s.index
    return {"tokens": token_strings(tok, seq), "prompt_len": len(ids), "provenance": [int(c) for c in prov],
            "step_of": [by_pos.get(i, -1) for i in range(len(seq))], "steps": steps,
            "acceptance": gen.trace.acceptance()}


def _data_stories(cfg: ViewConfig) -> list:
    """The first `n` records of `--data` (held-out ones first: the probe never saw them) as examples of the label."""
    if not any(cfg.probes):
        raise ValueError("with --data the viewer reads a probe fitted on your records: pass --probes DIR "
                         "(from `beliefscope probe --acts ACTS --label NAME --out DIR`)")
    data = cfg.load()  # without --question (or a question field), the forced-answer row is left out
    if cfg.label == "state":  # one name per label: the records' own
        raise ValueError(f"'state' is not a label of your records: pass --label {data.label_names[0]} (their labels "
                         f"are {data.label_names})")
    label = cfg.label or _probe_label(cfg.probes[0]) or data.label_names[0]
    label = data.label_names[0] if label == "state" else data.check_label(label)  # a probe folder's old "state"
    order = sorted(range(len(data)), key=lambda i: not data.records[i].heldout)
    if cfg.n < 1:
        raise ValueError(f"--n must be at least 1, got {cfg.n}")
    return [data.example(i, label, question=cfg.question, answers=cfg.answers) for i in order[:cfg.n]]


def _probe_label(folder: str) -> str | None:
    return load_probe(folder).meta.get("label") if folder else None


def _stories(cfg: ViewConfig, task):

    if cfg.data:
        return _data_stories(cfg)

    if cfg.prompts:
        return [parse_prompt(p, cfg.task) for p in cfg.prompts]
    if cfg.n < 1:
        raise ValueError(f"--n must be at least 1, got {cfg.n}")
    return task.examples(cfg.n, cfg.seed, parse_events_range(cfg.events))


def _decoded_versions(cfg: ViewConfig, examples):
    """The same stories in the chain-of-thought format (same seed, same events), else themselves."""

    if cfg.prompts or cfg.data or cfg.task != "coinflip":
        return examples
    cot = get_task(cfg.task, fmt="cot").examples(cfg.n, cfg.seed, parse_events_range(cfg.events))
    same = all([e.state_after for e in a.events] == [e.state_after for e in b.events] for a, b in zip(examples, cot))
    return cot if same else examples


def build(cfg: ViewConfig, progress=None) -> dict:
    """Everything the page draws, as one JSON-able dict (the page embeds it verbatim)."""

    names = [m.strip() for m in cfg.models if m.strip()]
    if not names:
        raise ValueError("give at least one model, e.g. --model thinking,target")
    probes = list(cfg.probes) or [""] * len(names)
    if len(probes) != len(names):
        raise ValueError(f"--probes gives {len(probes)} folders for {len(names)} models {names}: give one per model "
                         "(an empty entry fits a probe here)")
    causal = model_folders(names, cfg.interchange, "--interchange")
    for folder in causal.values():
        load_report(folder)
    renderings = set()
    for name in names:  # every refusal before any model is loaded
        check_model_name(name)
        if not cfg.data:
            check_model_task(name, cfg.task)
        renderings.add(model_profile(name).rendering)
    if len(renderings) > 1:
        raise ValueError(f"models {names} read different renderings {sorted(renderings)}: side by side, one story "
                         "must be the same text for every model; view them separately")
    rendering = renderings.pop()
    decode = cfg.decode
    task = get_task(cfg.task, rendering=rendering, fmt="direct", **({"split": "heldout"} if rendering == "natural"
                                                                   else {}))
    examples = _stories(cfg, task)
    state_names = list(examples[0].meta.get("classes") or examples[0].state_names)
    if cfg.data and decode == "auto":
        decode = ""  # the shipped drafters speak the toy grammar, not your records
    torch.set_num_threads(cfg.threads)
    data = {"task": f"data:{examples[0].meta['label']}" if cfg.data else cfg.task, "state_names": state_names,
            "events": cfg.events, "seed": cfg.seed,
            "belief_colours": belief_stops(), "state_colours": state_colours(len(state_names)),
            "provenance": {str(k): {"name": PROVENANCE_NAMES[k], "colour": c} for k, c in PROVENANCE_COLORS.items()},
            "models": [], "stories": [{"prompt": ex.prompt, "answer": ex.answer, "n_events": len(ex.events),
                                       "models": {}} for ex in examples]}
    loaded = {}
    for name, folder in zip(names, probes):
        model, tok = loaded[name] = load_model(name)
        check_story_tokens(name, tok, examples)
        thinking = writes_thoughts(model)
        if folder:
            probe, rows, best, source = load_checked(folder, model, name, rendering, state_names)
        else:
            probe, rows, best, source = fit_here(model, tok, name, cfg.task, cfg.n_train, cfg.seed + 1)
        hits, n_tok = 0, 0
        scored_on: dict = {}
        for ex, story in zip(examples, data["stories"]):
            lab = ex.labels(tok, text=ex.prompt)
            # a record the probe was fitted on is read by the fold probe that did not see it
            use, how = probe_for_record(probe, folder, ex) if folder else (probe, None)
            scored_on[how or "held-out"] = scored_on.get(how or "held-out", 0) + 1
            panel = {"tokens": token_strings(tok, lab.input_ids), "truth": lab.state.tolist(),
                     "boundaries": np.nonzero(lab.is_event_boundary)[0].tolist(), "scored_on": how,
                     **story_panel(model, tok, use, rows, ex)}
            story["models"][name] = panel
            start = panel["boundaries"][0] if panel["boundaries"] else 0
            pred = np.asarray(panel["p"][best]).argmax(-1)[start:]
            hits += int((pred == np.asarray(panel["truth"][start:])).sum())
            n_tok += len(pred)
            if progress:
                progress(1)
        data["models"].append({"name": name, "thinking": thinking, "layers": [r[0] for r in rows],
                               "hooks": [r[1] for r in rows], "best": best, "probe": source,
                               "probe_accuracy_at_best": round(hits / max(1, n_tok), 4), "scored_on": scored_on,
                               **({"iia": iia_by_layer(load_report(causal[name], model))} if name in causal else {})})
        if decode == "auto" and not thinking:
            decode = name
    data["decode"] = None
    if decode and decode != "auto":

        if decode not in loaded:
            raise ValueError(f"--decode {decode!r} is not one of the models shown {names}")
        model, tok = loaded[decode]
        drafter = make_drafter(cfg.drafter, model)
        runs = [decode_story(model, tok, drafter, ex, cfg.gamma, cfg.max_new_tokens)
                for ex in _decoded_versions(cfg, examples)]
        data["decode"] = {"model": decode, "drafter": cfg.drafter, "gamma": cfg.gamma, "stories": runs}
        if progress:
            progress(len(runs))
    return data


def main(cfg: ViewConfig, progress=None) -> dict:
    """Build the data, write the page (and the JSON with `json_out`); returns sizes and timings."""

    out = check_writable_parent(cfg.out)
    if cfg.json_out:
        check_writable_parent(cfg.json_out)
    t = time.perf_counter()
    data = build(cfg, progress)
    page = render(data)
    atomic_write_text(out, page)
    files = [out]
    if cfg.json_out:
        atomic_write_json(cfg.json_out, data, sort_keys=False)
        files.append(os.path.abspath(cfg.json_out))
    return {"out": os.path.abspath(out), "bytes": len(page.encode()), "seconds": round(time.perf_counter() - t, 1),
            "n_stories": len(data["stories"]), "models": {m["name"]: {"best_layer": m["layers"][m["best"]],
                                                                     "probe_accuracy_at_best":
                                                                         m["probe_accuracy_at_best"]}
                                                          for m in data["models"]},
            "decode": None if data["decode"] is None else {
                "model": data["decode"]["model"], "acceptance": [s["acceptance"] for s in data["decode"]["stories"]]},
            "files": files}
