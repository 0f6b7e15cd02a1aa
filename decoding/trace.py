"""The record of a speculative run: per step, what was proposed, accepted, rejected, and cached.

>>> t = Trace(prompt_len=3)
>>> t.steps.append(Step(0, 3, [7, 8], 1, [7, 9], [8], 2))
>>> t.acceptance()
0.5
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from beliefscope.base.files import atomic_write_json


@dataclass
class Step:
    """One draft + verify step."""

    index: int  # step number (0 = first verify after the prefill)
    position: int  # absolute position of the pending token (first input of the verify window)
    proposals: list[int]  # drafted tokens, in order
    accepted: int  # how many drafts the verifier accepted
    committed: list[int]  # tokens committed by this step (accepted drafts + the reference's token)
    rejected: list[int]  # drafts discarded (after the first mismatch)
    gamma: int  # gamma requested at this step
    draft_seconds: float = 0.0  # time in the drafter
    verify_seconds: float = 0.0  # time in the verify forward (+ rollback)
    events: list[tuple] = field(default_factory=list)  # target cache events of this step (kind, row, start, end, step)
    tree_parents: list[int] | None = None  # token trees: parent of every proposal (-1 = the pending token)
    path: list[int] | None = None  # token trees: indices of the accepted proposals, root to leaf
    rejected_order: list[int] | None = None  # token trees: proposal index of each entry of the step's
    # rejected span in cache.recorder.rejected (with keep_rejected), in cache order; the pending token's slot excluded


@dataclass
class Trace:
    """Steps of one run, plus activations captured through ``hooks.capture``.

    Captured records carry tags ``{pass: draft|verify, step: i, status: committed|rolled_back|partial,
    committed_end: n}``; a position ``p`` of a record is committed iff ``p < committed_end``. A verify
    record holds the window's real tokens only (the pending token and the drafts): the padding of a
    fixed-shape forward is cut, so ``rolled_back`` positions are exactly the drafts that were not kept.
    """

    prompt_len: int  # prompt tokens
    steps: list[Step] = field(default_factory=list)  # one per verify
    captures: list = field(default_factory=list)  # hooks.Capture objects (target, and the draft model's)

    def acceptance(self) -> float | None:
        """Accepted / drafted over every step (None when nothing was drafted)."""
        drafted = sum(len(s.proposals) for s in self.steps)
        return sum(s.accepted for s in self.steps) / drafted if drafted else None

    def activations(self, name: str, pass_: str = "verify", status: str | None = "committed"):
        """``(positions [n], acts [n, ...])`` at hook ``name`` from the ``pass_`` forwards, keeping
        only positions with ``status`` (``committed`` / ``rolled_back``; None = all, later writes first)."""
        recs = [r for cap in self.captures for r in cap.records.get(name, []) if r.tags.get("pass") == pass_]
        if not any(name in cap.records for cap in self.captures):
            raise KeyError(f"no activations at {name!r}: run with SpecConfig(trace=True, capture=({name!r},))")
        pos, acts = [], []
        for r in recs:
            if "committed_end" not in r.tags:
                continue
            keep = torch.ones_like(r.positions, dtype=torch.bool)
            if status == "committed":
                keep = r.positions < r.tags["committed_end"]
            elif status == "rolled_back":
                keep = r.positions >= r.tags["committed_end"]
            pos.append(r.positions[keep])
            acts.append(r.act[0, keep])
        if not pos:
            return torch.empty(0, dtype=torch.long), torch.empty(0)
        return torch.cat(pos), torch.cat(acts)

    def to_dict(self) -> dict:
        return {"prompt_len": self.prompt_len, "acceptance": self.acceptance(),
                "steps": [asdict(s) for s in self.steps]}

    def save(self, path: str) -> None:
        """Write the steps as JSON, atomically (activations are not written)."""

        atomic_write_json(path, self.to_dict(), sort_keys=False)


def record_counts(captures) -> list[dict]:
    """How many records each capture holds per name (to find the records of the next step)."""
    return [{n: len(v) for n, v in cap.records.items()} for cap in captures]


def close_step(captures, counts: list[dict], step: int, committed_end: int, written_end: int | None = None) -> None:
    """Tag the records written since ``counts`` with the step and their committed/rolled-back status.
    ``written_end``: one past the verify window's last real token (pending token and drafts); the verify
    records' positions from there on are the window's padding, cut from the records (no token was there)."""
    for cap, start in zip(captures, counts):
        for name, recs in cap.records.items():
            for r in recs[start.get(name, 0):]:
                if written_end is not None and r.tags.get("pass") == "verify" and int(r.positions.max()) >= written_end:
                    real = r.positions < written_end  # [n] the padding is causally invisible: drop it
                    r.positions, r.act = r.positions[real], r.act[:, real]
                r.tags["step"] = step
                r.tags["committed_end"] = committed_end
                lo, hi = int(r.positions.min()), int(r.positions.max())
                r.tags["status"] = ("committed" if hi < committed_end else
                                    "rolled_back" if lo >= committed_end else "partial")
