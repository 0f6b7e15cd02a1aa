"""Drafting the thoughts of speculative prefill: what will T think after this chunk?

Speculative prefill (`decoding.thinking`) drafts several chunks in one backbone forward with a
state S for each. Assuming every thought is empty (S carries over) is right only until the state
changes: on a coin-flip story, about one chunk in two. `ThoughtDrafter` predicts each chunk's
thought from the thoughts T wrote before after a chunk that ended the same way in the same state,
the way prompt-lookup decoding (Saxena 2023) predicts tokens from the prompt's n-grams. A drafted
non-empty thought gives the next drafted chunk its S (C's memo: `state_from_thoughts`), so a
run of flips is kept whole. T still reads every drafted chunk and the draft is cut at the first
thought it gets wrong: the thoughts and the answer are exactly those of chunk-by-chunk inference;
a good drafter only keeps more chunks per forward.

>>> d = ThoughtDrafter(eos_id=1)
>>> d.record(None, [5, 7, 9], [3, 1]); d.predict(None, [6, 7, 9]), d.predict((3, 1), [6, 7, 9])
([3, 1], [1])
"""

from __future__ import annotations


class ThoughtDrafter:
    """A table ``(state, chunk ending) -> thought`` filled from T's own thoughts.

    ``state`` is the last non-empty thought before the chunk (None at the start of a story): the
    text of what the model believes. The chunk ending is its last ``tail`` tokens; the whole chunk
    is looked up first. Unknown: the empty thought (a bare ``eos_id``), the assumption of plain
    speculative prefill. Share one drafter across runs to reuse what earlier stories taught it."""

    def __init__(self, eos_id: int, tail: int = 2, learn: bool = True):
        if tail < 1:
            raise ValueError(f"tail={tail} keys no token of the chunk: use tail >= 1")
        self.eos_id, self.tail, self.learn = eos_id, tail, learn  # learn=False: always the empty thought
        self.table: dict[tuple, tuple[int, ...]] = {}  # (state, chunk tokens) -> thought tokens

    def _keys(self, state, chunk) -> list[tuple]:
        chunk = tuple(int(t) for t in chunk)
        return [(state, chunk), (state, ("tail",) + chunk[-self.tail:])]

    def predict(self, state: tuple | None, chunk) -> list[int]:
        """The thought expected after ``chunk`` (token ids) in ``state``."""
        for key in self._keys(state, chunk):
            if key in self.table:
                return list(self.table[key])
        return [self.eos_id]

    def record(self, state: tuple | None, chunk, thought) -> None:
        """Remember that T thought ``thought`` after ``chunk`` in ``state`` (the latest wins)."""
        if not self.learn:
            return
        for key in self._keys(state, chunk):
            self.table[key] = tuple(int(t) for t in thought)

    def next_state(self, state: tuple | None, thought, carries: bool) -> tuple | None:
        """The state after ``thought``: unchanged by an empty one (``carries``), else the thought."""
        return state if carries else tuple(int(t) for t in thought)


DRAFTER_KINDS = ("shared", "fresh", "empty")


def thought_drafter_factory(kind: str, eos_id: int):
    """A function giving the drafter of each run: ``"shared"`` one drafter for every run (what earlier
    stories taught it is kept), ``"fresh"`` a new one per run (it learns from the story alone),
    ``"empty"`` one that always drafts the empty thought (the paper's assumption)."""
    if kind not in DRAFTER_KINDS:
        raise ValueError(f"thought drafter {kind!r} is unknown: use one of {DRAFTER_KINDS}")
    if kind == "shared":
        shared = ThoughtDrafter(eos_id)
        return lambda: shared
    return lambda: ThoughtDrafter(eos_id, learn=kind == "fresh")
