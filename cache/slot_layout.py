"""SlotLayout: a fixed grid of rows x capacity, the other layout a `Storage` can have.

`Layout` (layout.py) writes the same physical slots for every row and keeps segments, so a cache
can fork, hole and grow. A *slot* layout is what fixed-shape verification needs
(`decoding.slots.SlotCache`, the deterministic scheduler's cache): row r's logical position i
lives at physical slot i of row r, and ``lengths[r]`` positions are committed. A forward of W
tokens writes positions ``lengths[r] .. lengths[r] + W - 1`` of each row, every row at its own
place, and attends over the whole capacity through a mask, so no shape depends on the rows'
lengths. Rollback moves a row's length: O(1). Like `Layout`, it holds no keys or values.

>>> lay = SlotLayout(torch.tensor([2, 0]), capacity=4, windows=None, device=torch.device("cpu"))
>>> lay.write_positions(2).tolist()
[[2, 3], [0, 1]]
>>> lay.mask(1)[:, 0, 0].int().tolist()   # row 0's query sees its 2 keys and itself; row 1's, itself
[[1, 1, 1, 0], [1, 0, 0, 0]]
"""

from __future__ import annotations

import torch

from .masks import apply_windows


class SlotLayout:
    """Per-row lengths over a fixed capacity (see the module docstring)."""

    __slots__ = ("lengths", "capacity", "windows", "device")

    def __init__(self, lengths: torch.Tensor, capacity: int, windows: tuple | None, device: torch.device):
        self.lengths = lengths  # [B] committed positions per row (host, long); a view's is a slice of its parent's
        self.capacity = capacity  # positions per row (the attention width of every forward)
        self.windows = windows  # per layer sliding window (None = full attention), as models.profile reads it
        self.device = torch.device(device)  # where the masks and positions go (the model's device)

    def rows(self, start: int, stop: int, span: int) -> SlotLayout:
        """Rows ``start:stop`` over their first ``span`` positions, sharing these lengths."""
        return SlotLayout(self.lengths[start:stop], span, self.windows, self.device)

    def write_positions(self, width: int) -> torch.Tensor:
        """Where the next ``width`` tokens of every row go ``[B, W]`` (clamped to the last slot: a dummy
        row's pad writes land past its length, where nothing attends before they are overwritten)."""
        return (self.lengths[:, None] + torch.arange(width)).clamp(max=self.capacity - 1).to(self.device)

    def position_ids(self, width: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Logical positions ``[B, W]`` of the next ``width`` tokens (of the rows whose ``lengths`` are given)."""
        lengths = self.lengths if lengths is None else lengths
        return (lengths[:, None] + torch.arange(width)).to(self.device)

    def mask(self, width: int, lengths: torch.Tensor | None = None, span: int | None = None):
        """Boolean ``[B, 1, W, C]``: query i of row r sees keys ``0 .. lengths[r] + i`` (and, on a
        layer with a sliding window w, only the last w of them: a dict per layer type when layers differ).
        ``lengths [n]`` and ``span``: the same for a subset of rows over their first ``span`` keys."""
        lengths = self.lengths if lengths is None else lengths
        if int(lengths.max()) + width > self.capacity:
            raise ValueError(f"a slot would grow past its capacity {self.capacity}: raise the scheduler's "
                             f"slot capacity (longest row {int(lengths.max())} + window {width})")
        last = self.position_ids(width, lengths)  # [B, W] last visible key per query
        keys = torch.arange(self.capacity if span is None else span, device=self.device)  # [C]
        mask = (keys[None, None, :] <= last[:, :, None])[:, None]  # [B, 1, W, C]
        return apply_windows(mask, last, keys.expand(last.shape[0], -1), self.windows)
