"""A researcher's own data: records of text with labels, checked against one contract.

A record is a dict. Field names are defaults; `DataConfig` maps them.

- ``text`` (required): the text the model reads.
- a **label per text** (each field of ``label_field``): a class name (string or int), read at the
  text's last token; the other tokens are unlabelled.
- **states along the text** (each field of ``events_field``, default ``events``): a list of
  ``{"end": <char offset>, "state": <class>}`` in text order. A state holds from the token that
  completes its event (the first token whose end reaches ``end``) until the next event completes.
  Before the first event the tokens are unlabelled, or take the record's ``initial`` state.
- **token spans** (each field of ``spans_field``, default ``spans``): a list of
  ``{"start", "end", "label"}`` character offsets; tokens overlapping a span take its label.
- optional ``id`` (unique), ``split`` (records whose split is test, heldout or validation are held out) and
  ``group`` (cross-validation folds never split a group; default: the record itself). Records with the same
  text (up to whitespace) join one group, so no fold is scored on a text it was trained on, and the same
  text in a training and a held-out record is refused.

Every label is a named track; unlabelled tokens carry -1. Bad input is refused before any model runs,
with the record, the value and the fix named.

>>> data = load_data([{"text": "The key is in the hall. Tom takes it to the den.",
...                    "events": [{"end": 23, "state": "hall"}, {"end": 48, "state": "den"}]}])
>>> data.label_names, data.classes["events"]
(['events'], ['den', 'hall'])
>>> data.records[0].tracks["events"].items
((23, 1), (48, 0))
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field, replace

import numpy as np

from .base import Event, Example
from .boxes_tracking import boxes_config, boxes_records
from .score_checks import join_same_texts
from .sources import describe, read_rows

KINDS = ("text", "events", "spans")  # a label read at the last token; states along the text; token spans
RESERVED = ("parity", "events_so_far", "is_event_boundary", "token_id", "position", "prompt_id", "n_events",
            "in_prompt", "in_answer", "template_split", "group_id")  # store columns a user label may not shadow


@dataclass
class DataConfig:
    """How records map onto the contract (every field is a flag of the commands that read `--data`)."""

    text_field: str = "text"  # field holding the text
    label_field: tuple = ()  # comma-separated fields holding one label per text (class names), read at the last
    #   token
    events_field: tuple = ()  # comma-separated fields holding [{end, state}] lists (default: 'events' if present)
    spans_field: tuple = ()  # comma-separated fields holding [{start, end, label}] lists (default: 'spans' if
    #   present)
    classes: str = ""  # declared classes in index order, LABEL=a,b,c (several: separate them with ';'); the
    #   others are inferred (sorted)
    initial_field: str = "initial"  # a record's state before its first event (optional)
    id_field: str = "id"  # unique record id (optional; default: the record's index)
    split_field: str = "split"  # records whose split is test, heldout or validation are held out of the folds
    group_field: str = "group"  # records of one group stay in one cross-validation fold (optional)
    question_field: str = "question"  # a record's own question, asked after each event where --question is empty
    #   (optional); --question may also be a template over the record's fields, e.g. ' Where is the {object}?'
    format: str = "records"  # records (the contract above) or boxes (Kim & Schuster 2023 entity tracking)

    def mapping(self) -> DataConfig:
        """The mapping fields alone (what a store's config records), as a `DataConfig`."""
        return DataConfig(**{f: getattr(self, f) for f in DataConfig.__dataclass_fields__})


HELDOUT_SPLITS = ("test", "heldout", "validation")  # split values that mark held-out records


@dataclass
class DataSource(DataConfig):
    """A config's `--data` and its mapping (commands that read your records inherit from it)."""

    data: str = ""  # your records: a .jsonl/.csv/.parquet file, a save_to_disk folder, or a hub name
    #   org/name[:split]

    def load(self) -> Data:
        """The checked records (before any model is loaded)."""
        if not self.data:
            raise ValueError("no --data given: pass your records, e.g. --data stories.jsonl")
        return load_data(self.data, self.mapping())


@dataclass(frozen=True)
class Track:
    """One label of one record."""

    kind: str  # "text", "events" or "spans"
    items: tuple  # text: (class,); events: ((end, class), ...); spans: ((start, end, class), ...)
    initial: int = -1  # events: class before the first event (-1 = unlabelled)

    def token_labels(self, offsets: np.ndarray, n_chars: int) -> tuple[np.ndarray, np.ndarray]:
        """(label ``[T]`` int64 with -1 where unlabelled, completing-token mask ``[T]`` bool)."""
        starts, ends = offsets[:, 0], offsets[:, 1]  # [T]
        empty = starts == ends  # special tokens (BOS) see nothing
        lab = np.full(len(offsets), -1, dtype=np.int64)
        hit = np.zeros(len(offsets), dtype=bool)
        if self.kind == "spans":
            for s, e, c in self.items:
                over = (starts < e) & (ends > s) & ~empty
                lab[over] = c
                hit |= over
            return lab, hit
        marks = ((n_chars, self.items[0]),) if self.kind == "text" else self.items
        event_ends = np.asarray([e for e, _ in marks], dtype=np.int64)  # [E]
        n_done = ((ends[:, None] >= event_ends[None, :]) & ~empty[:, None]).sum(1)  # [T]
        seq = np.asarray([self.initial] + [c for _, c in marks], dtype=np.int64)  # [E+1]
        lab = seq[n_done]
        for e in event_ends:
            first = np.nonzero((ends >= e) & ~empty)[0]
            if len(first):
                hit[first[0]] = True
        if self.kind == "text":
            lab[~hit] = -1  # a label per text is read at its last token only
        return lab, hit


@dataclass(frozen=True)
class Record:
    """One checked record."""

    id: str  # unique id (the record's index when the data has no id field)
    text: str  # the text
    tracks: dict  # label name -> Track
    heldout: bool = False  # its split is one of the held-out splits
    group: str = ""  # cross-validation group (the id when the data has no group field), shared by records that
    #   share a text or a group (the first such record's)
    fields: dict = field(default_factory=dict)  # the record's plain (string or number) fields, for question templates


@dataclass
class Data:
    """Checked records with their label names and class names."""

    records: list  # [Record]
    label_names: list  # label names, the first one primary
    classes: dict  # label name -> class names (index order)
    kinds: dict  # label name -> "text" / "events" / "spans"
    source: str  # where the records came from
    config: DataConfig = field(default_factory=DataConfig)  # the mapping used
    shared_texts: int = 0  # records whose text an earlier record already has (each joined that record's group)

    def __len__(self) -> int:
        return len(self.records)

    def check_label(self, label: str) -> str:
        if label not in self.label_names:
            raise ValueError(f"label {label!r} is not in the data; its labels are {self.label_names}")
        return label

    def token_labels(self, i: int, offsets: np.ndarray) -> dict[str, np.ndarray]:
        """Every label of record `i` at every token: ``{name: [T]}`` (-1 unlabelled)."""
        r = self.records[i]
        return {n: r.tracks[n].token_labels(offsets, len(r.text))[0] for n in self.label_names}

    def example(self, i: int, label: str | None = None, question: str = "", answers=None) -> Example:
        """Record `i` as a task `Example` of one label (its events, or its per-text label at the end), for the
        analyses that read states at event ends. `question` is appended to the text; `answers` (the words the
        model answers with, one per class) replace the class names as the example's state names."""
        label = self.check_label(label or self.label_names[0])
        r, names = self.records[i], self.classes[label]
        track = r.tracks[label]
        if track.kind == "spans":
            raise ValueError(f"label {label!r} tags token spans; states at event ends need a per-text label or "
                             "events: pass --label NAME of such a label")
        answers = list(answers or names)
        if len(answers) != len(names):
            raise ValueError(f"--answers gives {len(answers)} words {answers} for the {len(names)} classes {names} of "
                             f"{label!r}: give one answer word per class, in this order")
        marks = ((len(r.text), track.items[0]),) if track.kind == "text" else track.items
        events, start = [], 0
        for end, c in marks:
            events.append(Event(span=(start, end), kind="event", state_after=int(c)))
            start = end
        question = self.question(i, question)
        prompt = r.text + question
        return Example(task="data", rendering="natural", fmt="direct", prompt=prompt, completion="",
                       state_names=tuple(answers), initial=track.initial, events=tuple(events),
                       answer_span=(len(prompt), len(prompt)),
                       meta={"record": r.id, "label": label, "split": "heldout" if r.heldout else "train",
                             "classes": tuple(names), "text": r.text, "question": question})

    def has_questions(self) -> bool:
        """Whether every record carries its own question (the `question_field`)."""
        f = self.config.question_field
        return bool(f) and all(str(r.fields.get(f, "")).strip() for r in self.records)

    def question(self, i: int, asked: str = "") -> str:
        """The question asked of record `i`: `asked` (a template over its fields where it holds ``{field}``), or
        the record's own question field where `asked` is empty."""
        r = self.records[i]
        if not asked:
            return str(r.fields.get(self.config.question_field, ""))
        if "{" not in asked:
            return asked
        try:
            return asked.format_map(r.fields)
        except KeyError as e:
            raise ValueError(f"--question {asked!r} names the field {e.args[0]!r}, which record {i} (id {r.id}) lacks; "
                             f"its fields are {sorted(r.fields)}") from None
        except (ValueError, IndexError) as e:
            raise ValueError(f"--question {asked!r} is not a template of field names in braces ({e}): write "
                             "' Where is the {object} now?'") from None


def load_data(source, config: DataConfig | None = None, **overrides) -> Data:
    """Read and check every record of `source` (any source `tasks.sources.read_rows` takes). A field list may be
    a tuple or one comma-separated string: ``label_field="truth"`` is the field ``truth``, not its letters."""
    if unknown := sorted(set(overrides) - set(names := list(DataConfig.__dataclass_fields__))):
        raise TypeError(f"load_data got unknown settings {unknown}; the settings are {names}")
    overrides.update({k: tuple(f.strip() for f in v.split(",") if f.strip()) for k, v in overrides.items()
                      if k in ("label_field", "events_field", "spans_field") and isinstance(v, str)})
    cfg = config or DataConfig(**overrides)
    if overrides and config is not None:

        cfg = replace(config, **overrides)
    rows = read_rows(source)
    where = describe(source)
    if not rows:
        raise ValueError(f"{where} holds no records")
    if cfg.format == "boxes":
        rows, cfg = boxes_records(rows), boxes_config(cfg)
    elif cfg.format != "records":
        raise ValueError(f"format {cfg.format!r} is unknown: use 'records' or 'boxes'")
    fields = list(rows[0])
    if cfg.text_field not in rows[0]:
        raise ValueError(f"{where}: the records have no text field {cfg.text_field!r}; their fields are {fields}: "
                         "pass --text-field NAME")
    kinds = _label_kinds(cfg, rows, where)
    declared = _declared_classes(cfg.classes, kinds)
    values = {n: _raw_values(rows, n, k, where, cfg.initial_field) for n, k in kinds.items()}
    classes = {n: declared.get(n) or _infer_classes(values[n]) for n in kinds}
    records, seen = [], {}
    for i, row in enumerate(rows):
        rid = str(row.get(cfg.id_field, i)) if row.get(cfg.id_field) is not None else str(i)
        if rid in seen:
            raise ValueError(f"{where}: records {seen[rid]} and {i} share the id {rid!r} ({cfg.id_field}): ids must be "
                             "unique; fix the data or pass --id-field of a unique field")
        seen[rid] = i
        text = row.get(cfg.text_field)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: record {i} (id {rid}) has an empty or missing {cfg.text_field!r} "
                             f"({text!r}): every record needs a non-empty text")
        tracks = {n: _track(row, n, k, classes[n], text, f"{where}: record {i} (id {rid})", cfg) for n, k in
                  kinds.items()}
        split = row.get(cfg.split_field)
        group = row.get(cfg.group_field)
        plain = {k: v for k, v in row.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)}
        records.append(Record(id=rid, text=text, tracks=tracks, heldout=str(split) in HELDOUT_SPLITS,
                              group=str(group) if group is not None else rid, fields=plain))
    records, shared = join_same_texts(records, where)
    return Data(records=records, label_names=list(kinds), classes=classes, kinds=kinds, source=where, config=cfg,
                shared_texts=shared)


