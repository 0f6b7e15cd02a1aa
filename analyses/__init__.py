"""Analyses over a model and its probes: belief trajectories, forced answers, causal tests, the lens, the viewer.

Each name below is imported on first use (``from beliefscope.analyses import trajectory``), so importing the
package loads no model code. ``interchange`` and ``erasure`` are ``bs.interchange`` and ``bs.erasure``: here those
names are their modules.
"""

from __future__ import annotations

import importlib

# public name -> (module, attribute)
_API = {
    "BeliefTrajectory": ("beliefscope.analyses.beliefs", "BeliefTrajectory"),
    "trajectory": ("beliefscope.analyses.beliefs", "trajectory"),
    "figures": ("beliefscope.analyses.beliefs", "figures"),
    "forced_answers": ("beliefscope.analyses.forced", "forced_answers"),
    "lens_answers": ("beliefscope.analyses.lens_readable", "lens_answers"),
    "Site": ("beliefscope.analyses.interchange", "Site"),
    "InterchangeResult": ("beliefscope.analyses.interchange", "InterchangeResult"),
    "sites": ("beliefscope.analyses.interchange", "sites"),
    "Pair": ("beliefscope.analyses.pairs", "Pair"),
    "task_pairs": ("beliefscope.analyses.pairs", "task_pairs"),
    "record_pairs": ("beliefscope.analyses.pairs", "record_pairs"),
    "DasConfig": ("beliefscope.analyses.das", "DasConfig"),
    "learn_das": ("beliefscope.analyses.das", "learn_das"),
    "ErasureConfig": ("beliefscope.analyses.erasure", "ErasureConfig"),
    "ViewConfig": ("beliefscope.analyses.view", "ViewConfig"),
    "write_view": ("beliefscope.analyses.view", "main"),
    "page_data": ("beliefscope.analyses.view_page", "page_data"),
}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'beliefscope.analyses' has no attribute {name!r}")
    module, attr = _API[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_API])
