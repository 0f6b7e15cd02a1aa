"""The model pages of the Results (docs/scripts/results.py): harvest and probes (`probes_page`), Thinking
States (`thinking_page`), the belief instrument (`instrument_page`, `instrument_command`) and the trained
models (`models_page`), with their private helpers (`_card`: a model card's path) and the paths of the JSON
each one reads (`HARVEST`, `PROBES`, `THINK`, `THINK_SMOL`, `INSTRUMENT`, ...). Each page is a function of a
`results_doc.Doc`; this module imports only results_doc.
"""

from __future__ import annotations

import functools
import html
import os
import re

from results_doc import NONE, RES, Doc, _status, page, picture, table

HARVEST, PROBES = f"{RES}/harvest.json", f"{RES}/probes.json"


def probes_page(d: Doc) -> str:
    intro = """
Harvesting activations into the sharded store, and training linear probes on them (`beliefscope bench
harvest`, `beliefscope bench probes`; `benchmarks/README.md`).
"""
    f = functools.partial(d.fig, HARVEST)
    rows = [[t, f((p, "n_hooks"), "int"), f((p, "n_prompts"), "int"), f((p, "tokens_per_s_bare"), "f1"),
             f((p, "tokens_per_s_harvest"), "f1"), f((p, "overhead"), "f3"),
             f((p, "time_ratio_harvest_over_bare"), "iqr3")]
            for p, t in (("toy", "toy target"), ("smollm2", "SmolLM2"))]
    tr = ("torchrun",)
    harvest = ("## Harvest {#harvest}\n\nOverhead: harvest time over the bare forwards, minus one. Goal "
               f"{f(('goal', 'overhead'), 'str')}: "
               f"{_status(d.get(HARVEST, 'goal', 'overhead'), d.get(HARVEST, 'overhead'))} "
               f"on the toy target.\n\n"
               + table(["model", "hooks", "prompts", "bare tokens / s", "harvest tokens / s", "overhead",
                        "IQR of the time ratio"], rows)
               + f"\n\ntorchrun, two processes over one: {f(tr + ('speedup_2_over_1_procs', 'median'), 'x2')} "
               f"(IQR {f(tr + ('speedup_2_over_1_procs',), 'iqr2')}); the stores are equal: "
               f"{f(tr + ('stores_equal',), 'yesno')}.")
    parts = d.get(HARVEST, "toy_profile", "parts")
    prof = table(["part", "seconds", "share"],
                 [[p, f(("toy_profile", "parts", p, "cumulative_s"), "f3"),
                   f(("toy_profile", "parts", p, "share"), "pct1")]
                  for p in parts])
    harvest += ("\n\nWhere the toy harvest's time goes (cProfile, which inflates Python-heavy parts):\n\n" + prof
                + "\n\n" + d.bench_source(HARVEST, "harvest"))
    g = functools.partial(d.fig, PROBES)
    layers = [[f"`{html.escape(layer['hook'])}`", g(("toy", "layers", i, "accuracy_sklearn"), "f3"),
               g(("toy", "layers", i, "accuracy_torch"), "f3")]
              for i, layer in enumerate(d.get(PROBES, "toy", "layers"))]
    probes = ("## Probe training {#probes}\n\nOne probe per layer on the toy target: scikit-learn's loop over layers "
              "against the batched torch trainer, same rows, held out by prompt.\n\n"
              + table(["figure", "value"], [
                  ["speed-up (scikit-learn time over torch)", g(("toy", "speedup", "median"), "x2")],
                  ["IQR", g(("toy", "speedup"), "iqr2")],
                  ["scikit-learn seconds (median)", g(("toy", "seconds_sklearn", "median"), "f1")],
                  ["torch seconds (median)", g(("toy", "seconds_torch", "median"), "f1")],
                  ["largest accuracy gap between the trainers", g(("toy", "max_accuracy_diff"), "f4")],
                  ["goal", g(("goal", "speedup"), "str") + " (" + _status(d.get(PROBES, "goal", "speedup"),
                                                                          d.get(PROBES, "speedup")) + ")"]])
              + "\n\n" + table(["hook", "scikit-learn accuracy", "torch accuracy"], layers)
              + "\n\nThe probe-report row of the benchmark (a whole `beliefscope probe` report on SmolLM2) is not in "
              "the committed JSON.\n\n" + d.bench_source(PROBES, "probes"))
    return page("Harvest and probes", intro, harvest, probes)