def _label_kinds(cfg: DataConfig, rows: list[dict], where: str) -> dict[str, str]:
    fields = list(rows[0])
    asked = [(f, "events") for f in cfg.events_field]  # states along the text first: the primary label
    if not cfg.events_field and "events" in rows[0]:
        asked.append(("events", "events"))
    asked += [(f, "text") for f in cfg.label_field] + [(f, "spans") for f in cfg.spans_field]
    if not cfg.spans_field and "spans" in rows[0]:
        asked.append(("spans", "spans"))
    if not asked:
        raise ValueError(f"{where}: no label field given, and the records have neither 'events' nor 'spans' (fields "
                         f"{fields}): name one with --label-field, --events-field or --spans-field")
    kinds: dict[str, str] = {}
    for f, k in asked:
        if f in kinds:
            raise ValueError(f"field {f!r} is named twice as a label; name each label field once")
        if f in RESERVED or f in (cfg.text_field, cfg.id_field, cfg.split_field, cfg.group_field):
            raise ValueError(f"label field {f!r} clashes with a column the store keeps itself: rename the field "
                             f"(reserved: {list(RESERVED)})")
        missing = [i for i, r in enumerate(rows) if f not in r]
        if len(missing) == len(rows):
            what = {"text": "--label-field", "events": "--events-field", "spans": "--spans-field"}[k]
            raise ValueError(f"{where}: the records have no field {f!r} (given as {what}); their fields are "
                             f"{fields}: pass the name of one of them")
        kinds[f] = k
    return kinds


