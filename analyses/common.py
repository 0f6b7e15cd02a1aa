"""Shared pieces of the analyses: all-or-nothing outputs, probe/model compatibility, readouts, PNGs.

>>> check_writable_parent("/tmp/beliefscope-doctest/report")
'/tmp/beliefscope-doctest/report'
>>> with staged_output("/tmp/beliefscope-doctest/report") as tmp:
...     open(os.path.join(tmp, "a.txt"), "w").write("ok")
2
>>> open("/tmp/beliefscope-doctest/report/a.txt").read()
'ok'
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import signal
import sys
import tempfile

import numpy as np
import torch


# ----------------------------------------------------------------------------------- outputs
def check_writable_parent(out: str) -> str:
    """Make sure `out`'s parent folder exists (creating it) and is writable; return abspath(out).

    Fails with a ValueError naming the folder when it is a file, cannot be created or refuses writes.
    """
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    blocker = parent
    while blocker and not os.path.exists(blocker):
        blocker = os.path.dirname(blocker)
    if blocker and not os.path.isdir(blocker):
        raise ValueError(f"cannot write {out}: {blocker} is a file, not a folder; choose an output path "
                         "under a writable folder (e.g. --out runs/demo)")
    try:
        os.makedirs(parent, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".beliefscope-write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"cannot write into {parent} ({e.strerror or e}): choose an output path under a "
                         "writable folder (e.g. --out runs/demo)") from e
    if os.path.exists(out) and not os.path.isdir(out) and not os.path.isfile(out):
        raise ValueError(f"cannot write {out}: it exists and is neither a file nor a folder")
    return out


@contextlib.contextmanager
def staged_output(out: str):
    """Yield a temporary folder next to `out`; on success it is renamed to `out` (replacing an old
    one), on any error it is deleted, so a failed run never leaves a partial result behind."""
    out = check_writable_parent(out)
    if os.path.isfile(out):
        raise ValueError(f"--out {out} is an existing file; give a folder path")
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=os.path.dirname(out))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a report folder gets the usual permissions
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _raise_on_sigterm():
    """Turn SIGTERM into SystemExit (so the temporary folder is removed); returns the old handler."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, default=_json_default) + "\n").encode())


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def fig_png(fig, dpi: int = 110) -> bytes:
    """PNG bytes of a matplotlib figure (the figure is closed afterwards)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def save_fig(fig, path: str, dpi: int = 110) -> bytes:
    """Save a figure atomically as PNG; returns the bytes (for inlining in the report)."""
    data = fig_png(fig, dpi)
    atomic_write_bytes(path, data)
    return data


def png_data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def sibling(path: str, suffix: str) -> str:
    """`runs/x.png` + "-line" -> `runs/x-line.png`."""
    stem, ext = os.path.splitext(path)
    return f"{stem}{suffix}{ext or '.png'}"


def progress_bar(desc: str, total: int | None = None, disable: bool = False):
    from tqdm import tqdm

    return tqdm(desc=desc, total=total, file=sys.stderr, disable=disable, dynamic_ncols=True, leave=False)


# ----------------------------------------------------------------------------------- probes
def load_probe(folder: str):
    """Load a `LinearProbe` saved by `beliefscope probe --out` (clear error if missing)."""
    from probes.linear import LinearProbe

    if not os.path.isdir(folder):
        raise FileNotFoundError(f"probe folder {folder} does not exist: fit one with "
                                f"`beliefscope probe --acts ACTS --label state --out {folder}`")
    return LinearProbe.load(folder)


def check_probe_matches(probe, bridge, model_name: str = "") -> None:
    """Refuse a probe that was trained on another model: width, hooks and checkpoint hash must match."""
    from probes.harvest import checkpoint_hash

    trained_on = probe.meta.get("model", "?")
    if probe.d_model != bridge.cfg.d_model:
        raise ValueError(f"the probe was trained on {trained_on} (d_model {probe.d_model}) but model "
                         f"{model_name or '?'} has d_model {bridge.cfg.d_model}: fit a probe on this model's "
                         "activations (beliefscope harvest --model M ..., then beliefscope probe)")
    missing = [h for h in probe.hooks if h not in bridge.hook_dict]
    if missing:
        raise ValueError(f"the probe was trained on {trained_on} and reads hooks {missing} that model "
                         f"{model_name or '?'} lacks: fit a probe on this model's activations")
    want = (probe.meta.get("harvest_config") or {}).get("checkpoint_hash")
    if want:
        have = checkpoint_hash(bridge)
        if have.split("-")[0] != want.split("-")[0] and "-" in have and "-" not in want:
            raise ValueError(f"the probe at hand was harvested by an older beliefscope (checkpoint hash {want}, an "
                             "older hash scheme): re-run beliefscope harvest and beliefscope probe for this model")
        if have != want:
            raise ValueError(f"the probe was trained on {trained_on} (checkpoint hash {want}) but model "
                             f"{model_name or '?'} has checkpoint hash {have}: it is another model (or other "
                             "weights); fit a probe on this model's activations")


def probe_state_names(probe, default=("heads", "tails")) -> list[str]:
    return list(probe.meta.get("state_names") or default)


def best_probe_layer(probe, probes_dir: str | None = None) -> int:
    """Best layer from the probe folder's report.json (written by `beliefscope probe --out`), else the
    deepest probed block."""
    from probes.report import layer_index

    if probes_dir and os.path.exists(os.path.join(probes_dir, "report.json")):
        with open(os.path.join(probes_dir, "report.json")) as f:
            rep = json.load(f)
        if rep.get("best_layer") is not None:
            return int(rep["best_layer"])
    return max(layer_index(h) for h in probe.hooks)


def probe_hooks_by_layer(probe) -> list[tuple[int, str]]:
    """(block index, hook) for the probe's hooks, embedding (-1) first, in layer order."""
    from probes.report import layer_index

    return sorted(((layer_index(h), h) for h in probe.hooks), key=lambda t: t[0])


@torch.no_grad()
def probe_readout(bridge, probe, ids, hooks: list[str] | None = None) -> np.ndarray:
    """P(class 0) of the probe at every position: ``[len(hooks), T]`` for token ids ``[T]``."""
    from hooks import capture

    hooks = hooks or [h for _, h in probe_hooks_by_layer(probe)]
    x = torch.as_tensor(np.asarray(ids), dtype=torch.long).reshape(1, -1)  # [1, T]
    with capture(bridge, hooks) as cap:
        bridge(x, return_type=None)
    out = [torch.softmax(probe.logits(cap.records[h][0].act[0].float(), h), -1)[:, 0].numpy() for h in hooks]
    return np.stack(out)  # [L, T]


def token_strings(tok, ids) -> list[str]:
    """Readable per-token labels for an x axis ("␣" for a bare space)."""
    out = []
    for i in np.asarray(ids).tolist():
        s = tok.decode([i])
        s = s.strip() or ("␣" if s else tok.convert_ids_to_tokens(i))
        out.append(s if len(s) <= 12 else s[:11] + "…")
    return out
