"""Cheap immutable snapshots of a cache and diffs against them."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

# Global write clock: every cache write takes a fresh tick, so stamps compare across forks.
_CLOCK = itertools.count(1)


def tick() -> int:
    """Return a fresh, strictly increasing write stamp.

    Example::

        >>> tick() < tick()
        True
    """
    return next(_CLOCK)


@dataclass(frozen=True)
class Snapshot:
    """Lengths and write clock of a cache at one moment: O(batch) to take, holds no tensors.

    Example::

        >>> from beliefscope.cache.testing import tiny_cache
        >>> c = tiny_cache()
        >>> c.recorder.snapshot().lengths
        (0,)
    """

    cache_id: int  # id of the cache it was taken from (forks get their own id)
    lengths: tuple[int, ...]  # per-row logical length
    clock: int  # writes with a stamp > clock happened after the snapshot
    step: int  # forward counter of the cache


@dataclass(frozen=True)
class RowDiff:
    """What changed in one row since a snapshot (logical positions).

    Example::

        >>> RowDiff(row=0, added=range(3, 5), removed=range(0), overwritten=(1,)).changed
        True
    """

    row: int
    added: range  # positions that exist now but did not exist at the snapshot
    removed: range  # positions that existed at the snapshot and are gone now
    overwritten: tuple[int, ...]  # positions present both times whose K/V were rewritten since

    @property
    def changed(self) -> bool:
        return bool(len(self.added) or len(self.removed) or self.overwritten)


@dataclass(frozen=True)
class CacheDiff:
    """Per-row diffs; ``added``/``removed``/``overwritten`` shortcut to row 0.

    Example::

        >>> d = CacheDiff(rows=(RowDiff(0, range(2, 4), range(0), ()),))
        >>> list(d.added)
        [2, 3]
    """

    rows: tuple[RowDiff, ...]

    @property
    def added(self) -> range:
        return self.rows[0].added

    @property
    def removed(self) -> range:
        return self.rows[0].removed

    @property
    def overwritten(self) -> tuple[int, ...]:
        return self.rows[0].overwritten

    @property
    def changed(self) -> bool:
        return any(r.changed for r in self.rows)
