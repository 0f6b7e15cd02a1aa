"""The one progress bar of the command line and the long jobs: on stderr, shown only after a second
(an error found at once prints no empty bar before it), removed when done."""

from __future__ import annotations

import sys


def progress_bar(desc: str, total: int | None = None, disable: bool = False, leave: bool = False):
    """A tqdm bar on stderr, silent for its first second.

    >>> bar = progress_bar("work", total=2, disable=True)
    >>> bar.update(2); bar.n
    2
    """
    from tqdm import tqdm

    return tqdm(desc=desc, total=total, file=sys.stderr, disable=disable, dynamic_ncols=True, leave=leave, delay=1.0)
