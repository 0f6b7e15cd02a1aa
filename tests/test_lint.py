"""Line length (E501, 120 columns as set in pyproject.toml), pyflakes errors (F) and sorted import blocks (I:
standard library, third party, beliefscope, then relative) are enforced here, with ruff, because CI runs only the
test suite."""

import importlib.util
import subprocess
import sys

import pytest

from .helpers import ROOT


def test_ruff_line_length_pyflakes_and_import_blocks():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed: pip install ruff")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "E501,F,I", "--output-format", "concise",
                        ROOT], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, f"ruff check --select E501,F,I found problems:\n{r.stdout}{r.stderr}"
