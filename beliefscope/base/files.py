"""Writing outputs all at once or not at all: the one place the project writes files atomically.

Every package uses these helpers (this module imports nothing from the project), so a crash or a
Ctrl-C never leaves a half-written file or folder behind.

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> atomic_write_json(os.path.join(folder, "a.json"), {"x": 1})
>>> open(os.path.join(folder, "a.json")).read()
'{\\n "x": 1\\n}'
>>> with staged_output(os.path.join(folder, "report")) as tmp:
...     atomic_write_text(os.path.join(tmp, "a.txt"), "ok")
>>> open(os.path.join(folder, "report", "a.txt")).read()
'ok'
>>> check_writable_parent(os.path.join(folder, "a.json", "out"))  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
ValueError: cannot write .../a.json/out: .../a.json is a file, not a folder; choose an output path under
a writable folder
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_save(path: str, write: Callable[[str], None], *, fsync: bool = True) -> None:
    """Call ``write(tmp)`` on a temporary path beside `path`, then rename it over `path`.

    The file gets the usual permissions (0666 minus the umask), not mkstemp's 0600."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    os.close(fd)
    try:
        write(tmp)
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes, *, fsync: bool = True) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`."""

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)

    atomic_save(path, write, fsync=fsync)


def atomic_write_text(path: str, text: str, *, fsync: bool = True) -> None:
    """`atomic_write_bytes` for text (UTF-8)."""
    atomic_write_bytes(path, text.encode(), fsync=fsync)


def atomic_write_json(path: str, obj, indent: int | None = 1, *, sort_keys: bool = True,
                      default=None, fsync: bool = True) -> None:
    """Write JSON atomically. ``indent=None`` writes one compact line through the C encoder (several
    times faster than indented output): use it for files rewritten often, such as journals."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default), fsync=fsync)


def sha256_file(path: str) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_writable_parent(out: str) -> str:
    """Make sure `out` can be written: its nearest existing ancestor is a folder we may write into.
    Creates nothing (the writers create missing folders when they write); returns abspath(out).

    Fails with a ValueError naming the folder when it is a file or refuses writes (example: the
    module docstring).
    """
    out = os.path.abspath(out)
    blocker = os.path.dirname(out)
    while blocker and not os.path.exists(blocker):
        blocker = os.path.dirname(blocker)
    if blocker and not os.path.isdir(blocker):
        raise ValueError(f"cannot write {out}: {blocker} is a file, not a folder; choose an output path "
                         "under a writable folder")
    if blocker and not os.access(blocker, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write into {blocker} (permission denied): choose an output path under a "
                         "writable folder")
    if os.path.exists(out) and not os.path.isdir(out) and not os.path.isfile(out):
        raise ValueError(f"cannot write {out}: it exists and is neither a file nor a folder")
    return out


@contextlib.contextmanager
def staged_output(out: str):
    """Yield a temporary folder next to `out`; on success it is renamed to `out` (replacing an old
    one), on any error it is deleted, so a failed run never leaves a partial result behind."""
    out = check_writable_parent(out)
    if os.path.isfile(out):
        raise ValueError(f"output {out} is an existing file; give a folder path")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=os.path.dirname(out))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; an output folder gets the usual permissions
    previous = _raise_on_sigterm()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    old = None
    if os.path.exists(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.replace(out, os.path.join(old, "prev"))
    os.replace(tmp, out)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _raise_on_sigterm():
    """Turn SIGTERM into SystemExit (so the temporary folder is removed); returns the old handler."""

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)
