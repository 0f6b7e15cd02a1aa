"""What a decoding step keeps of the cache its verify forward wrote (`Keep`), and the one function that applies
it (`settle`). The decoding engine (``decoding.engine.run``) is its only caller: a policy says what stays, the
engine labels and cuts. It lives beside the cache so that policies below the engine (Thinking States' in
``models.thinking``) can say it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .provenance import Provenance


@dataclass(frozen=True)
class Keep:
    """What a step keeps of the cache its verify forward wrote; `settle` applies it.

    ``lengths`` is every row's length afterwards (one int: a one-row cache). ``window`` describes a one-row
    verify window laid out from ``position`` as [pending, accepted drafts, rejected drafts, padding]:
    ``(position, accepted drafts, end of the drafts)``; its accepted drafts are labelled ACCEPTED and, with
    ``keep_rejected``, its rejected ones REJECTED and kept in ``cache.recorder.rejected``. ``verified`` lists
    ``(row, start, end)`` spans a ragged step labels VERIFIED. A step may keep several caches (the target's and a
    draft model's own): each `Keep` names its ``cache``, None meaning the policy's."""

    lengths: int | list[int]  # positions each row holds after the step
    window: tuple[int, int, int] | None = None  # (position, n accepted drafts, drafts end) of a one-row window
    keep_rejected: bool = False  # the window's rejected drafts stay in cache.recorder.rejected
    verified: tuple = ()  # (row, start, end) spans labelled VERIFIED
    cache: Any = None  # the cache it applies to: None for the policy's own; a draft model's cache, for its drafter


def settle(cache, keep: Keep) -> None:
    """Label and cut ``cache`` as ``keep`` says: the only place a decoding step rolls a cache back (the engine
    calls it between a step's accept and its commit).

    With a window, ``keep.lengths`` is below the accepted drafts' end when EOS (or the budget) ends the output on
    an accepted draft: that draft is the pending output token, and the accepted drafts after it are cut
    unlabelled, like padding. They were not rejected, so they are never in ``cache.recorder.rejected``."""
    for row, start, end in keep.verified:
        cache.recorder.mark(start, end, Provenance.VERIFIED, row=row)
    if not isinstance(keep.lengths, int):
        cache.rollback(list(keep.lengths))
        return
    if keep.window is None:
        if keep.lengths < cache.seq_len:
            cache.rollback(keep.lengths, rejected_end=keep.lengths)  # padding or unlabelled writes, never kept
        return
    position, n_accepted, drafts_end = keep.window
    accepted_end = position + 1 + n_accepted
    cache.recorder.mark(position + 1, min(keep.lengths, accepted_end), Provenance.ACCEPTED)
    if keep.keep_rejected and accepted_end < drafts_end:
        cache.recorder.mark(accepted_end, drafts_end, Provenance.REJECTED)
    if keep.lengths < accepted_end:
        cache.rollback(accepted_end, rejected_end=drafts_end)
        cache.rollback(keep.lengths, rejected_end=keep.lengths)
    else:
        cache.rollback(keep.lengths, rejected_end=drafts_end)