def _declared_classes(specs: str, kinds) -> dict[str, list[str]]:
    out = {}
    for spec in [x for x in str(specs or "").split(";") if x.strip()]:
        name, eq, names = str(spec).partition("=")
        if not eq or not names.strip():
            raise ValueError(f"--classes {spec!r} is not of the form LABEL=a,b,c")
        if name not in kinds:
            raise ValueError(f"--classes names label {name!r}, which is not one of the labels {list(kinds)}")
        out[name] = [c.strip() for c in names.split(",")]
        if len(set(out[name])) != len(out[name]):
            raise ValueError(f"--classes {spec!r} names a class twice")
    return out


def _raw_values(rows, name, kind, where, initial_field) -> list:
    vals = []
    for i, r in enumerate(rows):
        v = r.get(name)
        if v is None:
            continue
        if kind == "text":
            vals.append(v)
            continue
        key = "state" if kind == "events" else "label"
        if not isinstance(v, list) or not all(isinstance(e, dict) for e in v):
            raise ValueError(f"{where}: record {i} field {name!r} is {str(v)[:60]!r}, not a list of "
                             f"{{'end', '{key}'}} objects" if kind == "events" else
                             f"{where}: record {i} field {name!r} is {str(v)[:60]!r}, not a list of "
                             "{'start', 'end', 'label'} objects")
        for e in v:
            if key not in e:
                raise ValueError(f"{where}: record {i} field {name!r} has an entry {e} without {key!r}")
            vals.append(e[key])
        if kind == "events" and r.get(initial_field) is not None:
            vals.append(r[initial_field])
    return vals


