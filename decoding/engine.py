"""The one decode -> verify -> rollback loop. Every way this package decodes is a *policy* of it:

- ``decoding.loop.SpeculativeRun``: one row; plain decoding (no drafts), chains and token trees;
- ``decoding.scheduler.Scheduler``: deterministic requests among others (the fast path drafts, a
  fixed-shape or row-invariant forward verifies the rows that are due);
- ``models.thinking.prefill.SpeculativePrefill``: Thinking States' speculative prefill, one story
  or a batch (drafted chunks and thoughts, verified by T).

A step asks the policy for a proposal, runs one verify forward over it, and asks which part is accepted
and what the cache keeps of it (a `Keep`: every row's length, and the verify window's labels). The
engine alone then labels and cuts the cache (`settle`), and lets the policy commit the step to its own
bookkeeping. A step whose proposal is None verifies nothing (a scheduler round where no request is
due). EOS and the token budget are applied by ``decoding.core.clip_new``, traces and events by the
policy that keeps them.

>>> class Count:                      # a policy that proposes 0, 1, 2 and accepts every other one
...     def __init__(self): self.seen, self.kept = [], []
...     def done(self): return len(self.seen) == 3
...     def propose(self): return len(self.seen)
...     def verify(self, proposal): self.seen.append(proposal); return proposal
...     def accept(self, proposal, out): return out % 2 == 0
...     def keep(self, proposal, accepted): return None  # no cache
...     def commit(self, proposal, accepted): self.kept += [proposal] if accepted else []
>>> run(Count()).kept
[0, 2]
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from ..cache.keep import Keep, settle

__all__ = ["Keep", "Policy", "run", "settle"]


class Policy(Protocol):
    """What one decoding method decides; the loop in `run` decides nothing."""

    def done(self) -> bool:
        """No row has work left."""

    def propose(self) -> Any:
        """This step's drafts (and whatever verify needs), or None: nothing is verified this step."""

    def verify(self, proposal) -> Any:
        """One target forward over the proposal (the cache grows by its width)."""

    def accept(self, proposal, out) -> Any:
        """What the verifier keeps of the proposal, from the forward's output ``out``."""

    def keep(self, proposal, accepted) -> Keep | tuple[Keep, ...] | None:
        """What the caches keep of the step (None: nothing to cut); the engine applies each `Keep` to its
        ``cache``, or to ``policy.cache`` when it names none."""

    def commit(self, proposal, accepted) -> None:
        """Record the step in the policy's own bookkeeping (the cache already holds what it keeps)."""


P = TypeVar("P", bound=Policy)


def run(policy: P) -> P:
    """Step ``policy`` until it is done; returns it (its results are its own attributes)."""
    while not policy.done():
        proposal = policy.propose()
        if proposal is None:
            continue
        out = policy.verify(proposal)
        accepted = policy.accept(proposal, out)
        kept = policy.keep(proposal, accepted)
        for k in (() if kept is None else kept if isinstance(kept, tuple) else (kept,)):
            settle(policy.cache if k.cache is None else k.cache, k)
        policy.commit(proposal, accepted)
    return policy
