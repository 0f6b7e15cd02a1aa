"""Activation store, linear probes with controls, and causal checks of beliefs.

Usage (not run as a doctest: it needs stored activations, probes or a model)::

    from beliefscope.probes import ActivationStore, fit_all_layers
    probe = fit_all_layers(ActivationStore.open("acts/target"), "state", trainer="torch")

One hook as a scikit-learn estimator (cross-validation, grid search, pipelines):

Usage (not run as a doctest: it needs stored activations, probes or a model)::

    X, y, groups = hook_xy(ActivationStore.open("acts/target"), "blocks.3.hook_resid_post", "state")
    ProbeClassifier(C=1.0).fit(X, y).score(X, y)

See probes/README.md for the controls (and why a per-type control alone says nothing here).
"""

from .controls import control_labels, position_mask, prompt_folds
from .harvest import (
    EMBED_HOOK,
    HarvestConfig,
    HarvestRunConfig,
    harvest,
    random_init_like,
)
from .harvest import run as run_harvest
from .linear import LinearProbe, ProbeConfig, fit_all_layers
from .report import ProbeReport, ReportConfig, probe_report
from .steering import SteerConfig, steer_experiment
from .store import LABEL_NAMES, ActivationStore, from_hf_dataset, to_hf_dataset

__all__ = [
           "EMBED_HOOK",
           "HarvestRunConfig",
           "run_harvest",
           "from_hf_dataset",
           "to_hf_dataset",
           "LABEL_NAMES",
           "ActivationStore",
           "HarvestConfig",
           "LinearProbe",
           "ProbeClassifier",
           "ProbeConfig",
           "ProbeReport",
           "ReportConfig",
           "SteerConfig",
           "control_labels",
           "fit_all_layers",
           "harvest",
           "hook_xy",
           "position_mask",
           "probe_report",
           "prompt_folds",
           "random_init_like",
           "steer_experiment",
]


def __getattr__(name: str):
    """``ProbeClassifier`` and ``hook_xy`` load scikit-learn (about 1 s, with SciPy and pandas) on first use, not
    with the package: every command that reads or writes activations imports ``beliefscope.probes``, and only
    the scikit-learn interop needs it (probes.linear and probes.controls import it inside the function that
    fits with it, for the same reason)."""
    if name in ("ProbeClassifier", "hook_xy"):
        from . import estimator

        return getattr(estimator, name)
    raise AttributeError(f"module 'beliefscope.probes' has no attribute {name!r}")
