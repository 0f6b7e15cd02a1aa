"""The `beliefscope bench probes` row of a whole probe report on SmolLM2 at the size of a real study.

SmolLM2 is harvested on ``records`` location stories (`tasks.locations`, every hook and the
random-init twin) into a temporary store; then ``probe_report`` runs as ``beliefscope probe`` does:
every hook, 5-fold cross-validation by record, the control task and the random-init twin. Its
seconds are the headline (goal: <= 180 s on a 2-core CPU for 10,000 labelled positions). In the
same run, a few hooks are fitted again with scikit-learn's ``LogisticRegression`` (the reference
trainer, one fit per fold and label) and the out-of-fold accuracies of both trainers are compared
per hook (goal: within 0.01); the ratio of their seconds on those hooks is the speed-up.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

from ..probes.report import ReportConfig, probe_report
from ..probes.store import ActivationStore
from ..tasks.locations import location_records


@dataclass
class ReportBenchConfig:
    """What the probe-report row runs."""

    records: int = 400  # location stories harvested (400: ~10,000 labelled positions in the training split)
    label: str = "location"  # the probed label (4 rooms)
    folds: int = 5  # cross-validation folds by record
    sklearn_layers: str = "3,15,27"  # block indices refitted with scikit-learn for the agreement and the ratio
    tolerance: float = 0.01  # max out-of-fold accuracy difference allowed between the trainers
    store: str | None = None  # an existing store folder (with random_init/) to use instead of harvesting


def harvest_locations(cfg: ReportBenchConfig, folder: str) -> str:
    """Harvest SmolLM2 on ``cfg.records`` location stories into ``folder`` (via the CLI); the store path."""

    data = os.path.join(folder, "locations.jsonl")
    with open(data, "w") as f:
        for rec in location_records(cfg.records):
            f.write(json.dumps(rec) + "\n")
    store = os.path.join(folder, "acts")
    subprocess.run([sys.executable, "-m", "beliefscope", "harvest", "--model", "smollm2", "--data", data,
                    "--events-field", "location", "--label-field", "negated", "--out", store, "--quiet"],
                   check=True)
    return store


def _report(store, cfg: ReportBenchConfig, trainer: str, layers: str, twin: bool):

    st = ActivationStore.open(store)
    rnd = ActivationStore.open(os.path.join(store, "random_init")) if twin else None
    rc = ReportConfig(label=cfg.label, folds=cfg.folds, trainer=trainer, layers=layers)
    t0 = time.perf_counter()
    rep = probe_report(st, rc, random_store=rnd)
    return time.perf_counter() - t0, rep


def main(cfg: ReportBenchConfig | None = None) -> dict:
    """Run the row and return its result (``seconds``, per-hook agreement with scikit-learn)."""

    cfg = cfg or ReportBenchConfig()
    tmp = None if cfg.store else tempfile.mkdtemp(prefix="bench-report-")
    try:
        t0 = time.perf_counter()
        store = cfg.store or harvest_locations(cfg, tmp)
        harvest_s = None if cfg.store else round(time.perf_counter() - t0, 1)
        seconds, full = _report(store, cfg, "torch", "all", twin=True)
        t_torch, ours = _report(store, cfg, "torch", cfg.sklearn_layers, twin=False)
        t_sk, ref = _report(store, cfg, "sklearn", cfg.sklearn_layers, twin=False)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for a, b in zip(ours.layers, ref.layers, strict=True):
        rows.append({"layer": a["layer"], "accuracy_torch": a["accuracy"], "accuracy_sklearn": b["accuracy"],
                     "control_torch": a["control_accuracy"], "control_sklearn": b["control_accuracy"]})
    diff = max(max(abs(r["accuracy_torch"] - r["accuracy_sklearn"]), abs(r["control_torch"] - r["control_sklearn"]))
               for r in rows)
    return {"records": cfg.records, "rows": full.n_rows, "hooks": len(full.layers) + 1, "folds": cfg.folds,
            "threads": torch.get_num_threads(), "harvest_seconds": harvest_s, "seconds": round(seconds, 1),
            "goal_seconds": 180, "layers": full.layers, "majority_accuracy": full.majority_accuracy,
            "embedding_accuracy": full.embedding_accuracy,
            "sklearn_check": {"layers": rows, "seconds_torch": round(t_torch, 1), "seconds_sklearn": round(t_sk, 1),
                              "speedup": round(t_sk / t_torch, 1), "max_accuracy_diff": round(diff, 4),
                              "accuracy_equal": bool(diff <= cfg.tolerance)}}
