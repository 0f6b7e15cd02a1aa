"""Sharded, checksummed, memory-mapped store of activations with per-token labels.

Layout of a store folder::

    manifest.json                   config + config hash, model, hooks, shapes, labels, shards
    journal-rank{r}.json            shards finished by rank r (rewritten atomically after each)
    shard-r{r}-{k:05d}.safetensors  rows = tokens; "act/<hook>" [rows, d] and one int32 array
                                    per label name [rows]

Every shard holds whole prompts, is written to a temporary file and renamed, and is then
recorded (with its sha256) in its rank's journal. A run killed at any point resumes from the
journals: shards that were never journaled are rewritten, so no row is lost or duplicated.
When every prompt is done, the journals are merged into the manifest (``complete: true``).

Usage (not run as a doctest: it needs stored activations, probes or a model)::

    store = ActivationStore.open("acts/target")
    X = store.load_hook("blocks.2.hook_resid_post")
    y = store.load_label("state")
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from beliefscope.base.files import atomic_save, atomic_write_json, sha256_file

FORMAT = "beliefscope-activations/1"
MANIFEST = "manifest.json"
# Per-token labels stored with every row (int32). `prompt_id` indexes the harvested examples,
# `n_events` is the prompt's total number of events, `template_split` is 0 for train templates
# and names, 1 for held-out ones (natural rendering only).
LABEL_NAMES = ("state", "parity", "events_so_far", "is_event_boundary", "token_id", "position",
               "prompt_id", "n_events", "in_prompt", "in_answer", "template_split")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def config_hash(config: dict) -> str:
    """Stable short hash of a JSON-able config (sorted keys)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class ShardInfo:
    """One shard as recorded in a journal or the manifest."""

    file: str  # file name inside the store folder
    sha256: str  # checksum of the whole file
    bytes: int  # file size
    n_rows: int  # tokens in the shard
    prompts: tuple  # ((prompt_id, n_tokens), ...) in row order
    rank: int  # rank that wrote it

    @staticmethod
    def from_json(d: dict) -> ShardInfo:
        return ShardInfo(file=d["file"], sha256=d["sha256"], bytes=int(d["bytes"]), n_rows=int(d["n_rows"]),
                         prompts=tuple(tuple(p) for p in d["prompts"]), rank=int(d["rank"]))

    def to_json(self) -> dict:
        return {"file": self.file, "sha256": self.sha256, "bytes": self.bytes, "n_rows": self.n_rows,
                "prompts": [list(p) for p in self.prompts], "rank": self.rank}


