"""The one progress bar of the command line and the long jobs: on stderr, shown only after a second
(an error found at once prints no empty bar before it), removed when done."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


def progress_bar(desc: str, total: int | None = None, disable: bool = False, leave: bool = False):
    """A tqdm bar on stderr, silent for its first second.

    >>> bar = progress_bar("work", total=2, disable=True)  # --no-progress: nothing is drawn
    >>> bar.disable, bar.total
    (True, 2)
    """

    return tqdm(desc=desc, total=total, file=sys.stderr, disable=disable, dynamic_ncols=True, leave=leave, delay=1.0)


def resume_bar(bar, step: int) -> None:
    """Start ``bar`` at ``step`` (a resumed run), so its rate counts this run's steps only.

    >>> bar = progress_bar("train", total=10, disable=True)
    >>> resume_bar(bar, 4); bar.n
    4
    """
    bar.initial = bar.n = bar.last_print_n = step
    if bar.disable:  # --no-progress: a disabled bar has no clock to reset
        return
    bar.start_t = bar.last_print_t = time.time()  # the clock tqdm reads by default
    bar.refresh()


def advance_to(bar, n: int, total: int) -> None:
    """Move ``bar`` to ``n`` of ``total`` (a job that reports how far it is, not how much it just did).

    >>> import io; from tqdm import tqdm
    >>> bar = tqdm(file=io.StringIO()); advance_to(bar, 3, 10); (bar.n, bar.total)
    (3, 10)
    """
    bar.total = total
    bar.update(n - bar.n)
