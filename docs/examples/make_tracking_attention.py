"""Write `tasks/data/tracking_attention.jsonl`: 200 short entity-tracking stories built for the attention
measurement of `beliefscope lens --attention` (`analyses.lens_attention`), in the record format of
`tasks/data/tracking.jsonl` (`beliefscope.tasks.boxes_tracking`): ``text``, ``box`` (the watched object's box
after every sentence from the one that places it, as ``[{end, state}]``), ``object``, ``question``, ``split``
(one record in five is "test") and ``id``.

Every story is scorable, by construction:

- 2 or 3 objects in 2 or 3 of the boxes A, B, C, then at most one move, so a small model can follow it;
- the **evidence** (the sentence that set the watched object's box: its placement, or its move) is never the
  story's last sentence;
- the box named **last** in the story (the last-named distractor, `tasks.surface.last_named`) is never the
  answer, so the distractor sentence (the story's last) differs from the evidence;
- the evidence's position is stratified: records cycle through "the evidence is 1, 2, 3 sentences before the
  end" (where the story is long enough) and through the answer boxes A, B, C, so recency alone cannot explain
  where the answer's attention goes, and the majority box is about a third.

Run ``python docs/examples/make_tracking_attention.py`` to rebuild it (seeded: byte-identical);
``python docs/examples/make_tracking_attention.py OUT.jsonl 400`` writes a larger set elsewhere.
"""

import json
import os
import random
import sys

from beliefscope.base.files import atomic_write_text

SEED = 20261128  # the seed of the stream
BOXES = ["A", "B", "C"]
OBJECTS = ["key", "coin", "ring", "pen", "cup", "map", "shoe", "bell"]
PLACE = ["The {o} is in Box {b}.", "Box {b} holds the {o}.", "Box {b} contains the {o}."]
MOVE = ["Move the {o} from Box {a} to Box {b}.", "The {o} goes from Box {a} into Box {b}."]


def draw(rng: random.Random) -> tuple[list[tuple[str, str | None]], str, int]:
    """One story: (sentence, the watched object's box after it, or None before it is placed), the watched object,
    and the index of the evidence sentence."""
    boxes = rng.sample(BOXES, rng.choice([2, 3]))
    objects = rng.sample(OBJECTS, rng.choice([2, 3]))
    where = {o: boxes[i] if i < len(boxes) else rng.choice(boxes) for i, o in enumerate(objects)}
    watched = rng.choice(objects)
    sentences = [(rng.choice(PLACE).format(o=o, b=where[o]), o) for o in objects]
    rng.shuffle(sentences)
    evidence = next(i for i, (_, o) in enumerate(sentences) if o == watched)
    if rng.random() < 0.5:  # one move, after the moved object's placement
        o = rng.choice(objects)
        b = rng.choice([x for x in boxes if x != where[o]])
        at = rng.randint(next(i for i, (_, x) in enumerate(sentences) if x == o) + 1, len(sentences))
        sentences.insert(at, (rng.choice(MOVE).format(o=o, a=where[o], b=b), None))
        if at <= evidence:
            evidence += 1
        if o == watched:
            evidence = at
        where[o] = b
    state, out, placed = None, [], False
    for i, (s, o) in enumerate(sentences):
        placed = placed or o == watched
        if placed:
            state = where[watched] if i >= evidence else _box_before(sentences, i, watched)
        out.append((s, state))
    return out, watched, evidence


def _box_before(sentences, i, watched) -> str:
    """The watched object's box after sentence `i`, before its move (its placement's box)."""
    s = next(s for s, o in sentences[: i + 1] if o == watched)
    return s.split("Box ")[1][0]


def story(rng: random.Random, i: int, want_back: int, want_box: str) -> dict:
    """The first drawn story whose evidence is `want_back` sentences before the end and whose answer is
    `want_box`, and whose last-named box is not the answer."""
    while True:
        sentences, watched, evidence = draw(rng)
        back = len(sentences) - evidence - 1  # sentences after the evidence
        answer, last_box = sentences[-1][1], sentences[-1][0].rsplit("Box ", 1)[1][0]
        if back == want_back and answer == want_box and last_box != answer:
            break
    text, events = "", []
    for s, b in sentences:
        text += (" " if text else "") + s
        if b is not None:
            events.append({"end": len(text), "state": b})
    return {"id": f"attn-{i:03d}", "text": text, "box": events, "object": watched,
            "question": f" Where is the {watched} now? The {watched} is in Box",
            "split": "test" if i % 5 == 4 else "train"}


def tracking_attention_records(n: int, seed: int = SEED) -> list[dict]:
    """The first ``n`` stories: the evidence 1, 2 or 3 sentences before the end (in turn, 3 only where a story
    has 4 sentences), the answer A, B or C (in turn)."""
    rng = random.Random(seed)
    backs = [1, 2, 3, 1, 2]  # 3 sentences back needs 4 sentences (3 objects and a move): rarer, as in the stream
    return [story(rng, i, backs[i % len(backs)], BOXES[i % 3]) for i in range(n)]


def main(path: str | None = None, n: int = 200) -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = path or os.path.join(root, "tasks", "data", "tracking_attention.jsonl")
    atomic_write_text(path, "".join(json.dumps(rec) + "\n" for rec in tracking_attention_records(n)))
    return path


if __name__ == "__main__":
    print(main(*(sys.argv[1:2] or [None]), *[int(a) for a in sys.argv[2:3]]))
