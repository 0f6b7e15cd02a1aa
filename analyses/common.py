"""Shared pieces of the analyses: JSON and PNG outputs, probe/model compatibility, readouts.

Files are written through `beliefscope.base.files` (its helpers are re-exported here).
"""

from __future__ import annotations

import base64
import io
import json
import os

import numpy as np
import torch

from beliefscope.base.files import (  # noqa: F401  (re-exported for the analyses)
    atomic_write_bytes,
    atomic_write_json,
    check_writable_parent,
    sha256_file,
    staged_output,
)


# ----------------------------------------------------------------------------------- outputs
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
    import matplotlib.pyplot as plt  # deferred: pyplot loads a backend: only a figure asks for it

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


def model_folders(models, entries, flag: str) -> dict:
    """``{model: folder}`` of a per-model flag (``--tuned``, ``--interchange``): ``MODEL=FOLDER`` entries (any
    subset of ``models``), or one folder per model in order ("-" or "" for none); checked before any work.

    >>> model_folders(("a", "b"), ["b=x"], "--tuned"), model_folders(("a", "b"), ["x", "-"], "--tuned")
    ({'b': 'x'}, {'a': 'x'})
    """
    entries = [str(f) for f in entries or ()]
    if entries and all("=" in f for f in entries):
        pairs = dict(f.split("=", 1) for f in entries)
        unknown = sorted(set(pairs) - set(models))
        if unknown:
            raise ValueError(f"{flag} names {unknown}, not among --models {list(models)}: use MODEL=FOLDER with a "
                             "model of --models")
    else:
        if entries and len(entries) != len(models):
            raise ValueError(f"{flag} gives {len(entries)} folders for {len(models)} models {list(models)}: give "
                             "one per model in order ('-' for none), or MODEL=FOLDER entries")
        pairs = dict(zip(models, entries))
    return {m: f for m, f in pairs.items() if f and f != "-"}


def sibling(path: str, suffix: str) -> str:
    """`runs/x.png` + "-line" -> `runs/x-line.png`."""
    stem, ext = os.path.splitext(path)
    return f"{stem}{suffix}{ext or '.png'}"


from beliefscope.base.progress import progress_bar  # noqa: E402,F401  (re-exported for the analyses)

from ..hooks import capture
from ..probes.crossfit import CrossFitted
from ..probes.harvest import checkpoint_hash
from ..probes.linear import LinearProbe
from ..probes.report import layer_index


# ----------------------------------------------------------------------------------- probes
def load_probe(folder: str):
    """Load a `LinearProbe` saved by `beliefscope probe --out` (clear error if missing)."""

    if not os.path.isdir(folder):
        raise FileNotFoundError(f"probe folder {folder} does not exist: fit one with "
                                f"`beliefscope probe --acts ACTS --label state --out {folder}`")
    return LinearProbe.load(folder)


def check_probe_matches(probe, bridge, model_name: str = "") -> None:
    """Refuse a probe that was trained on another model: width, hooks and checkpoint hash must match."""

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
        if have.split("-")[0] != want.split("-")[0]:
            raise ValueError(f"the probe at hand was harvested by an older beliefscope (checkpoint hash {want}, an "
                             "older hash scheme): re-run beliefscope harvest and beliefscope probe for this model")
        if have != want:
            raise ValueError(f"the probe was trained on {trained_on} (checkpoint hash {want}) but model "
                             f"{model_name or '?'} has checkpoint hash {have}: it is another model (or other "
                             "weights); fit a probe on this model's activations")


def check_probe_rendering(probe, rendering: str) -> None:
    """Refuse to read a probe on prompts of another rendering than the one it was harvested on."""
    trained = (probe.meta.get("harvest_config") or {}).get("rendering")
    if trained and trained != rendering:
        raise ValueError(f"the probe was harvested on the {trained!r} rendering but these prompts use {rendering!r}: "
                         f"pass --rendering {trained}, or harvest and fit a probe on {rendering!r} prompts")


def probe_state_names(probe, default=("heads", "tails")) -> list[str]:
    return list(probe.meta.get("state_names") or default)


