"""The trace figure of a tree step: node colours come from the cache's own provenance."""

import pytest

from beliefscope.cache import Provenance
from beliefscope.decoding import ModelDrafter, TreeConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tree_trace_colours_from_cache(toy, heldout_prompts):
    from matplotlib.colors import to_hex

    from beliefscope.analyses.plots import PROVENANCE_COLORS
    from beliefscope.analyses.spec_trace import tree_trace

    target, draft, tok = toy
    for p in heldout_prompts[:20]:
        fig, s = tree_trace(target, tok, ModelDrafter(draft), p, TreeConfig(nodes=8, depth=4, branch=3, min_share=0.0))
        if s["path_leaves_first_branch"]:
            break
    assert s["path_leaves_first_branch"]  # a step whose accepted path sits in a side branch
    on_path = set(s["path"])
    assert [c == Provenance.ACCEPTED for c in s["codes"]] == [i in on_path for i in range(s["nodes"])]
    assert all(c == Provenance.REJECTED for i, c in enumerate(s["codes"]) if i not in on_path)
    node_patches = fig.axes[0].patches[1:]  # the first patch is the pending token
    assert [to_hex(x.get_facecolor()) for x in node_patches] == [PROVENANCE_COLORS[c] for c in s["codes"]]
