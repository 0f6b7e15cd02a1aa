"""The drafter interface: a cheap path that proposes tokens, as a chain or as a token tree, for the
target to verify (implementations: ``decoding.model_drafters``, ``decoding.ngram``, ``decoding.datastore``).

>>> class Repeat(Drafter):  # propose the pending token again, n times
...     def propose(self, ids, n, cfg):
...         return ids[-1:].repeat(n), None
>>> Repeat().propose_tree(torch.tensor([3, 4]), TreeConfig(nodes=2, depth=5), SpecConfig()).tokens
[4, 4]
"""

from __future__ import annotations

import torch

from ..cache.keep import Keep
from .config import SpecConfig, TreeConfig
from .tree import TokenTree


class Drafter:
    """Interface. ``ids`` are all committed tokens (prompt included); the last one is pending."""

    name = "drafter"
    forwards = 0  # model forwards run so far (for the cost ratio c)

    def start(self, target, ids: torch.Tensor, cache, cfg: SpecConfig) -> None:
        """Called once after the target's prefill (``cache`` holds ``ids[:-1]``)."""

    def propose(self, ids: torch.Tensor, n: int, cfg: SpecConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to ``n`` draft tokens ``[k]`` and, when sampling, their draft distributions ``[k, vocab]``."""
        raise NotImplementedError

    def propose_tree(self, ids: torch.Tensor, shape: TreeConfig, cfg: SpecConfig) -> TokenTree:
        """A ``TokenTree`` of drafts within ``shape``. Drafters that cannot branch give their chain,
        ``min(shape.depth, shape.nodes)`` long."""
        drafts, q = self.propose(ids, min(shape.depth, shape.nodes), cfg)
        return TokenTree.chain(drafts.tolist(), q)

    def keep(self, committed: torch.Tensor) -> Keep | None:
        """What the drafter's own cache keeps once ``committed`` ``[n]`` (every committed token, prompt included,
        the pending one last) stands, or None (no cache of its own). The engine settles it with the target's."""
        return None

    def sync(self, n_committed: int) -> None:
        """Called after each verify, once the caches are kept: ``n_committed`` tokens are now committed (prompt
        included)."""
