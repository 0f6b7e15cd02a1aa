"""Helpers of the differential harness (tests/test_differential.py): tiny random models of each family, built
once per process, an untouched HF twin of each as the reference, and the plain-HF references themselves
(greedy with margins, hidden states, ``DynamicCache`` K/V, a steering forward hook with full recompute).

Tolerances come from the maths, not from a machine: a ``d``-term float32 dot product rounds to about
``eps32 * sqrt(d)`` relative, every block adds its rounding to the residual stream, and softmax and the norms
contribute a small factor (4, as tests/test_interchange_pyvene.py derives). So two computations of the same
quantity ``depth`` blocks deep, of magnitude ``m``, differ by at most ``4 * eps32 * sqrt(d) * depth * max(1, m)``.
Two greedy runs can then pick different tokens only where the reference's top-two margin is within twice the
logit bound: such a step is a *near-tie*, and tokens are compared only before the first one (`agree`).
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from functools import lru_cache

import torch
from hypothesis import event

from .architectures import configs, tokenizer

EPS32 = torch.finfo(torch.float32).eps
FAMILIES = ("Llama", "Qwen2", "Gemma2 (sliding)", "Mistral (sliding)", "GPT-2", "GPT-NeoX")
SCALES = (0.02, 0.5)  # init std: HF's default (logits ~0.4), and a wide one (logits ~10, residuals ~30)


@lru_cache(maxsize=None)
def built(family: str, scale: float = 0.02, seed: int = 0, twin: int = 0):
    """``(bridge, reference)``: the model bridged with `load_model` (the public path), and an untouched deep copy
    of the same weights taken before bridging, whose ``generate`` never stops at an EOS. ``twin`` builds another
    object with the same weights (a draft model that agrees with the target everywhere)."""
    from beliefscope.models.load import load_model

    cfg_cls, model_cls, kw = configs()[family]
    torch.manual_seed(seed)
    hf = model_cls(cfg_cls(**kw, initializer_range=scale)).eval()
    ref = copy.deepcopy(hf)
    ref.generation_config.eos_token_id = None  # tokens are compared over the whole budget
    ref.generation_config.pad_token_id = 0
    bridge, _ = load_model(hf, tokenizer=tokenizer())
    return bridge, ref


def dims(ref) -> tuple[int, int]:
    """``(d_model, n_layers)``."""
    c = ref.config
    return int(getattr(c, "hidden_size", None) or c.n_embd), int(getattr(c, "num_hidden_layers", None) or c.n_layer)


def bound(ref, depth: int, magnitude: float, scores: float = 0.0) -> float:
    """Largest difference float32 rounding may make to a quantity ``depth`` blocks deep of size ``magnitude``, where
    attention logits reach ``scores`` (`score_scale`): a ``d``-term dot product rounds to ``eps * sqrt(d)`` relative,
    and a softmax turns a logit's rounding, ``eps * |logit|``, into that much of its weights."""
    d, _ = dims(ref)
    return 4 * EPS32 * (math.sqrt(d) + scores) * max(1, depth) * max(1.0, magnitude)


def logit_bound(ref, logits: torch.Tensor, scores: float = 0.0) -> float:
    return bound(ref, dims(ref)[1] + 1, float(logits.abs().max()), scores)


@torch.no_grad()
def score_scale(ref, ids: torch.Tensor) -> float:
    """The largest attention logit a forward of ``ids`` ``[B, n]`` can have, by Cauchy-Schwarz: over layers, the
    largest query norm times the largest key norm (per head) times the attention's scaling; rotary embeddings are
    rotations, so they keep the norms. Read with plain forward hooks on HF's own projections."""
    found = []

    def norms(q: torch.Tensor, k: torch.Tensor, d_head: int, scaling: float) -> None:
        qn = q.reshape(*q.shape[:-1], -1, d_head).norm(dim=-1).max()
        kn = k.reshape(*k.shape[:-1], -1, d_head).norm(dim=-1).max()
        found.append(float(qn * kn) * scaling)

    handles = []
    for block in decoder_layers(ref):
        attn = getattr(block, "self_attn", None) or getattr(block, "attn", None) or block.attention
        if hasattr(attn, "q_proj"):  # Llama, Qwen2, Mistral, Gemma2
            d_head = int(attn.head_dim)
            scaling = float(getattr(attn, "scaling", d_head ** -0.5))
            seen = {}
            handles.append(attn.q_proj.register_forward_hook(lambda m, a, out, seen=seen: seen.__setitem__("q", out)))
            handles.append(attn.k_proj.register_forward_hook(
                lambda m, a, out, seen=seen, dh=d_head, sc=scaling: norms(seen["q"], out, dh, sc)))
        elif hasattr(attn, "c_attn"):  # GPT-2: q, k, v side by side
            d_head = int(attn.head_dim)
            handles.append(attn.c_attn.register_forward_hook(
                lambda m, a, out, dh=d_head: norms(*out.chunk(3, -1)[:2], dh, dh ** -0.5)))
        else:  # GPT-NeoX: per head, q, k, v side by side
            d_head = int(attn.head_size)

            def neox(m, a, out, dh=d_head):
                qkv = out.reshape(*out.shape[:-1], -1, 3 * dh)
                norms(qkv[..., :dh], qkv[..., dh: 2 * dh], dh, dh ** -0.5)

            handles.append(attn.query_key_value.register_forward_hook(neox))
    try:
        ref(ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return max(found)


def decoder_layers(ref):
    """The HF decoder blocks, in order."""
    body = getattr(ref, "model", None) or getattr(ref, "transformer", None) or ref.gpt_neox
    return body.layers if hasattr(body, "layers") else body.h


def final_norm(ref):
    """The HF norm applied to the last block's output (HF's last hidden state is after it)."""
    body = getattr(ref, "model", None) or getattr(ref, "transformer", None) or ref.gpt_neox
    for name in ("norm", "ln_f", "final_layer_norm"):
        if hasattr(body, name):
            return getattr(body, name)
    raise AttributeError(f"no final norm found on {type(ref).__name__}")


def margins(logits: torch.Tensor) -> list[float]:
    """Top-1 minus top-2 logit of each row of ``[n, vocab]``."""
    top = logits.float().topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).tolist()