THINK, THINK_SMOL = f"{RES}/thinking.json", f"{RES}/thinking_smollm2.json"
PREFILL_H200, BATCH_H200 = f"{RES}/thinking_prefill_h200.json", f"{RES}/thinking_batch_prefill_h200.json"


def thinking_page(d: Doc) -> str:
    intro = """
Thinking States against chain of thought on the same stories, wall time (`beliefscope bench thinking`;
`benchmarks/README.md`). A speed-up is the median over stories of CoT's time over Thinking States' time,
paired per story: chunk by chunk, and with speculative prefill (k chunks drafted per backbone forward).
"Batch 32" runs 32 stories at once against CoT's batched `generate`.
"""
    blocks = []
    for rel, title, anchor, name in ((THINK, "Toy models", "toy", "thinking"),
                                     (THINK_SMOL, "SmolLM2", "smollm2", "thinking")):
        f = functools.partial(d.fig, rel)
        rows = []
        for band in d.get(rel, "bands"):
            k = ("bands", band)
            rows.append([f"{band} events", f(k + ("speedup_vs_cot_chunked", "median"), "x2"),
                         f(k + ("speedup_vs_cot_speculative", "median"), "x2"),
                         f(k + ("speedup_vs_cot_speculative",), "iqr2"), f(k + ("k_chosen",), "int"),
                         f(k + ("chunks_per_forward", "median"), "f2"),
                         f(k + ("batched", "speedup_vs_cot", "median"), "x2"),
                         f(k + ("answer_accuracy_thinking",), "f2") + " / " + f(k + ("answer_accuracy_cot",), "f2"),
                         f(k + ("context_tokens_generated_thinking", "median"), "f1") + " / "
                         + f(k + ("context_tokens_generated_cot", "median"), "f1"),
                         f(k + ("speculative_equals_chunked",), "pct0")])
        cfg = ("config",)
        blocks.append(
            f"## {title} {{#{anchor}}}\n\n{f(cfg + ('model',), 'str')} against {f(cfg + ('cot_model',), 'str')}, "
            f"{f(cfg + ('n_prompts',), 'int')} held-out stories per band, {f(cfg + ('repeats',), 'int')} repeats, "
            f"thought drafter {f(cfg + ('thought_drafter',), 'str')}.\n\n"
            + table(["stories", "chunk by chunk", "speculative prefill", "IQR", "k", "chunks per forward",
                     "batch 32", "answers: thinking / CoT", "context tokens: thinking / CoT",
                     "speculative = chunk by chunk"], rows)
            + "\n\nCoT's drafters timed on its calibration stories (seconds; the fastest is CoT's decoding "
            "above):\n\n" + table(["CoT drafter", "seconds"], [
                [f"`{html.escape(dr)}`", f(("bands", next(iter(d.get(rel, "bands"))), "cot_drafter_seconds", dr), "f3")]
                for dr in d.get(rel, "bands", next(iter(d.get(rel, "bands"))), "cot_drafter_seconds")])
            + "\n\n" + d.bench_source(rel, name))
    blocks.append(picture("results-speculative-prefill.png", "speculative prefill of one request",
                          "One request with speculative prefill: drafts, thoughts, kept and rolled-back chunks "
                          "(`analyses.thinking_view.speculative_prefill_figure`; it needs a model run, so the "
                          "committed `benchmarks/results/speculative_prefill.png` is shown as it is, dated "
                          f"{d.gitdate(f'{RES}/speculative_prefill.png')}).")
                  )
    f = functools.partial(d.fig, PREFILL_H200)
    rows = [[f"{b} events", f((b, "n"), "int"), f((b, "equal_to_chunked"), "int"), f((b, "speedup"), "x2"),
             f((b, "speedup_vs_cot"), "x2"),
             f((b, "answers_right"), "int") + " / " + f((b, "cot_answers_right"), "int"),
             f((b, "chunks_per_drafting_forward"), "f2")] for b in ("1-8", "17-32")]
    g = functools.partial(d.fig, BATCH_H200)
    brows = [[k.replace("_", ", ").replace("batch", "batch "), g((k, "equal"), "yesno"), g((k, "speedup"), "x2"),
              g((k, "forwards_chunked"), "int") + " → " + g((k, "forwards_speculative"), "int")]
             for k in d.data(BATCH_H200) if k.startswith("batch")]
    blocks.append(
        "## On a GPU {#gpu}\n\nOne story at a time, a fresh drafter per story, k "
        f"{f('k', 'int')}, {f('model', 'str')}; speed-up over chunk by chunk, and against CoT's Hugging Face "
        "`generate`:\n\n"
        + table(["stories", "n", "equal to chunk by chunk", "speed-up", "against CoT", "answers right: thinking / CoT",
                 "chunks per drafting forward"], rows)
        + "\n\n" + d.source(PREFILL_H200, machine=f("device", "str"))
        + "\n\nThe batched path (`run_thinking_batch`) with speculative prefill, k "
        f"{g('k', 'int')}, chunked time over speculative:\n\n"
        + table(["batch, stories", "equal to chunk by chunk", "speed-up", "backbone forwards"], brows)
        + "\n\n" + d.source(BATCH_H200, machine=g("device", "str")))
    return page("Thinking States", intro, *blocks)


