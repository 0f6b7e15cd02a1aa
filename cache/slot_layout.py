"""SlotLayout: a fixed grid of rows x capacity, the other layout a `KVCache` can have (``CacheConfig(slots=True)``).

`Layout` (layout.py) writes the same physical slots for every row and keeps segments, so a cache
can fork, hole and grow. A *slot* layout is what fixed-shape verification needs (the deterministic
scheduler's caches, ``decoding.scheduler``): row r's logical position i lives at physical slot i of
row r, and ``lengths[r]`` positions are held. A forward runs over the rows its plan names (all of
them, or a subset) and writes W tokens at positions ``lengths[r] .. lengths[r] + W - 1`` of each of
those rows, every row at its own place, attending over the plan's first ``span`` slots through a
mask, so no shape depends on the other rows' lengths. Rollback moves a row's length: O(1). Like
`Layout`, it holds no keys or values, and it answers the same questions (``lengths``, ``segments``,
``slots``, ``rollback``) so the cache's recorder and inspection read both alike.

>>> lay = SlotLayout([2, 0], capacity=4, windows=None, device=torch.device("cpu"))
>>> lay.write_positions([0, 1], 2).tolist()
[[2, 3], [0, 1]]
>>> lay.mask([0, 1], 1)[:, 0, 0].int().tolist()   # row 0's query sees its 2 keys and itself; row 1's, itself
[[1, 1, 1, 0], [1, 0, 0, 0]]
"""

from __future__ import annotations

import torch

from .masks import apply_windows


class SlotLayout:
    """Per-row lengths over a fixed capacity (see the module docstring)."""

    __slots__ = ("lengths", "capacity", "windows", "device", "plan", "current")

    def __init__(self, lengths, capacity: int, windows: tuple | None, device: torch.device):
        self.lengths: list[int] = [int(n) for n in lengths]  # [B] held positions per row
        self.capacity = capacity  # positions per row (the attention width of a full-capacity forward)
        self.windows = windows  # per layer sliding window (None = full attention), as models.profile reads it
        self.device = torch.device(device)  # where the masks and positions go (the model's device)
        self.plan: tuple | None = None  # (rows, span, through a view) of the next forward, set with its mask
        # the forward in progress: (rows as a slice or an index tensor, span, write positions [R, W] on the device)
        self.current: tuple | None = None

    # ------------------------------------------------------------------ what `Layout` answers too
    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def end(self) -> int:
        """One past the highest physical slot a forward may attend to: the capacity."""
        return self.capacity

    @property
    def is_clean(self) -> bool:
        return False  # every forward takes its mask and positions from the plan

    @property
    def segments(self) -> list[list[list[int]]]:
        """Per row ``[[0, length]]`` (empty for an empty row): positions are slots."""
        return [[[0, n]] if n else [] for n in self.lengths]

    def slots(self, row: int, positions=None) -> torch.Tensor:
        """Physical slots of logical ``positions`` (default: all) of ``row``: the positions themselves."""
        n = self.lengths[row]
        if positions is None:
            return torch.arange(n)
        pos = torch.as_tensor(positions, dtype=torch.long).reshape(-1)
        if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= n):
            raise IndexError(f"positions {pos.tolist()} out of range for row {row}: valid positions are 0..{n - 1}.")
        return pos

    def overlaps(self, start: int, end: int, row: int | None = None) -> bool:
        return any(n > start for n in (self.lengths if row is None else [self.lengths[row]]))

    def rollback(self, lengths: list[int], rows: list[int] | None = None) -> None:
        """Row ``rows[i]`` (default: every row) keeps its first ``lengths[i]`` positions."""
        for r, t in zip(range(self.batch) if rows is None else rows, lengths):
            self.lengths[r] = int(t)
        self.plan = None

    def copy(self) -> SlotLayout:
        return SlotLayout(self.lengths, self.capacity, self.windows, self.device)

    def gather(self, rows: list[int]) -> SlotLayout:
        """A layout whose row ``i`` is this one's row ``rows[i]``."""
        return SlotLayout([self.lengths[i] for i in rows], self.capacity, self.windows, self.device)

    # ------------------------------------------------------------------ a forward over some rows
    def check_rows(self, rows) -> list[int]:
        """``rows`` (None: every row) as a list, refused unless distinct rows of this grid."""
        if isinstance(rows, range) and rows.step != 1:
            raise ValueError(f"rows {rows} must be a run of rows (step 1) or a list")
        rows = list(range(self.batch)) if rows is None else [int(r) for r in rows]
        if not rows or len(set(rows)) != len(rows) or min(rows) < 0 or max(rows) >= self.batch:
            raise ValueError(f"rows {rows} must be distinct slots in 0 .. {self.batch - 1}")
        return rows

    def write_positions(self, rows: list[int], width: int) -> torch.Tensor:
        """Where the next ``width`` tokens of ``rows`` go ``[R, W]`` (clamped to the last slot: past the capacity
        the mask refuses first, and a recorded forward's dummy rows write only where nothing attends)."""
        lengths = torch.tensor([self.lengths[r] for r in rows], dtype=torch.long)
        return (lengths[:, None] + torch.arange(width)).clamp(max=self.capacity - 1).to(self.device)

    def position_ids(self, rows: list[int], width: int) -> torch.Tensor:
        """Logical positions ``[R, W]`` of the next ``width`` tokens of ``rows``."""
        lengths = torch.tensor([self.lengths[r] for r in rows], dtype=torch.long)
        return (lengths[:, None] + torch.arange(width)).to(self.device)

    def mask(self, rows: list[int], width: int, span: int | None = None):
        """Boolean ``[R, 1, W, span]``: query i of row r sees keys ``0 .. lengths[r] + i`` (and, on a layer with a
        sliding window w, only the last w of them: a dict per layer type when layers differ)."""
        longest = max(self.lengths[r] for r in rows)
        if longest + width > self.capacity:
            raise ValueError(f"a slot would grow past its capacity {self.capacity}: raise the scheduler's "
                             f"slot capacity (longest row {longest} + window {width})")
        last = self.position_ids(rows, width)  # [R, W] last visible key per query
        keys = torch.arange(self.capacity if span is None else span, device=self.device)  # [span]
        mask = (keys[None, None, :] <= last[:, :, None])[:, None]  # [R, 1, W, span]
        return apply_windows(mask, last, keys.expand(last.shape[0], -1), self.windows)
