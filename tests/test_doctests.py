"""Every docstring example of the installed package runs (the einops convention: examples are tests)."""

import doctest
import importlib
import pkgutil

import pytest

SUBPACKAGES = ["base", "tasks", "models", "hooks", "cache", "decoding", "probes", "analyses"]


def _modules() -> list[str]:
    top = importlib.import_module("beliefscope")  # its own modules, then each subpackage's, nested ones too
    names = ["beliefscope"] + [m.name for m in pkgutil.iter_modules(top.__path__, prefix="beliefscope.")
                               if not m.ispkg and m.name != "beliefscope.__main__"]
    for sub in SUBPACKAGES:
        pkg = importlib.import_module(f"beliefscope.{sub}")
        names.append(pkg.__name__)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg.__name__}.")]
    return names


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for t in finder.find(module, name):
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (output above)"
