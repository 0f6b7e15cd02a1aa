"""Per-position provenance labels and the cache event log."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import torch


class Provenance(IntEnum):
    """Who wrote a cache position.

    Example::

        >>> from beliefscope.cache import Provenance
        >>> Provenance.DRAFT < Provenance.VERIFIED
        True
        >>> [p.name for p in Provenance]
        ['PREFILL', 'DRAFT', 'VERIFIED', 'REJECTED', 'ACCEPTED']

    In a speculative run's target cache every live position after the prompt is either VERIFIED (a
    token the verifier chose: plain decoding's, the prefill's first pick, the token it committed at a
    rejection or after the last accepted draft) or ACCEPTED (a drafted token the verifier accepted);
    ``cache.recorder.rejected`` holds the REJECTED drafts. The padding of a fixed-shape verify forward is none
    of these: it is rolled back without a label and never kept. DRAFT is what a fast path writes in
    its own cache (a draft model's, Thinking States' drafted chunks) before anything is verified.
    """

    PREFILL = 0  # the prompt, written by the prefill forward
    DRAFT = 1  # proposed by a fast path / draft model, not yet verified
    VERIFIED = 2  # a token the reference model chose itself (plain decoding; the verifier's own token)
    REJECTED = 3  # a draft the verifier rejected, or one cut after EOS (only seen in `cache.recorder.rejected`)
    ACCEPTED = 4  # a draft the verifier accepted (its K/V are the verify forward's: the reference's values)


FIRST_TAG = 8  # the lowest code a `Tag` may take (the codes below are `Provenance`'s); int8 storage caps it at 127


class Tag(int):
    """A provenance label defined by the cache's owner, not by the cache: a code, a name, and the kind of
    event its writes log. Thinking States tags its thoughts ``Tag(8, "THOUGHT", event="thought")``
    (`beliefscope.models.thinking.THOUGHT`). Use it wherever a `Provenance` is taken (``tagging``,
    ``next_provenance``, ``overwrite``); positions keep the code, and ``summary`` shows the name.

    Example::

        >>> from beliefscope.cache import Tag
        >>> note = Tag(9, "NOTE", event="note")
        >>> int(note), note.name, note.event
        (9, 'NOTE', 'note')
    """

    name: str
    event: str

    def __new__(cls, code: int, name: str, event: str):
        if not FIRST_TAG <= int(code) <= 127:
            raise ValueError(f"Tag code {code} must be in [{FIRST_TAG}, 127]: the codes below {FIRST_TAG} are "
                             "Provenance's, and positions store their code as int8")
        if not (isinstance(name, str) and name and isinstance(event, str) and event):
            raise ValueError(f"a Tag needs a name and an event kind (non-empty text); got {name!r}, {event!r}")
        if event in EVENT_KINDS:
            raise ValueError(f"Tag event {event!r} is one of the cache's own event kinds {EVENT_KINDS}: give the "
                             "owner's own kind (e.g. 'thought')")
        tag = int.__new__(cls, int(code))
        tag.name, tag.event = name, event
        return tag

    def __reduce__(self):
        return Tag, (int(self), self.name, self.event)

    def __repr__(self) -> str:
        return f"Tag({int(self)}, {self.name!r}, event={self.event!r})"


def label(code) -> Provenance | Tag:
    """``code`` as a `Provenance`, or the `Tag` itself; any other code is refused by name."""
    if isinstance(code, Tag):
        return code
    try:
        return Provenance(code)
    except ValueError:
        raise ValueError(f"provenance {code!r} is neither a Provenance ({', '.join(p.name for p in Provenance)}) "
                         "nor a Tag: define an owner's own label with beliefscope.cache.Tag(code, name, event)"
                         ) from None


EVENT_KINDS = ("prefill", "decode", "verify", "rollback", "fork", "overwrite", "relocate")  # the cache's own


class CacheEvent(NamedTuple):
    """One entry of ``cache.recorder.events``: ``kind`` happened to logical positions ``[start, end)`` of ``row``.

    Example::

        >>> from beliefscope.cache import CacheEvent
        >>> CacheEvent("rollback", row=0, start=5, end=8, step=3).kind
        'rollback'
    """

    kind: str  # one of EVENT_KINDS, or the event of the `Tag` the write was tagged with
    row: int  # batch row
    start: int  # first logical position concerned
    end: int  # one past the last logical position concerned
    step: int  # forward-pass counter of the cache when it happened


@dataclass
class RejectedSpan:
    """Entries removed by a rollback while ``keep_rejected`` was on (copies, not views).

    Example::

        >>> span = RejectedSpan(row=0, start=3, end=5, step=2, provenance=torch.ones(2, dtype=torch.int8))
        >>> span.end - span.start
        2
    """

    row: int  # batch row
    start: int  # first rolled-back logical position
    end: int  # one past the last rolled-back position
    step: int  # cache step of the rollback
    provenance: torch.Tensor  # [end-start] int8, provenance the entries had before rejection
    keys: list[torch.Tensor] = field(default_factory=list)  # per layer: [kv_heads, end-start, d_head]
    values: list[torch.Tensor] = field(default_factory=list)  # per layer: [kv_heads, end-start, d_head]