INSTRUMENT = (("instrument", "Toy models: coin flips", "toy"),
              ("instrument_smollm2", "SmolLM2: coin flips", "smollm2"),
              ("instrument_cups", "Three cups", "cups"),
              ("instrument_variables", "Variable binding", "variables"),
              ("instrument_variables_next_token", "Variable binding, read one token after each boundary",
               "variables-next-token"))


def instrument_command(d: Doc, rel: str) -> str:
    """The `beliefscope instrument` command line of a result, rebuilt from its recorded ``config``."""
    c = d.get(rel, "config")
    cmd = ["beliefscope instrument", "--models " + ",".join(c["models"])]
    if c.get("task"):
        cmd.append(f"--task {c['task']}")
    cmd += [f"--n-train {c['n_train']}", f"--n-test {c['n_test']}", "--bands " + ",".join(c["bands"]),
            f"--seed {c['seed']}", f"--causal-n {c['causal_n']}"]
    if not c.get("random_init", True):
        cmd.append("--no-random-init")
    if c.get("probe_offset"):
        cmd.append(f"--probe-offset {c['probe_offset']}")
    cmd.append(f"--threads {c['threads']}")
    return " ".join(cmd)


def instrument_page(d: Doc) -> str:
    intro = """
The belief instrument (`beliefscope instrument`): at every event boundary of held-out stories, a linear probe
of the residual stream (its layer chosen on other stories), the answer the model gives when asked there
(forced), and, for Thinking States models, the thought it writes, each against the true state. "Control" is
the probe on a control task (a random label per token type and position), "random-init" the probe on the
model with random weights. The causal check swaps the state vector S at one chunk for another state's.
"""
    blocks = []
    for stem, title, anchor in INSTRUMENT:
        rel = f"{RES}/{stem}.json"
        f = functools.partial(d.fig, rel)
        o = functools.partial(d.opt, rel)
        rows, causal, variables = [], [], []
        for name, m in d.get(rel, "models").items():
            k = ("models", name)
            for band in m["bands"]:
                b = k + ("bands", band)
                rows.append([f"{html.escape(name)}, {band}", f(b + ("probe_accuracy",), "f3"),
                             f(b + ("forced_accuracy",), "f3"), o(b + ("thought_accuracy",), "f3"),
                             o(b + ("probe_thought_agreement",), "f3"), f(b + ("control_accuracy",), "f3"),
                             f(k + ("random_init_probe_accuracy",), "f3")])
                if "variable_probe_accuracy" in m["bands"][band]:
                    vk = b + ("variable_probe_accuracy",)
                    variables.append([f"{html.escape(name)}, {band}"] + [
                        f(vk + (v,), "f3") for v in m["bands"][band]["variable_probe_accuracy"]])
            if m.get("causal"):
                c = k + ("causal",)
                causal.append([html.escape(name), f(c + ("n",), "int"), f(c + ("answer_flip_rate_swap",), "f2"),
                               o(c + ("answer_follows_swap",), "f2"), f(c + ("downstream_thoughts_follow_swap",), "f2"),
                               f(c + ("answer_flip_rate_random",), "f2"), o(c + ("answer_follows_random",), "f2"),
                               f(c + ("downstream_thoughts_follow_random",), "f2")])
        hooks = "; ".join(f"`{html.escape(n)}` at {f(('models', n, 'hook'), 'str')}" for n in d.get(rel, "models"))
        out = [f"## {title} {{#{anchor}}}", f"Probe layers: {hooks}.",
               table(["model, events", "probe", "forced", "thought", "probe = thought", "control", "random-init"],
                     rows)]
        if variables:
            first = next(iter(d.get(rel, "models").values()))
            names = next(iter(first["bands"].values()))["variable_probe_accuracy"]
            out += ["A probe for every variable's value:",
                    table(["model, updates"] + [f"variable {html.escape(v)}" for v in names], variables)]
        if causal:
            out += [("Causal check: how often swapping S changes the answer, makes it the one the swapped-in state "
                     "leads to, and makes every later thought follow; then the same for a random vector of equal "
                     "norm."),
                    table(["model", "stories", "answer changes", "answer follows", "thoughts follow",
                           "random: changes", "random: follows", "random: thoughts"], causal)]
        out += [_checkpoint_line(d, rel, name) for name in d.get(rel, "models")
                if _checkpoint_line(d, rel, name)]
        models = list(d.get(rel, "models"))
        if models != d.get(rel, "config", "models"):
            out.append(f"The JSON's config lists {_names(d, rel)}; its other rows come from another run with "
                       "the same settings.")
        out.append(picture(f"results-instrument-{anchor}.png", f"instrument bars, {title}",
                           "Probe, forced answer, thought and control by band (`analyses.plots.instrument_chart`, "
                           f"drawn from `{rel}`)."))
        if all("trajectory" in m for m in d.get(rel, "models").values()) and anchor != "variables-next-token":
            out.append(picture(f"results-trajectory-{anchor}.png", f"one story token by token, {title}",
                               "One held-out story token by token: the truth, the probe (its cell fades with its "
                               "probability), the forced answer and the thought at each boundary "
                               f"(`analyses.state_strips.strips_figure`, drawn from `{rel}`)."))
        threads = "not recorded (its config: torch threads " + f(("config", "threads"), "int") + ")"
        out.append(d.source(rel, command=instrument_command(d, rel), machine=threads,
                            note="rebuilt from the JSON's recorded config"))
        blocks.append("\n\n".join(out))
    blocks.append("## The viewer {#viewer}\n\n" + picture(
        "results-view.png", "the belief viewer",
        "The viewer (`beliefscope view`): thinking above target on the same story, coloured by the probe's "
        f"belief; a screenshot, `benchmarks/results/view.png`, dated {d.gitdate(f'{RES}/view.png')}."))
    return page("The belief instrument", intro, *blocks)


