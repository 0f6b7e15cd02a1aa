"""`beliefscope harvest --data FILE`: a researcher's own records into an activation store.

Every label of the records becomes a named label of the store (``-1`` where a token is unlabelled),
its class names go into the manifest (``label_classes``), and the first label is also the store's
``state``, so every command that reads ``state`` reads it. Texts longer than the model's context
are refused before any forward, or dropped (``skip_long``) or cut (``truncate``), and counted.

Usage (not run as a doctest: it loads a model)::

    data = load_data("stories.jsonl", events_field=("location",), label_field=("negated",))
    exs, report = fit_to_context(data_examples(data), tok, n_ctx=8192)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..models.profile import model_shapes
from ..tasks.base import Example
from ..tasks.records import Data, Record, Track
from ..tasks.score_checks import join_same_texts, look_alike_classes
from ..tasks.surface import last_named, surface_column
from .store import DTYPES, LABEL_NAMES


def data_examples(data: Data, label: str | None = None) -> list:
    """One `Example` per record, for harvesting: its ``state`` is `label` (default: the first label), and its
    meta carries every label's per-token labeller and the record's group index."""
    label = data.check_label(label or data.label_names[0])
    groups = {g: k for k, g in enumerate(dict.fromkeys(r.group for r in data.records))}
    out = []
    for i, r in enumerate(data.records):
        if data.kinds[label] == "spans":
            ex = _spans_example(data, i, label)
        else:
            ex = data.example(i, label)
        ex.meta.update(token_labels=_labeller(data, i), group_index=groups[r.group])
        out.append(ex)
    return out


def _labeller(data: Data, i: int):
    def labels(offsets):
        offsets = np.asarray(offsets)
        out = data.token_labels(i, offsets)
        text = data.records[i].text
        for column, name in surface_columns(data).items():  # each label's surface baseline: the class named last
            out[column] = last_named(text, data.classes[name], offsets[:, 1])
        return out
    return labels


def _spans_example(data: Data, i: int, label: str):
    """A spans label as the primary label: the example carries no events (its `state` column is taken from the
    spans themselves by the harvest's labeller)."""

    r = data.records[i]
    return Example(task="data", rendering="natural", fmt="direct", prompt=r.text, completion="",
                   state_names=tuple(data.classes[label]), initial=-1, events=(),
                   answer_span=(len(r.text), len(r.text)),
                   meta={"record": r.id, "label": label, "split": "heldout" if r.heldout else "train"})


def data_notes(data: Data) -> list[str]:
    """What `harvest --data` tells the researcher about their records before the model loads."""
    notes = []
    if data.shared_texts:
        notes.append(f"{data.shared_texts} record(s) repeat an earlier record's text: each joins that record's fold "
                     "group, so no probe is scored on a text it was fitted on")
    notes += [f"label {label!r} has classes that differ only in case or spacing: {names}; if they are one class, "
              "write it one way in the data (a probe treats them as different classes)"
              for label, names in look_alike_classes(data.classes)]
    return notes


def fit_to_context(data: Data, tok, n_ctx: int, *, truncate: bool = False, skip_long: bool = False):
    """(data whose every text fits `n_ctx` tokens, {"skipped": [ids], "truncated": [ids]}); without a flag a
    long text is refused, naming it."""
    if truncate and skip_long:
        raise ValueError("--truncate and --skip-long exclude each other: pick one")
    kept, report = [], {"skipped": [], "truncated": []}
    for r in data.records:
        enc = tok(r.text, return_offsets_mapping=True)
        if len(enc["input_ids"]) <= n_ctx:
            kept.append(r)
        elif skip_long:
            report["skipped"].append(r.id)
        elif truncate:
            cut = int(enc["offset_mapping"][n_ctx - 1][1])
            kept.append(_truncated(r, cut))
            report["truncated"].append(r.id)
        else:
            raise ValueError(f"record {r.id} has {len(enc['input_ids'])} tokens, more than the model's context of "
                             f"{n_ctx}: shorten it, or pass --skip-long (drop such records) or --truncate (cut them)")
    if not kept:
        raise ValueError(f"every record is longer than the model's context of {n_ctx} tokens: nothing to harvest")
    if report["truncated"]:  # texts cut to the same words join one group too
        kept, _ = join_same_texts(kept, data.source)
    return replace(data, records=kept), report


def _truncated(r: Record, cut: int) -> Record:
    """A record cut to its first `cut` characters: events past the cut and spans after it are dropped."""
    tracks = {}
    for name, t in r.tracks.items():
        if t.kind == "events":
            t = Track("events", tuple(it for it in t.items if it[0] <= cut), t.initial)
        elif t.kind == "spans":
            t = Track("spans", tuple((s, min(e, cut), c) for s, e, c in t.items if s < cut))
        tracks[name] = t
    return replace(r, text=r.text[:cut], tracks=tracks)


def store_label_names(data: Data) -> list[str]:
    """The store's label columns for `data`: the built-in ones, the group, every named label, then each label's
    last-named class (`tasks.surface`)."""
    return list(dict.fromkeys([*LABEL_NAMES, "group_id", *data.label_names, *surface_columns(data)]))


def surface_columns(data: Data) -> dict[str, str]:
    """``{column: label}``: the store column of each label's last-named class, where no label of the data is
    already called that."""
    return {surface_column(n): n for n in data.label_names if surface_column(n) not in data.label_names}


def store_classes(data: Data) -> dict[str, list]:
    """Class names of every named store column: the labels', and each surface column's (its label's)."""
    return {**data.classes, **{c: data.classes[n] for c, n in surface_columns(data).items()}}


def estimate_bytes(n_rows: int, n_hooks: int, width: int, dtype: str, n_labels: int) -> int:
    """Bytes a store of `n_rows` tokens will take (activations and int32 labels)."""

    return n_rows * (n_hooks * width * torch.finfo(DTYPES[dtype]).bits // 8 + 4 * n_labels)


def check_context(model, lengths: list[int]) -> None:
    """Refuse texts longer than the positions the model can address, before any forward (a learned-position
    model would index past its table; a RoPE model would run silently outside the lengths it was built for)."""

    n_ctx = model_shapes(model).n_ctx
    long = [i for i, n in enumerate(lengths) if n > n_ctx]
    if long:
        raise ValueError(f"{len(long)} text(s) are longer than the model's context of {n_ctx} tokens (text {long[0]}: "
                         f"{lengths[long[0]]} tokens): shorten them, or pass --skip-long (drop them) or --truncate "
                         "(cut them to the context)")


def store_dtype(dtype: str, rendering: str) -> str:
    """The stored dtype ``--store-dtype`` names: ``auto`` is float16 for a pretrained (natural-English) model
    and float32 for the toy models, whose tests compare stored activations with a forward's.

    >>> store_dtype("auto", "natural"), store_dtype("auto", "toy"), store_dtype("bfloat16", "toy")
    ('float16', 'float32', 'bfloat16')
    """
    if dtype == "auto":
        return "float32" if rendering == "toy" else "float16"
    if dtype not in DTYPES:
        raise ValueError(f"--store-dtype {dtype!r} is unknown: use auto or one of {sorted(DTYPES)}")
    return dtype
