"""The tested dependency ranges: declared once in code (`beliefscope.base.versions.TESTED`) and in
``pyproject.toml`` alike, and a release outside them refused at import, naming the range and the fix."""

import os
import tomllib

import pytest

from beliefscope.base import versions

from .helpers import ROOT


def test_the_code_and_pyproject_declare_the_same_ranges():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    for dist, (lo, hi) in versions.TESTED.items():
        assert f"{dist}>={lo},<{hi}" in deps, (dist, deps)


@pytest.mark.parametrize("found, ok", [("5.24.0", True), ("5.23.0", True), ("5.24.1.dev0", True), ("5.25.0", False),
                                       ("5.22.2", True), ("5.21.1", True), ("5.21.0", False), ("5.20.2", False),
                                       ("6.0.0", False), ("4.57.6", False)])
def test_a_release_outside_the_range_is_refused_naming_the_range(monkeypatch, found, ok):
    monkeypatch.delenv("BELIEFSCOPE_SKIP_VERSION_CHECK", raising=False)
    monkeypatch.setattr(versions, "version", lambda dist: found if dist == "transformers" else "4.3.0")
    lo, hi = versions.TESTED["transformers"]
    if ok:
        versions.check_versions()
        return
    with pytest.raises(ImportError, match=f"tested on transformers>={lo},<{hi} and this environment has transformers "
                                          f"{found}: install a tested release"):
        versions.check_versions()
    monkeypatch.setenv("BELIEFSCOPE_SKIP_VERSION_CHECK", "1")  # a compatibility run trying another release
    versions.check_versions()