class ActivationStore:
    """A store folder: create/resume for writing (one writer per rank), open for reading.

    Usage (not run as a doctest: it needs stored activations, probes or a model)::

        store = ActivationStore.create("acts/x", header)
        store.write_shard(rank=0, acts={"blocks.0.hook_resid_post": a}, labels=labels)
        store.finalize()
    """

    def __init__(self, path: str, manifest: dict):
        self.path = path
        self.manifest = manifest
        self._verified: set[str] = set()

    # -- creation and resumption ---------------------------------------------------------------
    @classmethod
    def create(cls, path: str, header: dict, rank: int = 0) -> ActivationStore:
        """Create a new store, or reopen one for resuming if its config hash matches.

        `header` holds ``config`` (hashed), ``model``, ``hooks``, ``dtype``, ``shapes``, and
        ``n_prompts``. Only rank 0 writes the initial manifest; other ranks call after a barrier.
        """
        header = dict(header)
        header.setdefault("format", FORMAT)
        header["config_hash"] = config_hash(header["config"])
        header.setdefault("label_names", list(LABEL_NAMES))
        mpath = os.path.join(path, MANIFEST)
        if os.path.exists(mpath):
            old = _read_manifest(path)
            if old.get("config_hash") != header["config_hash"]:
                raise ValueError(_config_mismatch(path, old.get("config", {}), header["config"]))
            store = cls(path, old)
        else:
            if rank != 0:
                raise FileNotFoundError(f"{mpath} does not exist yet: rank 0 must create the store first")
            os.makedirs(path, exist_ok=True)
            header.update(complete=False, shards=[])
            atomic_write_json(mpath, header)
            store = cls(path, header)
        for tmp in glob.glob(os.path.join(path, f".tmp-r{rank}-*")):
            os.unlink(tmp)  # half-written shards of a killed run of this rank
        return store

    def journal(self, rank: int) -> list[ShardInfo]:
        """Shards rank `rank` has finished (empty if it has not written any)."""
        jpath = os.path.join(self.path, f"journal-rank{rank}.json")
        if not os.path.exists(jpath):
            return []
        with open(jpath) as f:
            data = json.load(f)
        if data.get("config_hash") != self.manifest["config_hash"]:
            raise ValueError(f"{jpath} belongs to another harvest config; delete it to start over")
        return [ShardInfo.from_json(s) for s in data["shards"]]

    def journals(self) -> list[ShardInfo]:
        """Every journaled shard of every rank, plus those already merged into the manifest."""
        seen = {s["file"]: ShardInfo.from_json(s) for s in self.manifest.get("shards", [])}
        for jpath in sorted(glob.glob(os.path.join(self.path, "journal-rank*.json"))):
            rank = int(jpath.rsplit("rank", 1)[1].split(".")[0])
            for s in self.journal(rank):
                seen.setdefault(s.file, s)
        return list(seen.values())

    def done_prompts(self) -> set[int]:
        """Prompt ids already stored (resume skips them)."""
        return {int(p) for s in self.journals() for p, _ in s.prompts}

    def write_shard(self, rank: int, acts: dict[str, torch.Tensor], labels: dict[str, np.ndarray],
                    prompts: list[tuple[int, int]]) -> ShardInfo:
        """Write one shard atomically and journal it. `acts[hook]` is ``[rows, d]``."""
        mine = self.journal(rank)
        name = f"shard-r{rank}-{len(mine):05d}.safetensors"
        tensors = {f"act/{h}": a.contiguous() for h, a in acts.items()}
        for k in self.label_names:
            tensors[f"label/{k}"] = torch.as_tensor(np.asarray(labels[k]), dtype=torch.int32).contiguous()
        rows = {t.shape[0] for t in tensors.values()}
        if len(rows) != 1 or rows.pop() != sum(n for _, n in prompts):
            raise ValueError("shard arrays disagree on the number of rows")
        final = os.path.join(self.path, name)
        atomic_save(final, lambda tmp: save_file(tensors, tmp, metadata={"config_hash": self.manifest["config_hash"]}))
        info = ShardInfo(file=name, sha256=sha256_file(final), bytes=os.path.getsize(final),
                         n_rows=int(tensors["label/state"].shape[0]), prompts=tuple(tuple(p) for p in prompts),
                         rank=rank)
        atomic_write_json(os.path.join(self.path, f"journal-rank{rank}.json"),
                          {"config_hash": self.manifest["config_hash"],
                           "shards": [s.to_json() for s in [*mine, info]]}, indent=None)
        return info

    def bytes_written(self) -> int:
        return sum(s.bytes for s in self.journals())

    def finalize(self) -> ActivationStore:
        """Merge all journals into the manifest; mark it complete if every prompt is stored."""
        shards = sorted(self.journals(), key=lambda s: min(p for p, _ in s.prompts))
        ids = [p for s in shards for p, _ in s.prompts]
        if len(ids) != len(set(ids)):
            raise RuntimeError(f"store {self.path} holds some prompts twice; this is a bug, please report")
        m = dict(self.manifest, shards=[s.to_json() for s in shards])
        m["n_rows"] = sum(s.n_rows for s in shards)
        m["complete"] = len(ids) == int(m["n_prompts"])
        atomic_write_json(os.path.join(self.path, MANIFEST), m)
        self.manifest = m
        return self

    # -- reading -----------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str, allow_incomplete: bool = False) -> ActivationStore:
        """Open a finished store for reading; bad folders fail with the reason and the fix."""
        m = _read_manifest(path)
        if not m.get("complete") and not allow_incomplete:
            raise ValueError(f"store {path} is incomplete ({len(m.get('shards', []))} shards merged): "
                             "rerun the same harvest command to resume it")
        if not m.get("shards"):
            raise ValueError(f"store {path} is empty (no shards): harvest at least one prompt into it")
        return cls(path, m)

    @property
    def shards(self) -> list[ShardInfo]:
        return [ShardInfo.from_json(s) for s in self.manifest["shards"]]

    @property
    def hooks(self) -> list[str]:
        return list(self.manifest["hooks"])

    @property
    def label_names(self) -> list[str]:
        return list(self.manifest["label_names"])

    @property
    def hash(self) -> str:
        return self.manifest["config_hash"]

    @property
    def n_rows(self) -> int:
        return sum(s.n_rows for s in self.shards)

    def to_hf_dataset(self, hooks: list[str] | None = None):
        """This store as a ``datasets.Dataset`` (see the module function `to_hf_dataset`)."""
        return to_hf_dataset(self, hooks)

    def check_hook(self, hook: str) -> None:
        if hook not in self.hooks:
            raise KeyError(f"hook {hook!r} is not in store {self.path}; it holds {self.hooks}")

    def check_label(self, label: str) -> None:
        if label not in self.label_names:
            raise KeyError(f"label {label!r} does not exist; choose one of {self.label_names}")

    def verify(self, shard: ShardInfo | None = None) -> None:
        """Check sizes and sha256 checksums (of one shard, or all); raise ValueError on mismatch."""
        for s in [shard] if shard is not None else self.shards:
            if s.file in self._verified:
                continue
            fpath = os.path.join(self.path, s.file)
            if not os.path.exists(fpath):
                raise FileNotFoundError(f"shard {fpath} listed in the manifest is missing: re-harvest the store")
            size = os.path.getsize(fpath)
            if size != s.bytes or sha256_file(fpath) != s.sha256:
                what = f"truncated ({size} of {s.bytes} bytes)" if size < s.bytes else "corrupted"
                raise ValueError(f"shard {fpath} is {what}: its sha256 does not match the manifest. "
                                 "Delete the store and harvest again")
            self._verified.add(s.file)

    def iter_shards(self, hooks: list[str], labels: list[str] | None = None):
        """Yield ``(acts {hook: [rows, d]}, labels {name: [rows]})`` one shard at a time.

        Reads go through ``safe_open`` (memory-mapped), so only one shard is resident at once.
        """
        for h in hooks:
            self.check_hook(h)
        labels = self.label_names if labels is None else labels
        for k in labels:
            self.check_label(k)
        for s in self.shards:
            self.verify(s)
            with safe_open(os.path.join(self.path, s.file), framework="pt") as f:
                acts = {h: f.get_tensor(f"act/{h}") for h in hooks}
                labs = {k: f.get_tensor(f"label/{k}").numpy().astype(np.int64) for k in labels}
            yield acts, labs

    def load_label(self, label: str) -> np.ndarray:
        """One label over every row, in store order. ``[rows]`` int64."""
        return np.concatenate([lab[label] for _, lab in self.iter_shards([], [label])])

    def load_labels(self, labels: list[str] | None = None) -> dict[str, np.ndarray]:
        labels = self.label_names if labels is None else labels
        parts = list(self.iter_shards([], labels))
        return {k: np.concatenate([p[1][k] for p in parts]) for k in labels}

    def load_hook(self, hook: str, rows: np.ndarray | None = None, dtype=torch.float32) -> torch.Tensor:
        """Activations of one hook, in store order, optionally only the boolean mask `rows`.
        ``[n_rows, d]``; built shard by shard so at most one full shard is resident."""
        out, start = [], 0
        for acts, _ in self.iter_shards([hook], []):
            a = acts[hook]
            if rows is not None:
                a = a[torch.as_tensor(rows[start:start + a.shape[0]])]
            start += acts[hook].shape[0]
            out.append(a.to(dtype))
        return torch.cat(out)