def _checkpoint_line(d: Doc, rel: str, name: str) -> str:
    """Whether a model's rows were measured on the checkpoint shipped now (its card's model_sha256), on an
    earlier one, or on one the JSON does not name ("" for a model without a card hash, e.g. a hub model)."""
    card = _card(name)
    if not os.path.isfile(os.path.join(d.root, card)) or not d.has(card, "model_sha256"):
        return ""
    now = d.get(card, "model_sha256")
    if not d.has(rel, "models", name, "model_sha256"):
        return (f"`{html.escape(name)}`'s rows do not record the checkpoint they were measured on; the one shipped "
                f"now is dated {d.gitdate(card)}: they may predate it.")
    then = d.get(rel, "models", name, "model_sha256")
    if then == now:
        return f"`{html.escape(name)}`'s rows were measured on the checkpoint shipped now."
    return (f"`{html.escape(name)}`'s rows were measured on an earlier checkpoint than the one shipped now "
            f"(dated {d.gitdate(card)}).")


def _names(d: Doc, rel: str) -> str:
    n = len(d.get(rel, "config", "models"))
    return ", ".join(d.fig(rel, ("config", "models", i), "str") for i in range(n))


CARD_GROUPS = (
    ("Coin flips, toy models", "coinflip", ("coinflip-target", "coinflip-draft", "coinflip-thinking",
                                            "coinflip-thinking-empty", "coinflip-direct-rope", "coinflip-cot-rope")),
    ("Three cups", "cups", ("cups-thinking", "cups-direct-rope", "cups-cot-rope")),
    ("Variable binding", "variables", ("variables-thinking", "variables-direct-rope", "variables-cot-rope")),
    ("SmolLM2, natural coin-flip stories", "smollm2", ("smollm2-thinking", "smollm2-direct", "smollm2-cot")),
)
TRAIN_SPLIT, COST_H100 = f"{RES}/smollm2_thinking_train_split.json", f"{RES}/smollm2_training_cost_h100.json"


