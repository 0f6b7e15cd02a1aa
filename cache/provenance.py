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
    """

    PREFILL = 0  # the prompt, written by the prefill forward
    DRAFT = 1  # proposed by a fast path / draft model, not yet verified
    VERIFIED = 2  # written or confirmed by the reference model
    REJECTED = 3  # a draft the verifier rejected (only seen in `cache.rejected`)
    THOUGHT = 4  # a Thinking States thought token: written after a chunk, then rolled back (dropped)


EVENT_KINDS = ("prefill", "decode", "verify", "thought", "rollback", "fork", "overwrite", "relocate")


class CacheEvent(NamedTuple):
    """One entry of ``cache.events``: ``kind`` happened to logical positions ``[start, end)`` of ``row``.

    Example::

        >>> from beliefscope.cache import CacheEvent
        >>> CacheEvent("rollback", row=0, start=5, end=8, step=3).kind
        'rollback'
    """

    kind: str  # one of EVENT_KINDS
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
