"""Greedy / sampling decoding, speculative decoding with verify and rollback, deterministic requests.

>>> from beliefscope.models.testing import tiny_gpt2
>>> model = tiny_gpt2()
>>> cfg = SpecConfig(gamma=2, max_new_tokens=5, stop_at_eos=False)
>>> out = speculative_generate(model, EarlyExitDrafter(model, 1), [3, 4, 5], cfg)
>>> out.tokens == generate(model, [3, 4, 5], cfg, window=cfg.window_size).tokens
True
"""

from .config import SpecConfig, TreeConfig
from .core import Generation
from .drafters import (
    Drafter,
    EarlyExitDrafter,
    LowPrecisionDrafter,
    ModelDrafter,
    NGramDrafter,
    make_drafter,
)
from .loop import generate
from .scheduler import Request, Scheduler, SchedulerConfig
from .speculative import accept_greedy, accept_sampled, speculative_generate
from .sweep import determinism_sweep
from .thinking import ThinkingRun, run_thinking
from .trace import Step, Trace
from .tree import TokenTree

__all__ = [
    "Drafter",
    "EarlyExitDrafter",
    "Generation",
    "LowPrecisionDrafter",
    "ModelDrafter",
    "NGramDrafter",
    "Request",
    "Scheduler",
    "SchedulerConfig",
    "SpecConfig",
    "Step",
    "ThinkingRun",
    "TokenTree",
    "Trace",
    "TreeConfig",
    "accept_greedy",
    "accept_sampled",
    "determinism_sweep",
    "generate",
    "make_drafter",
    "run_thinking",
    "speculative_generate",
]
