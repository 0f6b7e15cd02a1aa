"""Layout: which physical slots of a storage hold each row's logical positions.

A row's logical sequence is the concatenation of its *segments* ``[a, b)`` of physical slots. A
forward writes the same physical slots ``[start, start + n)`` for every row, so rows may be
ragged (different lengths) and may have holes (slots they rolled back, or slots other forks of
the same storage use). ``end`` is one past the highest slot any row uses: HF builds its causal
mask over ``[0, end + n)``. ``plan`` is the start a caller's mask was built for (see
``KVCache.attention_mask``), consumed by the next forward.

The layout knows nothing of tensors of keys and values; it is plain bookkeeping, O(1) per append
and per rollback of a row (amortised over segments).

>>> lay = Layout(batch=2)
>>> lay.append(0, 5)
[0, 0]
>>> lay.rollback([3, 5]); lay.lengths, lay.is_clean
([3, 5], False)
>>> lay.slots(0).tolist()
[0, 1, 2]
>>> lay.append(5, 1)
[3, 5]
>>> lay.segments[0], lay.positions(1).tolist()
([[0, 3], [5, 6]], [[4], [6]])
"""

from __future__ import annotations

import torch


class Layout:
    """Segments, lengths, physical end and planned start of every row (see the module docstring)."""

    __slots__ = ("segments", "lengths", "end", "plan")

    def __init__(self, batch: int = 0):
        self.segments: list[list[list[int]]] = [[] for _ in range(batch)]  # per row: [[a, b), ...] physical
        self.lengths: list[int] = [0] * batch  # per row: logical length
        self.end = 0  # one past the highest physical slot any row uses
        self.plan: tuple[int, int] | None = None  # (start, n) a mask was built for; the next forward uses it

    @classmethod
    def left_aligned(cls, lengths) -> Layout:
        """Every row ``r`` in slots ``[0, lengths[r])``."""
        lay = cls(len(lengths))
        lay.lengths = list(lengths)
        lay.segments = [[[0, n]] if n else [] for n in lengths]
        lay.end = max(lengths, default=0)
        return lay

    def copy(self) -> Layout:
        lay = Layout(0)
        lay.segments = [[s[:] for s in segs] for segs in self.segments]
        lay.lengths, lay.end = list(self.lengths), self.end
        return lay

    def gather(self, rows: list[int]) -> Layout:
        """A layout whose row ``i`` is this one's row ``rows[i]``."""
        lay = Layout(0)
        lay.segments = [[s[:] for s in self.segments[i]] for i in rows]
        lay.lengths = [self.lengths[i] for i in rows]
        lay._recompute_end()
        return lay

    # ------------------------------------------------------------------ queries
    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def is_clean(self) -> bool:
        """True if every row is the single segment ``[0, end)``: no mask or positions needed."""
        p = self.end
        for s in self.segments:  # a plain loop: this runs before every forward
            if s:
                if len(s) != 1 or s[0][0] != 0 or s[0][1] != p:
                    return False
            elif p:
                return False
        return True

    def slots(self, row: int, positions=None) -> torch.Tensor:
        """Physical slots (LongTensor) of logical ``positions`` (default: all) of ``row``."""
        segs, n = self.segments[row], self.lengths[row]
        if len(segs) == 1 and segs[0][0] == 0:
            idx = torch.arange(n)
        else:
            idx = torch.cat([torch.arange(a, b) for a, b in segs]) if segs else torch.zeros(0, dtype=torch.long)
        if positions is None:
            return idx
        pos = torch.as_tensor(positions, dtype=torch.long).reshape(-1)
        if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= n):
            raise IndexError(f"positions {pos.tolist()} out of range for row {row}: valid positions are 0..{n - 1}.")
        return idx[pos]

    def overlaps(self, start: int, end: int, row: int | None = None) -> bool:
        """True if a segment (of ``row``, or of any row) intersects physical ``[start, end)``."""
        if self.end <= start:
            return False
        for segs in (self.segments if row is None else [self.segments[row]]):
            for a, b in segs:
                if a < end and b > start:
                    return True
        return False

    def live_mask(self, start: int, n_new: int) -> torch.Tensor:
        """``[batch, start + n_new]`` long: 1 where a row has a live slot, and for the ``n_new`` new ones."""
        b = max(1, self.batch)
        if self.is_clean and start == self.end:
            return torch.ones((b, start + n_new), dtype=torch.long)
        mask = torch.zeros((b, start + n_new), dtype=torch.long)
        for r, segs in enumerate(self.segments):
            for a, e in segs:
                mask[r, a:e] = 1
        mask[:, start:] = 1
        return mask

    def positions(self, n_new: int) -> torch.Tensor:
        """``[batch, n_new]`` logical positions of the next ``n_new`` tokens of every row."""
        return torch.tensor(self.lengths or [0], dtype=torch.long)[:, None] + torch.arange(n_new)

    # ------------------------------------------------------------------ changes
    def append(self, start: int, n: int) -> list[int]:
        """Every row gains physical slots ``[start, start + n)``; returns the rows' lengths before."""
        before = list(self.lengths)
        for r, segs in enumerate(self.segments):
            if segs and segs[-1][1] == start:
                segs[-1][1] = start + n
            else:
                segs.append([start, start + n])
            self.lengths[r] += n
        self.end = start + n
        return before

    def rollback(self, lengths: list[int], rows: list[int] | None = None) -> None:
        """Row ``rows[i]`` (default: every row) keeps its first ``lengths[i]`` positions."""
        for r, t in zip(range(self.batch) if rows is None else rows, lengths):
            drop, segs = self.lengths[r] - t, self.segments[r]
            while drop:
                a, b = segs[-1]
                if b - a <= drop:
                    segs.pop()
                    drop -= b - a
                else:
                    segs[-1][1] = b - drop
                    drop = 0
            self.lengths[r] = t
        self._recompute_end()
        self.plan = None

    def _recompute_end(self) -> None:
        self.end = max((s[-1][1] for s in self.segments if s), default=0)
