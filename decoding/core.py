"""Small pure pieces of decoding: forward with a cache, seeded randomness, budgets, EOS (`decoding.loop` runs them).

Convention (as in gpt-fast): the cache holds K/V of every committed token but the last one; the
last committed token is *pending* and is the first input of the next forward.

>>> from beliefscope.models.testing import tiny_gpt2
>>> logits = forward(tiny_gpt2(), torch.tensor([1, 2, 3]), new_cache(tiny_gpt2(), 8))
>>> logits.shape
torch.Size([3, 50])
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from ..cache import KVCache
from ..models.bridge import cache_kwarg
from ..models.context import position_limit
from ..models.forward import forward_module, last_logits_only
from ..models.profile import hf_of
from .config import SpecConfig


def hf_model(model):
    """The HF causal LM behind a TransformerBridge (its modules fire the bridge's hooks too)."""
    return hf_of(model)


def hf_logits(model, tokens: torch.Tensor, last_only: bool = False, **kwargs) -> torch.Tensor:
    """Float logits ``[B, n, vocab]`` of ``tokens`` ``[B, n]`` on the host, whatever device the model is on
    (the decoding loops keep their bookkeeping there); inputs move to the model's device. ``last_only``: the
    last position's alone, ``[B, 1, vocab]``, computed alone where the model allows (`models.forward.last_logits_only`).

    >>> from beliefscope.models.testing import tiny_gpt2
    >>> hf_logits(tiny_gpt2(), torch.tensor([[1, 2]])).shape
    torch.Size([1, 2, 50])
    """
    hf = forward_module(model)  # the HF model (through TransformerLens's wrappers where a hook name built them)
    dev = next(hf.parameters()).device
    kwargs = {cache_kwarg(hf) if k == "past_key_values" else k: _to_device(v, dev) for k, v in kwargs.items()}
    if last_only:
        kwargs.update(last_logits_only(hf))
    logits = hf(tokens.to(dev), use_cache=True, **kwargs).logits  # [B, n or 1, vocab]
    return (logits[:, -1:] if last_only else logits).float().cpu()


def _to_device(value, dev):
    """A tensor, or a dict of tensors (per-layer-type masks), on ``dev``; anything else as it is."""
    if isinstance(value, dict):
        return {k: _to_device(v, dev) for k, v in value.items()}
    return value.to(dev) if torch.is_tensor(value) else value


def context_limit(model) -> int:
    """Positions the model can address (`models.context.position_limit`; 10**9 where its config states none)."""
    return position_limit(hf_model(model).config) or 10**9


def vocab_size(model) -> int:
    return int(hf_model(model).config.vocab_size)


def eos_id(model, cfg: SpecConfig, tokenizer=None) -> int | None:
    if not cfg.stop_at_eos:
        return None
    if cfg.eos_token_id is not None:
        return cfg.eos_token_id
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    e = hf_model(model).config.eos_token_id
    return int(e[0] if isinstance(e, (list, tuple)) else e) if e is not None else None


def check_prompt(model, prompt_ids, room: int = 0) -> torch.Tensor:
    """Validate a prompt and return it as a LongTensor ``[n]``; raise a clear ValueError otherwise. One prompt is
    ``[n]`` or ``[1, n]``: a batch ``[B, n]`` is refused, never flattened into one prompt."""
    ids = torch.as_tensor(prompt_ids, dtype=torch.long)
    if ids.ndim > 2 or (ids.ndim == 2 and ids.shape[0] != 1):
        raise ValueError(f"this decodes one prompt ([n] or [1, n] token ids); got shape {list(ids.shape)}: decode each "
                         "prompt in turn, or serve a batch with bs.Scheduler")
    ids = ids.reshape(-1)  # [n]
    if ids.numel() == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. the tokenizer's bos/eos id)")
    limit = context_limit(model)
    if ids.numel() + room > limit:
        raise ValueError(f"the prompt has {ids.numel()} tokens but the model's context is {limit} tokens and "
                         f"decoding needs {room} more position(s): shorten the prompt to <= {limit - room} tokens")
    v = vocab_size(model)
    if int(ids.max()) >= v or int(ids.min()) < 0:
        raise ValueError(f"prompt token ids must be in [0, {v}); got {int(ids.min())}..{int(ids.max())}")
    return ids


def token_budget(model, n_prompt: int, max_new_tokens: int, window: int) -> int:
    """New tokens we may produce: every forward of `window` tokens must fit in the context."""
    return max(1, min(max_new_tokens, context_limit(model) - n_prompt - window + 1))


def new_cache(model, n_tokens: int, keep_rejected: bool = False) -> KVCache:
    return KVCache.for_model(model, batch=1, capacity=max(16, n_tokens), keep_rejected=keep_rejected)


class CompiledForwards:
    """A model's forwards over one cache, run another way (`decoding.graphed.GraphedForward`: replayed);
    `forward` takes it in place of the model."""

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, n] -> host float [B, n, vocab]
        raise NotImplementedError


@torch.no_grad()
def forward(model, tokens: torch.Tensor, cache, last_only: bool = False) -> torch.Tensor:
    """Logits ``[n, vocab]`` of ``tokens`` ``[n]`` appended to ``cache`` (written in place), or the last
    position's alone, ``[1, vocab]`` (``last_only``: a prefill); ``model`` may be a `CompiledForwards` over
    that cache."""
    if isinstance(model, CompiledForwards):
        logits = model.logits(tokens[None])[0]
        return logits[-1:] if last_only else logits
    return hf_logits(model, tokens[None], last_only, past_key_values=cache)[0]


