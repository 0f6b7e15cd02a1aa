"""The belief instrument on your own records: does the model keep a running state of *your* label?

The question of Franco et al. and of Lanham et al.'s early answering, asked of a researcher's data: at
every event end (or at the end of a text, for a label per text), a linear probe on the residual stream
of every layer, the forced answer (fork the KV cache there, append `question`, read the answer words),
and the truth. Probes are fitted on the training records and read on the held-out ones (the records
whose split is test/heldout/validation, else one group in five); the layer is chosen on a fifth of
the training records. Controls beside the probe: the majority class, a control task (a random label
per (token, position), Hewitt & Liang 2019) and the same probe on the random-init twin. The verdict
sentence is computed from these numbers (`analyses.instrument.verdict`).

Usage (not run as a doctest: it loads a model)::

    res = main_data(InstrumentConfig(models=("smollm2",), data="stories.jsonl", events_field=("location",),
                                     question=" Where is the key now? It is in the"))
    res["models"]["smollm2"]["verdict"]
"""

from __future__ import annotations

import torch

from ..models.load import check_model_name, load_model
from ..probes.controls import majority_accuracy
from ..probes.harvest import random_twin
from ..probes.report import layer_index
from ..tasks.records import class_counts
from ..tasks.score_checks import require_two_classes
from .instrument import _hooks, agreement, collect, fit_probes, story_readout, verdict


def split_records(data) -> tuple[list[int], list[int]]:
    """(training, held-out) record indices: the data's own split when it has one, else every fifth group.

    >>> from beliefscope.tasks.records import load_data
    >>> d = load_data([{"text": f"t{i}.", "label": i % 2} for i in range(10)], label_field=("label",))
    >>> split_records(d)
    ([0, 1, 2, 3, 5, 6, 7, 8], [4, 9])
    """
    held = [i for i, r in enumerate(data.records) if r.heldout]
    if not held:
        groups = list(dict.fromkeys(r.group for r in data.records))
        test_groups = set(groups[4::5])
        held = [i for i, r in enumerate(data.records) if r.group in test_groups]
    test = set(held)
    train = [i for i in range(len(data.records)) if i not in test]
    if len(train) < 5 or not held:
        raise ValueError(f"{len(train)} training and {len(held)} held-out records: the instrument needs at least 5 "
                         "training records and 1 held-out one (give more records, or a split field)")
    return train, held


def main_data(config, progress=None) -> dict:
    """The instrument on ``config.data`` for every model of ``config.models``; a JSON-able dict shaped like
    `analyses.instrument.main`'s, with one band ("all") per model."""

    data = config.load()  # every record checked before any model loads
    label = data.check_label(config.label or data.label_names[0])
    require_two_classes(class_counts(data, label), label, data.source)
    if data.kinds[label] == "spans":
        raise ValueError(f"label {label!r} tags spans; the instrument reads states at event ends: pass --label of a "
                         "per-text or events label")
    if not config.question.strip() and not data.has_questions():
        raise ValueError("the instrument forces an answer at every event end: pass --question, e.g. "
                         "--question ' Where is the key now? It is in the' (or a template over the record's fields, "
                         f"' Where is the {{object}} now?'), or give every record a {config.question_field!r} field")
    for name in config.models:
        check_model_name(name)
    train_i, test_i = split_records(data)
    exs = [data.example(i, label, question=config.question, answers=config.answers) for i in range(len(data))]
    train, test = [exs[i] for i in train_i], [exs[i] for i in test_i]
    names = list(data.classes[label])
    K = len(names)
    torch.set_num_threads(config.threads)
    out = {"config": {"data": data.source, "label": label, "question": config.question,
                      "answers": list(exs[0].state_names), "models": list(config.models),
                      "n_train_records": len(train), "n_test_records": len(test)}, "models": {}}
    for name in config.models:
        model, tok = load_model(name)
        tr = collect(model, tok, train, forced=False, progress=progress)
        te = collect(model, tok, test, forced=True, progress=progress)
        probe, layer = fit_probes(tr["X"], tr["truth"], tr["prompt"], K)
        control, _ = fit_probes(tr["X"], tr["control"], tr["prompt"], K)
        pred = probe.predict(te["X"][layer], probe.hooks[layer]).numpy()
        band = agreement(te, pred, K)
        band["control_accuracy"] = float((control.predict(te["X"][layer], control.hooks[layer]).numpy()
                                          == te["control"]).mean())
        band["selectivity"] = band["probe_accuracy"] - band["control_accuracy"]
        band["majority_accuracy"] = majority_accuracy(tr["truth"], te["truth"])
        res = {"task": f"data:{label}", "state_names": names, "best_layer": layer_index(_hooks(model)[layer]),
               "hook": _hooks(model)[layer],
               "layer_chosen_on": "20% of the training records", "bands": {"all": band}}
        if config.random_init:
            twin, seed = random_twin(model, 0)
            tr0 = collect(twin, tok, train, forced=False, progress=progress)
            te0 = collect(twin, tok, test, forced=False, progress=progress)
            p0, l0 = fit_probes(tr0["X"], tr0["truth"], tr0["prompt"], K)
            res["random_init_probe_accuracy"] = float((p0.predict(te0["X"][l0], p0.hooks[l0]).numpy()
                                                       == te0["truth"]).mean())
            res["random_init_seed"] = seed
        longest = max(test, key=lambda e: e.n_events)
        res["trajectory"] = story_readout(model, tok, longest, probe, layer)
        res["verdict"] = data_verdict(name, res, 1 / K)
        out["models"][name] = res
    return out


def data_verdict(name: str, res: dict, chance: float) -> str:
    """`analyses.instrument.verdict`, unless the random-init twin reads the label as well as the model: then the
    probe reads the words of the text, not a state the model computed, and the sentence says so."""

    band = res["bands"]["all"]
    ri = res.get("random_init_probe_accuracy")
    if ri is not None and band["probe_accuracy"] - ri < 0.05:
        forced = band.get("forced_accuracy", float("nan"))
        return (f"{name} shows no readable state beyond its input: its best-layer probe reads "
                f"{band['probe_accuracy']:.2f}, and the same probe on a randomly initialised twin reads {ri:.2f}, so "
                f"the words at the event end carry the label; forced answers {forced:.2f} (chance {chance:.2f})")
    return verdict(name, res["bands"], chance)


def data_prompts_read(config) -> int | None:
    """Records the instrument reads (its progress bar's total): training and held-out records, and both again
    through the random-init twin."""
    try:
        n = len(config.load())
    except Exception:  # the run itself names the problem
        return None
    return n * len(config.models) * (2 if config.random_init else 1)