def _card(name: str) -> str:
    return f"checkpoints/{name}/model_card.json"


def _accuracy_cell(d: Doc, rel: str, k: tuple) -> str:
    ev = d.get(rel, *k)
    cell = d.fig(rel, k + ("answer_accuracy",), "f3")
    if ev.get("thought_accuracy") is not None:
        cell += " (thoughts " + d.fig(rel, k + ("thought_accuracy",), "f3") + ")"
    elif ev.get("formats") == ["cot"] and ev.get("exact_match") is not None:
        cell += " (chain " + d.fig(rel, k + ("exact_match",), "f3") + ")"
    return cell


def models_page(d: Doc) -> str:
    intro = """
Held-out accuracy of the shipped models, from each model card's `eval` (written by the training run that
made the checkpoint; `beliefscope eval --model NAME --events BAND --n N` repeats one band, seed 12345 by
default). A cell is the answer accuracy; for Thinking States models the share of thoughts that name the
right state follows in parentheses, for chain-of-thought models the share of whole chains right.
Models were trained on the first band only.
"""
    blocks = []
    for title, anchor, names in CARD_GROUPS:
        bands = list(dict.fromkeys(b for n in names for b in d.get(_card(n), "eval")))
        bands.sort(key=lambda b: int(b.split("-")[0]))
        rows = []
        for n in names:
            rel = _card(n)
            rows.append([n] + [_accuracy_cell(d, rel, ("eval", b)) if d.has(rel, "eval", b) else NONE
                                      for b in bands])
        if anchor == "smollm2":
            rows.append(["smollm2-thinking, train templates and names"] + [
                _accuracy_cell(d, TRAIN_SPLIT, ("bands", b)) if d.has(TRAIN_SPLIT, "bands", b) else NONE
                for b in bands])
        n_line = "; ".join(f"`{n}` {d.fig(_card(n), ('eval', bands[0], 'n'), 'int')}" for n in names
                           if d.has(_card(n), "eval", bands[0]))
        sources = []
        for n in names:
            rel = _card(n)
            if d.has(rel, "rebuild"):
                line = d.source(rel, command_keys=("rebuild",), machine=_trained_on(d, rel),
                                recorded="the card's rebuild")
            else:
                line = d.source(rel, machine=_trained_on(d, rel)) + (
                    " · note: " + d.fig(rel, "note", "str") if d.has(rel, "note") else "")
            sources.append("- " + line)
        if anchor == "smollm2":
            sources.append("- " + d.source(TRAIN_SPLIT, command_keys=("command",), date_keys=("date",)))
        blocks.append(f"## {title} {{#{anchor}}}\n\n" + table(["model"] + [f"{b} events" for b in bands], rows)
                      + f"\n\nStories per band: {n_line}.\n\n" + "\n".join(sources))
    card = _card("smollm2-thinking")
    q = ("eval_questions",)
    rows = [[html.escape(s), d.fig(card, q + (s, "n"), "int"), d.fig(card, q + (s, "answer_accuracy"), "f3"),
             d.fig(card, q + (s, "thought_accuracy"), "f3"), d.fig(card, q + (s, "answer_follows_thought"), "f3")]
            for s in d.get(card, *q)]
    blocks.append(
        "## `smollm2-thinking` beyond the templates {#smollm2-thinking}\n\nQuestion forms and hand-written "
        "free-wording stories (`free`: `beliefscope eval --split free`; `+chat`: inside SmolLM2's chat template).\n\n"
        + table(["stories", "n", "answers", "thoughts", "answer names its own last thought"], rows)
        + f"\n\nThe card's own summary (`generalises_to`): {d.fig(card, 'generalises_to', 'str')}\n\n"
        + picture("results-loss-smollm2-thinking.png", "training loss of smollm2-thinking",
                  "Training loss of `smollm2-thinking` (the card's `history`; `checkpoints/smollm2-thinking/loss.png`, "
                  f"dated {d.gitdate('checkpoints/smollm2-thinking/loss.png')}).")
        + "\n\n" + d.source(card, command_keys=("rebuild",), recorded="the card's rebuild"))
    tc = ("training_cost",)
    rows = [[f"{html.escape(o)}, CPU", d.fig(card, tc + (o, "trained_params"), "int"),
             d.fig(card, tc + (o, "autocast"), "str"),
             d.fig(card, tc + (o, "threads"), "int"), d.fig(card, tc + (o, "tokens"), "int"),
             d.fig(card, tc + (o, "seconds"), "list2")] for o in d.get(card, *tc)]
    rows += [[f"{html.escape(o)}, GPU", d.fig(COST_H100, ("options", o, "trained_params"), "int"),
              d.fig(COST_H100, ("options", o, "autocast"), "str"), d.fig(COST_H100, ("options", o, "threads"), "int"),
              d.fig(COST_H100, ("options", o, "tokens"), "int"), d.fig(COST_H100, ("options", o, "seconds"), "list2")]
             for o in d.get(COST_H100, "options")]
    blocks.append(
        "## The cost of a training step {#training-cost}\n\nSeconds per optimiser step of `smollm2-thinking`'s "
        "training, one step after another, for each choice of what is trained (`beliefscope train --preset "
        "smollm2-thinking --measure-cost`). The GPU rows use a SmolLM2-shaped model with random weights: "
        f"{d.fig(COST_H100, 'note', 'str')}.\n\n"
        + table(["trained, device", "trained parameters", "autocast", "threads", "tokens per step", "seconds per step"],
                rows)
        + "\n\n- " + d.source(card, command="beliefscope train --preset smollm2-thinking --measure-cost",
                               note="the flag that writes training_cost", machine=_cost_machine(d, card))
        + f"\n- {d.source(COST_H100, machine=d.fig(COST_H100, 'device', 'str'))}")
    return page("Trained models", intro, *blocks)


def _trained_on(d: Doc, rel: str) -> str | None:
    """The device a card says it was trained on (``trained_on`` names a device on some cards, the data on
    others); the evaluation's machine is never recorded."""
    if d.has(rel, "trained_on") and re.search(r"\b(cpu|cuda|NVIDIA)\b", d.get(rel, "trained_on")):
        return "trained on " + d.fig(rel, "trained_on", "str") + " (the evaluation's machine not recorded)"
    return None


def _cost_machine(d: Doc, rel: str) -> str:
    first = next(iter(d.get(rel, "training_cost")))
    return "device " + d.fig(rel, ("training_cost", first, "device"), "str") + " (the rest not recorded)"
