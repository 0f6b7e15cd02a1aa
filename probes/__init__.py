"""Activation store, linear probes with controls, and causal checks of beliefs.

>>> from beliefscope.probes import ActivationStore, fit_all_layers  # doctest: +SKIP
>>> probe = fit_all_layers(ActivationStore.open("acts/target"), "state", trainer="torch")  # doctest: +SKIP

See probes/README.md for the controls (and why a per-type control alone says nothing here).
"""

from beliefscope.probes.controls import control_labels, position_mask, prompt_folds
from beliefscope.probes.harvest import EMBED_HOOK, HarvestConfig, harvest, random_init_like
from beliefscope.probes.linear import LinearProbe, ProbeConfig, fit_all_layers
from beliefscope.probes.report import ProbeReport, ReportConfig, probe_report
from beliefscope.probes.steering import SteerConfig, steer_experiment
from beliefscope.probes.store import LABEL_NAMES, ActivationStore

__all__ = [
           "EMBED_HOOK",
           "LABEL_NAMES",
           "ActivationStore",
           "HarvestConfig",
           "LinearProbe",
           "ProbeConfig",
           "ProbeReport",
           "ReportConfig",
           "SteerConfig",
           "control_labels",
           "fit_all_layers",
           "harvest",
           "position_mask",
           "probe_report",
           "prompt_folds",
           "random_init_like",
           "steer_experiment",
]
