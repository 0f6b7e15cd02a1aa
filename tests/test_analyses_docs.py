"""The docstring examples of analyses/ run (examples that need shipped models are marked SKIP)."""

import doctest
import importlib

import pytest

MODULES = ["beliefscope.analyses.common", "beliefscope.analyses.plots", "beliefscope.analyses.report",
           "beliefscope.analyses.readings",
           "beliefscope.analyses.beliefs", "beliefscope.analyses.forced", "beliefscope.analyses.spec_trace",
           "beliefscope.analyses.determinism", "beliefscope.analyses.demo", "beliefscope.analyses.commands"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    res = doctest.testmod(module, optionflags=doctest.ELLIPSIS, extraglobs={"os": __import__("os")})
    assert res.failed == 0
