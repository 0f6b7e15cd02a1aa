"""Every flag of a command that sets a field of the command's config class has that field's
default (a default copied by hand into a flag drifts from its config class: `determinism --out`
meant "numbers only" while `DeterminismConfig.out` wrote determinism.png), and `--help` shows it."""

import argparse
import dataclasses

import pytest

from beliefscope.analyses.beliefs import BeliefsConfig
from beliefscope.analyses.demo import DemoConfig
from beliefscope.analyses.determinism import DeterminismConfig
from beliefscope.analyses.forced import ForcedConfig
from beliefscope.analyses.instrument import InstrumentConfig
from beliefscope.analyses.spec_trace import TraceConfig
from beliefscope.cli import build_parser
from beliefscope.decoding.config import GenerateConfig
from beliefscope.decoding.store_build import DatastoreConfig
from beliefscope.models.evaluate import EvalConfig
from beliefscope.probes.harvest import HarvestRunConfig
from beliefscope.probes.report import ProbeCommandConfig
from beliefscope.probes.steering import SteerCommandConfig

CONFIGS = {"beliefs": BeliefsConfig, "forced": ForcedConfig, "instrument": InstrumentConfig,
           "determinism": DeterminismConfig, "demo": DemoConfig, "trace": TraceConfig, "steer": SteerCommandConfig,
           "harvest": HarvestRunConfig, "probe": ProbeCommandConfig, "datastore": DatastoreConfig,
           "generate": GenerateConfig,
           "eval": EvalConfig}


def _norm(v):
    """The same value as a flag spells it: a tuple as its comma-separated list, '' as None, numbers as floats."""
    if isinstance(v, (tuple, list)):
        v = ",".join(map(str, v))
    if v == "":
        return None
    try:
        return float(v) if not isinstance(v, bool) and v is not None else v
    except (TypeError, ValueError):
        return v


def _commands():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


@pytest.mark.parametrize("command", sorted(CONFIGS))
def test_flag_defaults_are_the_config_defaults(command):
    parser = _commands()[command]
    defaults = {f.name: f.default for f in dataclasses.fields(CONFIGS[command]) if f.default is not dataclasses.MISSING}
    checked = [a for a in parser._actions if a.dest in defaults and a.option_strings and not a.required]
    assert checked, f"{command}: no flag sets a field of {CONFIGS[command].__name__}"
    wrong = {a.dest: (a.default, defaults[a.dest]) for a in checked if _norm(a.default) != _norm(defaults[a.dest])}
    assert not wrong, f"{command}: flag default != {CONFIGS[command].__name__} default: {wrong}"


@pytest.mark.parametrize("command", sorted(_commands()))
def test_help_shows_every_default(command):
    parser = _commands()[command]
    text = " ".join(parser.format_help().split())
    for a in parser._actions:
        if a.option_strings and a.default not in (None, False, "", argparse.SUPPRESS) and a.help != argparse.SUPPRESS:
            assert f"(default: {a.default})" in text or "default" in (a.help or "").lower(), (command, a.dest)
