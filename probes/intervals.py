"""Uncertainty of an accuracy: a percentile bootstrap over record groups, and margins between two scorers.

Rows of one record (every token of a story) are not independent draws, so resampling rows would give an
interval far too narrow. The bootstrap here resamples whole groups (records, or the groups records were
joined into) with replacement, and recomputes the accuracy as correct rows over rows of the drawn groups
(Efron & Tibshirani 1993, the cluster bootstrap). A margin between two scorers on the same rows (the
probe against a baseline) resamples the same groups for both, so their shared noise cancels.

>>> correct = np.array([1, 1, 0, 1, 0, 0, 1, 1], dtype=float); groups = np.array([0, 0, 1, 1, 2, 2, 3, 3])
>>> lo, hi = group_interval(correct, groups, n_boot=2000)
>>> bool(lo <= correct.mean() <= hi)
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

N_BOOT = 1000  # bootstrap resamples (the interval's percentiles move by about 0.005 between seeds at 1000)
LEVEL = 0.95  # two-sided coverage of every interval


def _group_sums(values: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-group sums of ``values [n]`` or ``[k, n]`` (``[.., G]``) and per-group row counts ``[G]``."""
    _, inv = np.unique(groups, return_inverse=True)
    G = int(inv.max()) + 1 if len(inv) else 0
    counts = np.bincount(inv, minlength=G).astype(np.float64)
    v = np.atleast_2d(np.asarray(values, dtype=np.float64))
    sums = np.stack([np.bincount(inv, weights=row, minlength=G) for row in v])
    return sums, counts


def _weights(n_groups: int, n_boot: int, seed: int) -> np.ndarray:
    """``[n_boot, G]``: how many times each group is drawn in each resample."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_groups, size=(n_boot, n_groups))
    return np.stack([np.bincount(d, minlength=n_groups) for d in draws]).astype(np.float64)


def group_interval(correct, groups, n_boot: int = N_BOOT, seed: int = 0, level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``correct [n]`` (0/1 or any score), resampling `groups`."""
    sums, counts = _group_sums(correct, groups)
    if len(counts) < 2:
        return float("nan"), float("nan")
    w = _weights(len(counts), n_boot, seed)
    est = (w @ sums[0]) / np.maximum(w @ counts, 1)  # [n_boot]
    a = (1 - level) / 2
    return float(np.quantile(est, a)), float(np.quantile(est, 1 - a))


def margin_interval(correct_a, correct_b, groups, n_boot: int = N_BOOT, seed: int = 0,
                    level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean(a) - mean(b), lo, hi)``: the margin of scorer a over scorer b on the same rows, with a paired
    group bootstrap interval."""
    a, b = np.asarray(correct_a, dtype=np.float64), np.asarray(correct_b, dtype=np.float64)
    sums, counts = _group_sums(np.stack([a, b]), groups)
    diff = float(a.mean() - b.mean())
    if len(counts) < 2:
        return diff, float("nan"), float("nan")
    w = _weights(len(counts), n_boot, seed)
    n = np.maximum(w @ counts, 1)
    est = (w @ sums[0]) / n - (w @ sums[1]) / n
    q = (1 - level) / 2
    return diff, float(np.quantile(est, q)), float(np.quantile(est, 1 - q))


@dataclass
class Scored:
    """One accuracy with what it was scored on and its interval (what every JSON row carries)."""

    accuracy: float  # share of scored rows right
    lo: float  # lower end of the 95% group-bootstrap interval
    hi: float  # upper end
    n_rows: int  # scored rows
    n_groups: int  # record groups they came from (the bootstrap's unit)

    def to_json(self) -> dict:
        return {"accuracy": round(self.accuracy, 4), "interval": [round(self.lo, 4), round(self.hi, 4)],
                "n_rows": self.n_rows, "n_groups": self.n_groups}


def scored(correct, groups, seed: int = 0) -> Scored:
    """The accuracy of ``correct [n]`` (bool) with its group-bootstrap interval."""
    c = np.asarray(correct, dtype=np.float64)
    if len(c) == 0:
        return Scored(float("nan"), float("nan"), float("nan"), 0, 0)
    lo, hi = group_interval(c, groups, seed=seed)
    return Scored(float(c.mean()), lo, hi, len(c), len(np.unique(groups)))


def below_chance(hi: float, chance: float) -> bool:
    """Whether an interval's upper end lies under chance: a finding (the probe reads something else, often a
    variable anti-correlated with the label on the held-out records), not noise."""
    return bool(np.isfinite(hi) and hi < chance)
