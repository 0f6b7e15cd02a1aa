"""Configuration of speculative decoding and plain decoding.

>>> SpecConfig(gamma=4).window_size
5
>>> SpecConfig(gamma="auto", gamma_max=6).window_size
7
>>> SpecConfig(tree=TreeConfig(nodes=12)).window_size
13
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

PREFILL_K = 8  # Thinking States' speculative prefill: complete chunks drafted per forward by default


@dataclass
class TreeConfig:
    """Shape of the draft trees (``SpecConfig(tree=TreeConfig(...))``); ``decoding.tune.choose_tree_nodes``
    picks ``nodes`` for this machine."""

    nodes: int = 8  # draft tokens per tree at most; a verify forward has nodes + 1 tokens (pending token first)
    depth: int = 7  # longest root-to-leaf path (drafts on one branch)
    branch: int = 2  # children per node at most (the top-k continuations)
    min_share: float = 0.05  # a continuation whose estimated probability along its path is below this is not drafted

    def __post_init__(self):
        for name in ("nodes", "depth", "branch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TreeConfig.{name}={v!r} is invalid: use an integer >= 1")
        if not 0 <= self.min_share < 1:
            raise ValueError(f"TreeConfig.min_share={self.min_share} must be in [0, 1)")


@dataclass
class SpecConfig:
    """Everything that determines a speculative (or plain) decoding run besides the models."""

    gamma: int | str = 4  # tokens drafted per step: an int >= 1, or "auto" (+2 after a full accept, -1 otherwise)
    gamma_max: int = 8  # upper bound of the adaptive gamma (and of the verify window when gamma="auto")
    gamma_start: int = 4  # first gamma of the adaptive schedule
    max_new_tokens: int = 32  # stop after this many generated tokens (the window is cut mid-way if needed)
    temperature: float = 0.0  # 0 = greedy; > 0 = sampling with the Leviathan/Chen rejection rule
    seed: int = 0  # request seed: the randomness at absolute position t depends only on (seed, t)
    eos_token_id: int | None = None  # stop after this token (None = the tokenizer's / model config's eos)
    stop_at_eos: bool = True  # False = ignore eos and always produce max_new_tokens
    fixed_window: bool = True  # pad every verify forward to window_size tokens (fixed shape, exact numerics)
    verify_widths: tuple[int, ...] | None = None  # with fixed_window=False: pad a verify forward up to the
    # smallest of these widths that fits it (widths this CPU runs fastest, see decoding.tune); None = no padding
    keep_rejected: bool = False  # ask the target KVCache to keep rolled-back entries (provenance REJECTED)
    trace: bool = False  # record a Trace (proposals, accepted counts, cache events) per step
    capture: tuple[str, ...] = ()  # hook names to capture into the Trace, tagged {pass, status}
    compile: bool = False  # record each decode/verify forward shape once and replay it: CUDA graphs on a GPU,
    #   torch.compile on the CPU (decoding.graphed); token trees, hooks and captures run eagerly, and say so
    tree: TreeConfig | None = None  # draft a token tree per step (decoding.tree) instead of one chain;
    # its nodes + 1 is then the verify window, and gamma only bounds drafters that cannot branch

    def __post_init__(self):
        if self.gamma != "auto" and (isinstance(self.gamma, bool) or not isinstance(self.gamma, int)
                                     or self.gamma <= 0):
            raise ValueError(f"gamma={self.gamma!r} is invalid: use an integer >= 1 or 'auto'")
        if self.gamma_max <= 0 or self.gamma_start <= 0:
            raise ValueError(f"gamma_max={self.gamma_max} and gamma_start={self.gamma_start} must be >= 1")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if self.verify_widths is not None and (not self.verify_widths or min(self.verify_widths) < 1):
            raise ValueError(f"verify_widths={self.verify_widths!r} must be positive widths, e.g. (1, 5, 8), or None")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.capture and not self.trace:
            raise ValueError(f"capture={tuple(self.capture)!r} records into the run's Trace: pass trace=True as well "
                             "(SpecConfig(trace=True, capture=...)), then read gen.trace.activations(...)")

    @property
    def adaptive(self) -> bool:
        return self.gamma == "auto"

    @property
    def window_size(self) -> int:
        """Tokens in every verify forward: the pending token plus the largest possible draft (or tree)."""
        if self.tree is not None:
            return self.tree.nodes + 1
        return (self.gamma_max if self.adaptive else int(self.gamma)) + 1

    @property
    def max_verify_width(self) -> int:
        """The widest verify forward this config can run (cache room and context checks use it)."""
        if self.fixed_window or not self.verify_widths:
            return self.window_size
        return max(self.window_size, *self.verify_widths)

    def verify_width(self, n: int) -> int:
        """Width of the verify forward for ``n`` real tokens (pending token + drafts).

        >>> SpecConfig(gamma=8, fixed_window=False, verify_widths=(1, 5, 9)).verify_width(3)
        5
        """
        if self.fixed_window:
            return self.window_size
        fits = [w for w in (self.verify_widths or ()) if w >= n]
        return min(fits) if fits else n

    def next_gamma(self, gamma: int, accepted: int) -> int:
        """Adaptive schedule: +2 after a full accept, -1 otherwise, within [1, gamma_max]."""
        if not self.adaptive:
            return int(self.gamma)
        return min(self.gamma_max, gamma + 2) if accepted == gamma else max(1, gamma - 1)


def with_overrides(cfg: SpecConfig | None, overrides: dict) -> SpecConfig:
    """``cfg`` (default ``SpecConfig()``) with some fields given as keywords, as ``generate(model, ids,
    max_new_tokens=8)`` takes them; an unknown name is refused, naming the fields.

    >>> with_overrides(None, {"max_new_tokens": 8}).max_new_tokens
    8
    """
    cfg = cfg if cfg is not None else SpecConfig()
    if not overrides:
        return cfg
    fields = sorted(f.name for f in dataclasses.fields(SpecConfig))
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise TypeError(f"unknown decoding setting(s) {', '.join(unknown)}: pass SpecConfig fields as keywords "
                        f"({', '.join(fields)}) or a SpecConfig")
    return dataclasses.replace(cfg, **overrides)


@dataclass
class GenerateConfig:
    """`beliefscope generate`: one prompt, decoded plainly or speculatively (chunk by chunk, with its
    thoughts, for a Thinking States model). Decoding defaults are `SpecConfig`'s."""

    prompt: str = ""  # prompt text
    model: str = "target"  # checkpoint folder, alias (target, draft, smollm2)
    drafter: str = "none"  # none | draft:PATH | early-exit:K | ngram:N | store:PATH | bf16 (none = plain cached
    #   decoding)
    gamma: str = str(SpecConfig.gamma)  # tokens drafted per step (an integer >= 1) or 'auto'
    temperature: float = SpecConfig.temperature  # 0 = greedy; > 0 = sampling
    seed: int = SpecConfig.seed  # request seed (sampling is seeded per position)
    max_new_tokens: int = SpecConfig.max_new_tokens  # stop after this many generated tokens
    chat: bool = False  # give the prompt as a user turn of the model's chat template (SmolLM2-Instruct's ChatML)
    verify_widths: str = "fixed"  # fixed: every verify is gamma+1 wide (exact vs the fixed-shape reference); auto:
    #   each verify as wide as its draft, padded to widths measured fastest here; or a list such as 1,5,8
    packed: bool = False  # pre-pack the linear weights for oneDNN (CPU, float32 only): a verify forward of a few
    #   tokens then costs about one decode step (models.packed)
    compile: bool = SpecConfig.compile  # record each decode/verify forward once and replay it (CUDA graphs on a
    #   GPU, torch.compile on the CPU, whose first compile takes seconds to a minute); the output says what ran
    trace: str | None = None  # write the per-step Trace as JSON to this file
    prefill: str = "chunked"  # Thinking States models: read the prompt chunk by chunk, or draft k chunks per forward
    #   with drafted thoughts and keep what T confirms (the same thoughts and answer, fewer forwards)
    k: int = PREFILL_K  # chunks drafted per forward with --prefill speculative
