"""Where Thinking States reads and writes, and how its input is cut into chunks.

>>> chunk_spans([3, 4, 8, 5, 8, 6, 7], ThinkingConfig(), boundary_id=8)
[(0, 3, True), (3, 5, True), (5, 7, False)]
>>> chunk_spans([1, 2, 3, 4, 5], ThinkingConfig(chunking="fixed", chunk_size=2), boundary_id=8)
[(0, 2, True), (2, 4, True), (4, 5, False)]
"""

from __future__ import annotations

from dataclasses import dataclass

from ...cache import Tag

# How T's cache labels a thought's positions: Thinking States' own tag, not one of the cache's provenances.
# Its writes log a "thought" event; the span is rolled back after the thought is read (see `think_cached`).
THOUGHT = Tag(8, "THOUGHT", event="thought")


@dataclass
class ThinkingConfig:
    """Where Thinking States reads and writes, and how the input is chunked."""

    l_in: int = 1  # S_{i+1} is added at blocks.{l_in}.hook_resid_pre (the input of block l_in)
    l_out: int = -2  # T reads blocks.{l_out}.hook_resid_post; negative counts from the end (-2: second-to-last)
    chunking: str = "events"  # "events": a chunk ends after each boundary token; "fixed": every chunk_size tokens
    chunk_size: int = 8  # tokens per chunk when chunking == "fixed"
    boundary: str = "."  # the token that ends an event in the toy grammar (chunking == "events")
    max_thought: int = 3  # most tokens T writes per chunk, <eos> included
    lookup: int = 4  # remembered thoughts `ThinkingStates.think` also feeds in its first forward (0: none)
    empty_unchanged: bool = False  # gold thought is a bare <eos> after a chunk that left the state as it was;
    #   an empty thought then carries S over to the next chunk (no C call), which speculative prefill exploits
    init_from_backbone: bool = True  # T starts as a copy of the backbone's last block, C of its first

    def check(self, n_layers: int) -> None:
        if self.chunking not in ("events", "fixed"):
            raise ValueError(f"chunking {self.chunking!r} is unknown: use 'events' or 'fixed'")
        if self.chunking == "fixed" and self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if not 0 <= self.l_in < n_layers:
            raise ValueError(f"l_in={self.l_in} is outside the backbone's blocks 0..{n_layers - 1}")
        if not -n_layers <= self.l_out < n_layers:
            raise ValueError(f"l_out={self.l_out} is outside the backbone's blocks 0..{n_layers - 1}")
        if self.lookup < 0:
            raise ValueError(f"lookup={self.lookup} must be >= 0 (0 turns the thought lookup off)")


def chunk_spans(ids, cfg: ThinkingConfig, boundary_id: int | None) -> list[tuple[int, int, bool]]:
    """``[(start, end, complete)]`` covering `ids`; T thinks after each complete chunk."""
    n = len(ids)
    spans, start = [], 0
    if cfg.chunking == "fixed":
        for start in range(0, n, cfg.chunk_size):
            end = min(n, start + cfg.chunk_size)
            spans.append((start, end, end - start == cfg.chunk_size))
        return spans
    for i, t in enumerate(ids):
        if int(t) == boundary_id:
            spans.append((start, i + 1, True))
            start = i + 1
    if start < n:
        spans.append((start, n, False))
    return spans