def best_probe_layer(probe, probes_dir: str | None = None) -> int:
    """Best layer from the probe folder's report.json (written by `beliefscope probe --out`), else the
    deepest probed block."""

    if probes_dir and os.path.exists(os.path.join(probes_dir, "report.json")):
        with open(os.path.join(probes_dir, "report.json")) as f:
            rep = json.load(f)
        if rep.get("best_layer") is not None:
            return int(rep["best_layer"])
    return max(layer_index(h) for h in probe.hooks)


def probe_hooks_by_layer(probe) -> list[tuple[int, str]]:
    """(block index, hook) for the probe's hooks, embedding (-1) first, in layer order."""

    return sorted(((layer_index(h), h) for h in probe.hooks), key=lambda t: t[0])


def probe_for_record(probe, folder: str, ex, crossfit=None):
    """(the probe to read example `ex` with, how: "out-of-fold", "held-out", or None where it cannot be known).

    A record of your data, or a task's story, is read by the fold probe that did not see it where the probe was
    fitted on it (`probes.crossfit`: records by their text, stories by their events), and by the final probe
    otherwise. A folder without cross-fitted probes (an older `probe --out`) is refused for records, since its
    final probe would score the records it was fitted on; for a task's story it is read as it is (None)."""

    crossfit = crossfit or (CrossFitted.load(folder, probe) if folder else None)
    if crossfit is None and "text" not in ex.meta:  # a task's story, and a probe folder of an older beliefscope
        return probe, None
    if crossfit is None:
        raise ValueError(f"{folder} holds no cross-fitted probes (fitted by an older beliefscope, or not by `probe "
                         "--out`): its final probe would score the records it was fitted on; fit it again with "
                         f"`beliefscope probe --acts ACTS --out {folder}`")
    return crossfit.for_example(ex)


def check_probe_states(probe, ex) -> None:
    """Refuse a probe read on a text whose truth has other states, or another label, than it was fitted on
    (its accuracy would compare unrelated class indices)."""
    names = list(ex.meta.get("classes") or ex.state_names)
    have = probe.meta.get("state_names")
    if (have and list(have) != names) or probe.n_classes != len(names):
        raise ValueError(f"the probe reads {probe.n_classes} states {have} but this text's truth has states {names}: "
                         "read it on text of the probe's own label, or fit a probe on this label")
    label, want = probe.meta.get("label"), ex.meta.get("label")
    if ex.task == "data" and want and label not in (None, "state", want):
        raise ValueError(f"the probe was fitted on label {label!r}, but the truth given is label {want!r}: "
                         f"pass a probe fitted with --label {want}")


@torch.no_grad()
def probe_distribution(bridge, probe, ids, hooks: list[str] | None = None) -> np.ndarray:
    """The probe's distribution over its classes at every position: ``[len(hooks), T, K]`` for ids ``[T]``."""

    hooks = hooks or [h for _, h in probe_hooks_by_layer(probe)]
    x = torch.as_tensor(np.asarray(ids), dtype=torch.long).reshape(1, -1)  # [1, T]
    with capture(bridge, hooks) as cap:
        bridge(x, return_type=None)
    out = [torch.softmax(probe.logits(cap.records[h][0].act[0].float().cpu(), h), -1).numpy() for h in hooks]
    return np.stack(out)  # [L, T, K]


def probe_readout(bridge, probe, ids, hooks: list[str] | None = None) -> np.ndarray:
    """P(class 0) of the probe at every position: ``[len(hooks), T]`` for token ids ``[T]``."""
    return probe_distribution(bridge, probe, ids, hooks)[..., 0]


def token_strings(tok, ids) -> list[str]:
    """Readable per-token labels for an x axis ("␣" for a bare space)."""
    out = []
    for i in np.asarray(ids).tolist():
        s = tok.decode([i])
        s = s.strip() or ("␣" if s else tok.convert_ids_to_tokens(i))
        out.append(s if len(s) <= 12 else s[:11] + "…")
    return out