def _infer_classes(values) -> list[str]:
    """Sorted class names (numerically when every value is an int)."""
    uniq = set(values)
    if all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in uniq):
        return [str(v) for v in sorted(uniq)]
    return sorted(str(v) for v in uniq)


def _class(value, names, name, where) -> int:
    v = str(value)
    if v not in names:
        raise ValueError(f"{where}: {name!r} value {value!r} is not one of the declared classes {names}: fix the "
                         f"record, or declare it with --classes {name}={','.join([*names, v])}")
    return names.index(v)


def _track(row, name, kind, names, text, where, cfg: DataConfig) -> Track:
    v = row.get(name)
    if v is None:
        raise ValueError(f"{where} has no {name!r}: every record needs each label field (drop the record, or the "
                         "label)")
    if kind == "text":
        return Track("text", (_class(v, names, name, where),))
    n, items = len(text), []
    if kind == "spans":
        for e in v:
            s, t = int(e.get("start", -1)), int(e.get("end", -1))
            if not 0 <= s < t <= n:
                raise ValueError(f"{where}: span {e} of {name!r} is not inside the {n}-character text: need "
                                 "0 <= start < end <= len(text)")
            items.append((s, t, _class(e["label"], names, name, where)))
        return Track("spans", tuple(items))
    last = 0
    for e in v:
        if "end" not in e:
            raise ValueError(f"{where}: event {e} of {name!r} has no 'end' (a character offset)")
        end = int(e["end"])
        if end > n:
            raise ValueError(f"{where}: event {e} of {name!r} ends at character {end}, past the end of its "
                             f"{n}-character text: an event must end inside the text")
        if end <= last:
            raise ValueError(f"{where}: events of {name!r} are out of order at {e} (end {end} after {last}): list "
                             "events in text order, each ending after the one before")
        items.append((end, _class(e["state"], names, name, where)))
        last = end
    init = row.get(cfg.initial_field)
    return Track("events", tuple(items), -1 if init is None else _class(init, names, name, where))


def example_path(name: str = "locations.jsonl") -> str:
    """Path of a dataset shipped with beliefscope: ``locations.jsonl`` (200 stories of an object moving
    between four rooms, a location after every sentence and a per-text ``negated`` label) or ``tracking.jsonl``
    (200 entity-tracking stories: five objects in five boxes, moves, the watched object's ``box`` after every
    sentence and each record's own ``question``).

    >>> len(load_data(example_path(), events_field=("location",), label_field=("negated",)))
    200
    """

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no shipped dataset {name!r}; there are locations.jsonl and tracking.jsonl")
    return path


def class_counts(data: Data, label: str) -> dict[str, int]:
    """How many records (text labels) or events/spans carry each class of `label`."""
    c = collections.Counter()
    for r in data.records:
        t = r.tracks[label]
        c.update(data.classes[label][it if t.kind == "text" else it[-1]] for it in t.items)
    return dict(c)
