"""Line length (E501, 120 columns as set in pyproject.toml) and pyflakes errors (F) are enforced here,
with ruff, because CI runs only the test suite."""

import importlib.util
import subprocess
import sys

import pytest

from .helpers import ROOT


def test_ruff_line_length_and_pyflakes():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed: pip install ruff")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "E501,F", "--output-format", "concise",
                        ROOT], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, f"ruff check --select E501,F found problems:\n{r.stdout}{r.stderr}"
