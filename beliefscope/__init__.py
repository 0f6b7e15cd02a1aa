"""beliefscope: read what a language model believes while it generates.

``import beliefscope as bs`` gives the researcher API; each name is imported on first use, so
``import beliefscope`` stays cheap. The subpackages are ``bs.tasks``, ``bs.models``, ``bs.hooks``,
``bs.cache``, ``bs.decoding``, ``bs.probes`` and ``bs.analyses``.

>>> import beliefscope as bs
>>> ex = bs.get_task("coinflip").example(seed=0, n_events=2)
>>> ex.states_after_events[-1] in ("heads", "tails")
True
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

__version__ = "0.2.0"

from beliefscope.base.versions import check_versions  # noqa: E402

check_versions()  # a transformers or TransformerLens release outside the tested range fails here, naming the range

# In a source checkout the subpackages are the folders beside this one (the build maps them for
# the wheel); `benchmarks`, which is never installed, is reached the same way.
_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "benchmarks" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))

# public name -> module that defines it
_API = {
    "get_task": "beliefscope.tasks",
    "load_data": "beliefscope.tasks",
    "load_model": "beliefscope.models",
    "load_hf": "beliefscope.models",
    "ModelLoadError": "beliefscope.models",
    "checkpoint_path": "beliefscope.models",
    "KVCache": "beliefscope.cache",
    "Provenance": "beliefscope.cache",
    "capture": "beliefscope.hooks",
    "steer": "beliefscope.hooks",
    "hook_names": "beliefscope.hooks",
    "to_activation_cache": "beliefscope.hooks",
    "speculative_generate": "beliefscope.decoding",
    "generate": "beliefscope.decoding",
    "make_drafter": "beliefscope.decoding",
    "SpecConfig": "beliefscope.decoding",
    "Scheduler": "beliefscope.decoding",
    "SchedulerConfig": "beliefscope.decoding",
    "harvest": "beliefscope.probes",
    "ActivationStore": "beliefscope.probes",
    "fit_all_layers": "beliefscope.probes",
    "LinearProbe": "beliefscope.probes",
    "ProbeClassifier": "beliefscope.probes",
    "hook_xy": "beliefscope.probes",
    "probe_report": "beliefscope.probes",
    "ReportConfig": "beliefscope.probes",
    "logit_lens": "beliefscope.probes.lens",
    "TunedLens": "beliefscope.probes.tuned_lens",
    "train_tuned_lens": "beliefscope.probes.tuned_lens",
    "forced_answers": "beliefscope.analyses.forced",
    "trajectory": "beliefscope.analyses.beliefs",
    "interchange": "beliefscope.analyses.interchange",
    "sites": "beliefscope.analyses.interchange",
    "Site": "beliefscope.analyses.interchange",
    "Pair": "beliefscope.analyses.pairs",
    "task_pairs": "beliefscope.analyses.pairs",
    "record_pairs": "beliefscope.analyses.pairs",
    "learn_das": "beliefscope.analyses.das",
    "DasConfig": "beliefscope.analyses.das",
    "erasure": "beliefscope.analyses.erasure",
    "ErasureConfig": "beliefscope.analyses.erasure",
}
_SUBPACKAGES = ("tasks", "models", "hooks", "cache", "decoding", "probes", "analyses")

__all__ = sorted([*_API, *_SUBPACKAGES])


if TYPE_CHECKING:  # what `_API` maps, spelled out for type checkers and "go to definition"
    from beliefscope import analyses, cache, decoding, hooks, models, probes, tasks  # noqa: F401
    from beliefscope.analyses.beliefs import trajectory  # noqa: F401
    from beliefscope.analyses.das import DasConfig, learn_das  # noqa: F401
    from beliefscope.analyses.erasure import ErasureConfig, erasure  # noqa: F401
    from beliefscope.analyses.interchange import Site, interchange, sites  # noqa: F401
    from beliefscope.analyses.pairs import Pair, record_pairs, task_pairs  # noqa: F401
    from beliefscope.analyses.forced import forced_answers  # noqa: F401
    from beliefscope.probes.lens import logit_lens  # noqa: F401
    from beliefscope.probes.tuned_lens import TunedLens, train_tuned_lens  # noqa: F401
    from beliefscope.tasks import load_data  # noqa: F401
    from beliefscope.cache import KVCache, Provenance  # noqa: F401
    from beliefscope.decoding import (  # noqa: F401
        Scheduler,
        SchedulerConfig,
        SpecConfig,
        generate,
        make_drafter,
        speculative_generate,
    )
    from beliefscope.hooks import capture, hook_names, steer, to_activation_cache  # noqa: F401
    from beliefscope.models import ModelLoadError, checkpoint_path, load_hf, load_model  # noqa: F401
    from beliefscope.probes import (  # noqa: F401
        ActivationStore,
        LinearProbe,
        ProbeClassifier,
        ReportConfig,
        fit_all_layers,
        harvest,
        hook_xy,
        probe_report,
    )
    from beliefscope.tasks import get_task  # noqa: F401


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"beliefscope.{name}")
    else:
        raise AttributeError(f"module 'beliefscope' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return __all__
