"""Determinism among other requests: unique outputs vs co-batched requests (placeholder until
decoding.Scheduler lands)."""

from __future__ import annotations

from dataclasses import dataclass

from decoding import Scheduler  # noqa: F401  (fails until decoding.Scheduler lands)


@dataclass
class DeterminismConfig:
    """`beliefscope determinism-chart`."""

    model: str = "target"  # checkpoint folder or alias
    prompts: int = 8  # prompts per configuration
    others: str = "0,1,3,7"  # numbers of co-batched requests
    out: str = "determinism.png"  # chart PNG
    max_new_tokens: int = 16  # tokens per request
    quick: bool = False  # fewer arrival orders


def main(config: DeterminismConfig, *, bridge=None, tok=None) -> dict:
    raise ImportError("decoding.Scheduler is not available yet")
