"""Read a researcher's table of records from wherever they keep it, through Hugging Face `datasets`.

A source is a path (``.jsonl``/``.json``, ``.csv``, ``.parquet``, or a folder written by
``Dataset.save_to_disk``), a hub dataset name (``org/name`` or ``org/name:split``, where a hub is
reachable), a pandas ``DataFrame``, a ``datasets.Dataset``, or a list of dicts. Every one becomes a
list of plain dicts; nothing downstream knows which it was.

>>> read_rows([{"text": "a b", "negated": "no"}])
[{'text': 'a b', 'negated': 'no'}]
"""

from __future__ import annotations

import json
import math
import os
import re

FILE_KINDS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def describe(source) -> str:
    """A short name of a source for messages and manifests."""
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    if isinstance(source, list):
        return f"a list of {len(source)} dicts"
    return type(source).__name__


def read_rows(source) -> list[dict]:
    """Every record of `source` as a dict (see the module doc for what a source may be)."""
    if isinstance(source, list):
        bad = next((i for i, r in enumerate(source) if not isinstance(r, dict)), None)
        if bad is not None:
            raise ValueError(f"record {bad} is a {type(source[bad]).__name__}, not a dict: pass a list of dicts like "
                             "[{'text': ..., 'label': ...}]")
        return [_clean(r) for r in source]
    if isinstance(source, str | os.PathLike):
        return _read_path(os.fspath(source))
    if hasattr(source, "to_dict") and hasattr(source, "columns"):  # a pandas DataFrame
        return [_clean(r) for r in source.to_dict("records")]
    try:
        import datasets  # deferred: optional dependency
    except ImportError:  # pragma: no cover - datasets is a dependency
        datasets = None
    if datasets is not None and isinstance(source, datasets.DatasetDict):
        raise ValueError(f"a DatasetDict holds several splits {sorted(source)}: pass one, e.g. data['train']")
    if datasets is not None and isinstance(source, datasets.Dataset):
        return [_clean(r) for r in source.to_list()]
    raise TypeError(f"cannot read records from a {type(source).__name__}: pass a file path (.jsonl, .csv, .parquet), "
                    "a save_to_disk folder, a hub name, a pandas DataFrame, a datasets.Dataset or a list of dicts")


def _read_path(path: str) -> list[dict]:
    import datasets  # deferred: optional dependency

    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "dataset_info.json")) and not os.path.exists(
                os.path.join(path, "dataset_dict.json")):
            raise ValueError(f"folder {path!r} was not written by datasets' save_to_disk (no dataset_info.json): "
                             "pass a .jsonl, .csv or .parquet file, or a save_to_disk folder")
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            raise ValueError(f"{path!r} holds several splits {sorted(ds)}: pass one split's folder, "
                             f"e.g. {os.path.join(path, sorted(ds)[0])}")
        return [_clean(r) for r in ds.to_list()]
    ext = os.path.splitext(path)[1].lower()
    if os.path.exists(path):
        if ext not in FILE_KINDS:
            raise ValueError(f"{path!r}: the extension {ext or '(none)'!r} is not one of {sorted(FILE_KINDS)}; rename "
                             "the file, or load it yourself and pass a DataFrame or a list of dicts")
        if os.path.getsize(path) == 0:
            raise ValueError(f"{path!r} is empty: it holds no records")
        if ext in (".jsonl", ".json"):
            return _read_json(path)
        ds = datasets.load_dataset(FILE_KINDS[ext], data_files=path, split="train")
        return [_clean(r) for r in ds.to_list()]
    if ext in FILE_KINDS or not re.fullmatch(r"[\w.-]+/[\w.-]+(:[\w.-]+)?", path):
        raise FileNotFoundError(f"data file {path!r} does not exist (working folder {os.getcwd()}); a hub dataset "
                                "is named org/name[:split]")
    name, _, split = path.partition(":")
    try:
        return [_clean(r) for r in datasets.load_dataset(name, split=split or "train").to_list()]
    except Exception as e:  # the hub is unreachable here, or the name is wrong
        raise FileNotFoundError(f"{path!r} is not a local file, and loading it from the hub failed "
                                f"({type(e).__name__}: {str(e)[:160]}): pass a local file or check the name") from None


def _read_json(path: str) -> list[dict]:
    """JSON lines (or one JSON list) with the line of every bad record named; datasets' JSON reader
    infers one Arrow type per column, which turns a mix of string and int class names into an error."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise ValueError(f"{path!r} is a JSON value, not a list of records")
        return read_rows(rows)
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n} is not valid JSON ({e.msg} at column {e.colno}): one record per "
                             "line") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n} is a JSON {type(row).__name__}, not an object: one record per line")
        rows.append(_clean(row))
    return rows


def _clean(row: dict) -> dict:
    """NaN (a missing CSV cell) becomes None; JSON written into a CSV cell is decoded."""
    out = {}
    for k, v in row.items():
        if isinstance(v, float) and math.isnan(v):
            v = None
        elif isinstance(v, str) and v[:1] in "[{" and v[-1:] in "]}":
            try:
                v = json.loads(v)
            except json.JSONDecodeError:
                pass
        out[str(k)] = v
    return out