def _read_manifest(path: str) -> dict:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"activation store {path!r} does not exist: run `beliefscope harvest --out {path}`")
    mpath = os.path.join(path, MANIFEST)
    if not os.path.exists(mpath):
        raise FileNotFoundError(f"{path!r} has no {MANIFEST}: it is not an activation store (or its "
                                "manifest was deleted); harvest again into a fresh folder")
    try:
        with open(mpath) as f:
            m = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{mpath} is not valid JSON ({e}); harvest again into a fresh folder") from None
    if m.get("format") != FORMAT:
        raise ValueError(f"{mpath} has format {m.get('format')!r}, expected {FORMAT!r}")
    return m


def _config_mismatch(path: str, old: dict, new: dict) -> str:
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:5])
    return (f"store {path} was harvested with a different config ({shown}); refusing to mix them. "
            "Use a new --out folder, or delete this one to start over")


# ------------------------------------------------------------------------------- sharing as a dataset
def to_hf_dataset(store: ActivationStore, hooks: list[str] | None = None):
    """The store as a ``datasets.Dataset``: one row per token, a column per hook (``act/<hook>``, a list of
    floats) and per label. The manifest (config, its hash, label and class names) travels in the dataset's
    ``info.description`` as JSON, so `from_hf_dataset` rebuilds the same store (same hash)."""
    import datasets  # deferred: optional dependency

    hooks = store.hooks if hooks is None else hooks
    cols: dict[str, list] = {}
    for acts, labs in store.iter_shards(hooks):
        for h in hooks:
            cols.setdefault(f"act/{h}", []).append(acts[h].float().numpy())
        for k, v in labs.items():
            cols.setdefault(f"label/{k}", []).append(v)
    table = {k: list(np.concatenate(v)) if k.startswith("label/") else np.concatenate(v) for k, v in cols.items()}
    meta = {k: v for k, v in store.manifest.items() if k not in ("shards",)}
    meta["hooks"] = list(hooks)
    ds = datasets.Dataset.from_dict(table)
    ds.info.description = json.dumps({"beliefscope": meta})
    return ds


