"""The dependency ranges beliefscope is tested on, checked when it is imported.

beliefscope reads and hooks other libraries' models (transformers' causal LMs, TransformerLens's bridge), so a
release outside the tested range can change what a forward computes without an error. `check_versions` refuses
one at import, naming the range and the fix; ``BELIEFSCOPE_SKIP_VERSION_CHECK=1`` lets a compatibility run try
another release on purpose. ``pyproject.toml`` declares the same ranges (tests/test_versions.py checks both).
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

# distribution -> (lowest tested release, first release past the range); compared by release numbers
TESTED = {"transformers": ("5.21.1", "5.25"), "transformer-lens": ("4.3", "4.4")}


def _release(text: str) -> tuple[int, ...]:
    """The leading release numbers of a version string: ``"5.24.0.dev0"`` -> ``(5, 24, 0)``."""
    out = []
    for part in text.split("+")[0].split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits or digits != part[: len(digits)]:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out)


def out_of_range(dist: str, found: str) -> str | None:
    """Why ``found`` of ``dist`` is outside its tested range (None: inside).

    >>> out_of_range("transformers", "5.24.0") is None, out_of_range("transformers", "5.25.1")[:40]
    (True, 'beliefscope is tested on transformers>=5')
    """
    lo, hi = TESTED[dist]
    if _release(lo) <= _release(found) < _release(hi):
        return None
    return (f"beliefscope is tested on {dist}>={lo},<{hi} and this environment has {dist} {found}: install a tested "
            f"release (pip install '{dist}>={lo},<{hi}'), or set BELIEFSCOPE_SKIP_VERSION_CHECK=1 to try this one "
            "at your own risk")


def check_versions() -> None:
    """Raise ImportError if an installed dependency is outside its tested range (see the module)."""
    if os.environ.get("BELIEFSCOPE_SKIP_VERSION_CHECK") == "1":
        return
    for dist in TESTED:
        try:
            found = version(dist)
        except PackageNotFoundError:
            continue  # pip reports a missing dependency; the import that needs it fails by name
        why = out_of_range(dist, found)
        if why:
            raise ImportError(why)
