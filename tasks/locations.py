"""Short stories of an object moving between rooms: the shipped example dataset of `harvest --data`
(``tasks/data/locations.jsonl``, 200 records) and, at any size, the data of the probe benchmark.

Each record has ``text``; ``location``, a list of ``{"end", "state"}`` events (the object's room after
every sentence, which holds until the next sentence ends); ``negated``, a label per text ("yes" when
one sentence says that someone did *not* move the object, which leaves it where it was); ``split``
(one record in five is "test"); and ``id``. The stream is seeded, so a size gives the same records.

>>> recs = location_records(3)
>>> recs[0]["location"][-1]["end"] == len(recs[0]["text"])
True
"""

from __future__ import annotations

import random

SEED = 20261126  # the seed of the shipped file

ROOMS = ["kitchen", "garden", "hall", "bedroom"]
OBJECTS = ["key", "ball", "book", "lamp", "cup", "hat", "coin", "box"]
PEOPLE = ["Tom", "Mia", "Ravi", "Lena", "Omar", "Ada", "Sam", "Yuki"]
OPENINGS = ["The {o} is in the {r}.", "Someone left the {o} in the {r}.", "At first the {o} sits in the {r}.",
            "This morning the {o} was in the {r}."]
MOVES = ["{p} takes the {o} to the {r}.", "{p} carries the {o} into the {r}.", "{p} moves the {o} to the {r}.",
         "Then {p} brings the {o} to the {r}.", "{p} puts the {o} in the {r}."]
STAYS = ["{p} reads a book.", "{p} looks out of the window.", "{p} makes some tea.", "{p} waves at a friend."]
NEGATED = ["{p} does not take the {o} to the {r}.", "{p} thinks about moving the {o} to the {r}, but does not."]


def story(rng: random.Random, i: int) -> dict:
    o, r = rng.choice(OBJECTS), rng.choice(ROOMS)
    people = rng.sample(PEOPLE, 3)
    sentences = [(rng.choice(OPENINGS).format(o=o, r=r), r)]
    negated = rng.random() < 0.5
    n_more = rng.randint(2, 5)
    neg_at = rng.randrange(n_more) if negated else -1
    for k in range(n_more):
        p = rng.choice(people)
        if k == neg_at:
            other = rng.choice([x for x in ROOMS if x != r])
            sentences.append((rng.choice(NEGATED).format(p=p, o=o, r=other), r))
        elif rng.random() < 0.7:
            r = rng.choice([x for x in ROOMS if x != r])
            sentences.append((rng.choice(MOVES).format(p=p, o=o, r=r), r))
        else:
            sentences.append((rng.choice(STAYS).format(p=p), r))
    text, events = "", []
    for s, room in sentences:
        text += (" " if text else "") + s
        events.append({"end": len(text), "state": room})
    return {"id": f"loc-{i:03d}", "text": text, "location": events, "negated": "yes" if negated else "no",
            "split": "test" if i % 5 == 4 else "train"}


def location_records(n: int, seed: int = SEED) -> list[dict]:
    """The first ``n`` stories of the seeded stream (the shipped file is ``n=200``)."""
    rng = random.Random(seed)
    return [story(rng, i) for i in range(n)]