def seeded_generator(seed: int, position: int, stream: str) -> torch.Generator:
    """A generator that depends only on (request seed, absolute position, stream name)."""
    h = hashlib.blake2b(f"{seed}/{position}/{stream}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(h, "little") & ((1 << 63) - 1))


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax at `temperature` over the last dim (float64 so ratios and residuals are exact enough)."""
    return torch.softmax(logits.double() / temperature, dim=-1)


def sample(p: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(p, 1, generator=gen))


def pad_window(tokens: torch.Tensor, width: int, pad: int = 0) -> torch.Tensor:
    """Right-pad a window ``[n]`` to ``[width]``; causal attention keeps the padding invisible."""
    if tokens.numel() >= width:
        return tokens
    return torch.cat([tokens, tokens.new_full((width - tokens.numel(),), pad)])


@dataclass
class Generation:
    """Result of a decoding run. ``tokens`` are the new tokens only."""

    tokens: list[int]  # generated token ids (the prompt excluded)
    prompt_len: int  # number of prompt tokens
    steps: int  # target forwards after the prefill (= verify steps for speculative decoding)
    target_forwards: int  # every target forward, prefill included
    seconds: float  # wall time of the whole run
    draft_seconds: float = 0.0  # time spent in the drafter
    target_seconds: float = 0.0  # time spent in target forwards (prefill and verify)
    drafted: int = 0  # draft tokens proposed in total
    accepted: int = 0  # draft tokens accepted in total
    gammas: list[int] = field(default_factory=list)  # gamma used at each step
    accepted_per_step: list[int] = field(default_factory=list)  # accepted drafts per step
    tokens_per_step: list[int] = field(default_factory=list)  # tokens committed per step
    draft_forwards: int = 0  # forwards run by the drafter (0 for prompt lookup)
    cache: KVCache | None = None  # the target cache at the end (provenance, events, rejected)
    trace: object | None = None  # a decoding.Trace when SpecConfig.trace is set
    tree_nodes: list[int] = field(default_factory=list)  # token trees: nodes drafted per step
    compiled: str = ""  # with SpecConfig(compile=True): "cuda-graphs" or "torch.compile", or why it ran eagerly
    path_ranks: list[list[int]] = field(default_factory=list)  # token trees: per step, the drafter's rank of each
    # accepted node (decoding.tune.choose_tree_nodes reads what a smaller tree would have accepted from it)
    stop_reason: str = ""  # why decoding stopped: "eos", "budget" (max_new_tokens reached) or "context" (the model's
    #   context ran out first, so fewer tokens than asked)

    def record_step(self, *, drafted: int, accepted: int, gamma: int, n_new: int, draft_s: float,
                    verify_s: float) -> None:
        """Count one verify step (speculative chains and token trees alike)."""
        self.draft_seconds += draft_s
        self.target_seconds += verify_s
        self.steps += 1
        self.target_forwards += 1
        self.drafted += drafted
        self.accepted += accepted
        self.gammas.append(gamma)
        self.accepted_per_step.append(accepted)
        self.tokens_per_step.append(n_new)

    @property
    def alpha(self) -> float | None:
        """Acceptance rate: accepted / proposed drafts (None when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_tokens_per_step(self) -> float | None:
        """New tokens per verify step (None before any step)."""
        return len(self.tokens) / self.steps if self.steps else None

    def summary(self) -> dict:
        """Every number of the run under its attribute's name, JSON-ready (the CLI's ``--json`` output):
        lists stay lists, a missing value is None.

        >>> g = Generation([5, 6, 7], prompt_len=2, steps=2, target_forwards=3, seconds=0.1)
        >>> g.record_step(drafted=3, accepted=1, gamma=3, n_new=2, draft_s=0.0, verify_s=0.0)
        >>> s = g.summary()
        >>> s["alpha"], s["tokens_per_step"], s["mean_tokens_per_step"], s["gammas"]
        (0.3333333333333333, [2], 1.0, [3])
        """
        return {"tokens": self.tokens, "prompt_len": self.prompt_len, "steps": self.steps,
                "target_forwards": self.target_forwards, "seconds": self.seconds,
                "draft_seconds": self.draft_seconds, "target_seconds": self.target_seconds,
                "drafted": self.drafted, "accepted": self.accepted, "alpha": self.alpha,
                "gammas": self.gammas, "accepted_per_step": self.accepted_per_step,
                "tokens_per_step": self.tokens_per_step, "mean_tokens_per_step": self.mean_tokens_per_step,
                "draft_forwards": self.draft_forwards, "tree_nodes": self.tree_nodes, "compiled": self.compiled}


def clip_new(new: list[int], room: int, eos: int | None) -> list[int]:
    """The tokens a step commits: at most `room` (max_new_tokens reached mid-step), and none after eos.

    >>> clip_new([5, 1, 7], room=3, eos=1), clip_new([5, 6, 7], room=2, eos=None)
    ([5, 1], [5, 6])
    """
    new = new[:room]
    return new[: new.index(eos) + 1] if eos is not None and eos in new else new


def pick(logits: torch.Tensor, cfg: SpecConfig, position: int) -> int:
    """Greedy argmax, or a seeded sample at `position` from the temperature-scaled distribution."""
    if cfg.temperature == 0:
        return int(logits.argmax())
    return sample(probs(logits, cfg.temperature), seeded_generator(cfg.seed, position, "target"))