def from_hf_dataset(ds, path: str) -> ActivationStore:
    """Write a dataset made by `to_hf_dataset` back into a store folder at `path` (refused if its manifest is
    missing, or if `path` holds a store of another config)."""
    try:
        meta = json.loads(ds.info.description or "{}")["beliefscope"]
    except (json.JSONDecodeError, KeyError):
        raise ValueError("this dataset carries no beliefscope manifest in info.description: it was not made by "
                         "to_hf_dataset") from None
    header = {k: v for k, v in meta.items() if k not in ("complete", "n_rows", "config_hash")}
    store = ActivationStore.create(path, header)
    if store.done_prompts():
        return ActivationStore.open(path)
    dtype = DTYPES[meta["dtype"]]
    acts = {h: torch.as_tensor(np.asarray(ds[f"act/{h}"], dtype=np.float32)).to(dtype) for h in meta["hooks"]}
    labels = {k: np.asarray(ds[f"label/{k}"]) for k in meta["label_names"]}
    pid, n = labels["prompt_id"], len(labels["prompt_id"])
    starts = np.r_[0, np.nonzero(np.diff(pid))[0] + 1, n]
    prompts = [(int(pid[a]), int(b - a)) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    store.write_shard(0, acts, labels, prompts)
    store.finalize()
    if store.hash != meta["config_hash"]:
        raise ValueError(f"the rebuilt store's config hash {store.hash} is not the dataset's {meta['config_hash']}")
    return ActivationStore.open(path)


def plan_shards(order: list[int], lengths: list[int], batch_size: int, shard_rows: int) -> list[list[list[int]]]:
    """Shards of batches of prompt ids: each batch holds up to `batch_size` consecutive prompts of
    `order` with the same length (no padding), and a shard closes after the batch that brings it
    to at least `shard_rows` tokens (the last one may hold fewer).

    >>> plan_shards([0, 1, 2, 3, 4], [2, 2, 2, 3, 3], batch_size=2, shard_rows=5)
    [[[0, 1], [2]], [[3, 4]]]
    """
    shards, shard, rows, i = [], [], 0, 0
    while i < len(order):
        T = lengths[order[i]]
        batch = [order[i]]
        while i + len(batch) < len(order) and len(batch) < batch_size and lengths[order[i + len(batch)]] == T:
            batch.append(order[i + len(batch)])
        i += len(batch)
        shard.append(batch)
        rows += T * len(batch)
        if rows >= shard_rows:
            shards.append(shard)
            shard, rows = [], 0
    if shard:
        shards.append(shard)
    return shards