def agree(got: list[int], want: list[int], margin: list[float], tol: float, what: str) -> int:
    """Assert ``got == want`` up to the first near-tie of the reference (a step whose top-two margin is within
    ``2 * tol``, which rounding of another forward shape may flip); beyond it the two may legitimately differ,
    and the case says so (a Hypothesis event). Returns the number of tokens compared."""
    k = next((t for t, m in enumerate(margin) if m <= 2 * tol), len(want))
    if k < len(want):
        event(f"{what}: near-tie (margin {margin[k]:.1e} <= 2 x {tol:.1e}) at step {k}; compared {k} tokens")
    assert k < len(want) or len(got) == len(want), f"{what}: {len(got)} tokens {got}, the reference {want}"
    assert got[:k] == want[:k], f"{what}: {got} != reference {want} (first {k} steps have clear margins " \
        f"{[f'{m:.1e}' for m in margin[:k]]}, tolerance {tol:.1e})"
    return k


@torch.no_grad()
def hf_greedy(ref, prompts: torch.Tensor, n: int) -> tuple[list[list[int]], list[list[float]], float]:
    """HF's own greedy ``generate`` (its ``DynamicCache``) on a batch ``[B, p]``: per row the new tokens and the
    margins of their logits, and the logit rounding bound."""
    out = ref.generate(prompts, max_new_tokens=n, min_new_tokens=0, do_sample=False, output_logits=True,
                       return_dict_in_generate=True, attention_mask=torch.ones_like(prompts))
    logits = torch.stack(out.logits, 1)  # [B, n, vocab]
    toks = out.sequences[:, prompts.shape[1]:].tolist()
    return toks, [margins(row) for row in logits], logit_bound(ref, logits, score_scale(ref, out.sequences))


@contextmanager
def hf_steer(ref, layer: int, vec: torch.Tensor, positions, kind: str):
    """A plain torch hook on HF block ``layer`` adding ``vec`` to its output (``resid_post``) or input
    (``resid_pre``) at ``positions`` of an uncached forward (None = all; a negative int counts from the end)."""
    block = decoder_layers(ref)[layer]

    def add(h: torch.Tensor) -> torch.Tensor:
        h = h.clone()
        if positions is None:
            h += vec
        else:
            n = h.shape[1]
            idx = sorted({p % n for p in positions if -n <= p < n})
            h[:, idx] += vec
        return h

    def post(module, args, output):
        if isinstance(output, tuple):
            return (add(output[0]), *output[1:])
        return add(output)

    def pre(module, args, kwargs):
        if args:
            return (add(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": add(kwargs["hidden_states"])}

    handle = (block.register_forward_hook(post) if kind == "resid_post"
              else block.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def steered_greedy(ref, prompt: list[int], n: int, layer: int, vec: torch.Tensor, positions, kind: str):
    """Greedy with a full uncached forward per token under `hf_steer`: ``(tokens, margins, logit bound)``."""
    ids, marg, big = list(prompt), [], 0.0
    with hf_steer(ref, layer, vec, positions, kind):
        for _ in range(n):
            logits = ref(torch.tensor([ids]), use_cache=False).logits[0, -1]
            big = max(big, float(logits.abs().max()))
            marg.append(margins(logits[None])[0])
            ids.append(int(logits.argmax()))
        scores = score_scale(ref, torch.tensor([ids]))
    return ids[len(prompt):], marg, bound(ref, dims(ref)[1] + 1, big, scores)


@torch.no_grad()
def hf_kv(ref, ids: torch.Tensor) -> tuple[list[tuple[int, torch.Tensor, torch.Tensor]], float]:
    """Per layer ``(first position held, keys, values)`` of HF's ``DynamicCache`` after one forward of ``ids``
    ``[B, n]`` (a sliding-window layer holds only the last positions), and the forward's `score_scale`."""
    pkv = ref(ids, use_cache=True).past_key_values
    n = ids.shape[1]
    return [(n - layer.keys.shape[2], layer.keys, layer.values) for layer in pkv.layers], score_scale(ref, ids)


@torch.no_grad()
def check_hidden(ref, ids: torch.Tensor, acts: list[torch.Tensor], what: str) -> None:
    """Compare captured resid_post ``acts[l]`` ``[B, n, d]`` of every block with HF's hidden states of ``ids``
    ``(embeddings, block 0, ..., final norm of the last block)`` within the rounding bound."""
    _, n_layers = dims(ref)
    hidden, scores = ref(ids, output_hidden_states=True).hidden_states, score_scale(ref, ids)
    for layer in range(n_layers):
        got = acts[layer]
        want = hidden[layer + 1]
        if layer == n_layers - 1:  # HF's last hidden state is after the final norm: apply HF's own norm to ours
            got = final_norm(ref)(got)
        assert got.shape == want.shape, f"{what}: block {layer} captured {tuple(got.shape)}, HF {tuple(want.shape)}"
        tol = bound(ref, layer + 1, float(want.abs().max()), scores)
        d = float((got - want).abs().max())
        assert d <= tol, f"{what}: block {layer} resid_post differs from HF's hidden state by {d:.2e} > {tol:.2e}"
