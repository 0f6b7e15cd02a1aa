"""Entity-tracking stories in the style of Kim & Schuster (2023, "Entity Tracking in Language Models"):
objects in lettered boxes, then moves, and one watched object whose box is the state after every sentence;
and their own file format (`boxes_records`: `load_data(..., format="boxes")`).

Each record has ``text``; ``box``, a list of ``{"end", "state"}`` events (the watched object's box after
every sentence from the one that places it, held until the next sentence ends); ``object`` (the watched
object); ``question`` (its own question, ``" Where is the <object> now? It is in Box"``); ``split`` (one
record in five is "test"); and ``id``.

Moves of the *other* objects name boxes too, so "the box named last so far" is often wrong: it is the
surface baseline a probe of the watched object's box has to beat (`tasks.surface`).

>>> r = tracking_records(2)[0]
>>> r["box"][-1]["end"] == len(r["text"]) and r["question"].startswith(" Where is the ")
True
"""

from __future__ import annotations

import random
from dataclasses import replace

SEED = 20261128  # the seed of the stream
BOXES = ["A", "B", "C", "D", "E"]
OBJECTS = ["key", "coin", "ring", "pen", "cup", "map", "shoe", "bell", "leaf", "card"]
PLACE = ["Box {b} contains the {o}.", "The {o} is in Box {b}.", "Box {b} holds the {o}."]
MOVE = ["Move the {o} from Box {a} to Box {b}.", "The {o} goes from Box {a} into Box {b}.",
        "Someone puts the {o} from Box {a} in Box {b}."]


def story(rng: random.Random, i: int) -> dict:
    objects = rng.sample(OBJECTS, len(BOXES))
    where = dict(zip(objects, rng.sample(BOXES, len(BOXES))))
    watched = rng.choice(objects)
    sentences = [(rng.choice(PLACE).format(b=where[o], o=o), where[watched] if o == watched else None)
                 for o in objects]  # (sentence, the watched object's box once it is placed)
    for _ in range(rng.randint(2, 6)):
        # a move of the watched object one time in three, of another object otherwise
        o = watched if rng.random() < 1 / 3 else rng.choice([x for x in objects if x != watched])
        b = rng.choice([x for x in BOXES if x != where[o]])
        sentences.append((rng.choice(MOVE).format(o=o, a=where[o], b=b), None))
        where[o] = b
        sentences[-1] = (sentences[-1][0], where[watched])
    text, events, state = "", [], None
    for s, b in sentences:
        text += (" " if text else "") + s
        state = b or state
        if state is not None:
            events.append({"end": len(text), "state": state})
    return {"id": f"track-{i:03d}", "text": text, "box": events, "object": watched,
            "question": f" Where is the {watched} now? It is in Box", "split": "test" if i % 5 == 4 else "train"}


def tracking_records(n: int, seed: int = SEED) -> list[dict]:
    """The first ``n`` stories of the seeded stream."""
    rng = random.Random(seed)
    return [story(rng, i) for i in range(n)]


# ------------------------------------------------------------------------------- the boxes file format
def boxes_records(rows: list[dict]) -> list[dict]:
    """Kim & Schuster (2023)'s entity-tracking records (``sentence``, ``masked_content``, ``numops``) as
    records of this contract: the text is the sentence up to its mask token, the label (``content``) the
    masked box content, and ``numops`` the group (so folds never mix one operation count). The one-liner
    it replaces: ``{"text": r["sentence"].split("<extra_id_0>")[0].rstrip(), "content": r["masked_content"]
    .replace("<extra_id_0>", "").strip(), "group": r["numops"]}``.

    >>> boxes_records([{"sentence": "Box 0 contains the car. Box 0 contains <extra_id_0> .",
    ...                 "masked_content": "<extra_id_0> the car", "numops": 0}])[0]["content"]
    'the car'
    """
    out = []
    for i, r in enumerate(rows):
        missing = [k for k in ("sentence", "masked_content") if k not in r]
        if missing:
            raise ValueError(f"boxes record {i} lacks {missing}; its fields are {list(r)}: the boxes format has "
                             "sentence, masked_content and numops")
        out.append({"text": r["sentence"].split("<extra_id_0>")[0].rstrip(),
                    "content": r["masked_content"].replace("<extra_id_0>", "").strip(),
                    "group": r.get("numops", ""), **({"id": r["id"]} if "id" in r else {})})
    return out


def boxes_config(cfg):
    """A `DataConfig` for boxes records: their text, and the masked content as a label per text."""

    return replace(cfg, text_field="text", label_field=("content",), events_field=(), spans_field=())
