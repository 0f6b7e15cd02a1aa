"""Former home of the drafters' tree proposals; each now lives beside its drafter's chain proposal
(``decoding.ngram``, ``decoding.model_drafters``, ``decoding.datastore``). These names stay importable.

>>> from beliefscope.decoding.config import TreeConfig
>>> lookup_tree(torch.tensor([1, 2, 3, 9, 1, 2, 4, 5, 1, 2]), 3, TreeConfig(nodes=4, depth=2)).tokens
[4, 5, 3, 9]
"""

import torch  # noqa: F401 (the example uses it)

from .datastore import store_candidates
from .model_drafters import model_propose_tree
from .ngram import lookup_tree
from .tree import layout, one_hot

__all__ = ["layout", "lookup_tree", "model_propose_tree", "one_hot", "store_candidates"]
