"""The methods ``benchmarks.spec`` times: our plain greedy (packed and default kernels), our drafters
(fixed, adaptive and variable windows, token trees) and HF ``generate`` with the matching assistance,
each as a runner ``prompt_ids -> (tokens, Generation | None)``, run on every prompt in rotating order."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..decoding.config import SpecConfig
from ..decoding.drafters import make_drafter
from ..decoding.loop import generate
from ..decoding.speculative import speculative_generate
from ..models.packed import packing_disabled

if TYPE_CHECKING:
    from .spec_config import SpecBenchConfig


@dataclass
class Method:
    """One way of decoding: ours (a drafter spec and gamma, or plain) or HF generate with kwargs."""

    name: str  # row label, e.g. "ours ngram:3 g=4" or "hf prompt_lookup"
    kind: str  # "plain", "ours" or "hf"
    drafter: str = "none"  # our drafter spec
    gamma: object = 4  # our gamma (int or "auto")
    hf_kwargs: dict = field(default_factory=dict)  # extra kwargs of HF generate
    matches: str | None = None  # for HF rows: the drafter spec of ours it corresponds to
    times: list = field(default_factory=list)  # seconds per prompt
    outputs: list = field(default_factory=list)  # generated tokens per prompt
    gens: list = field(default_factory=list)  # our Generation per prompt (None for HF)
    max_prompts: int | None = None  # run on the first N prompts only (None = all)
    error: str | None = None  # why this method could not run (HF assistance unsupported for the model)
    fixed_window: bool = True  # ours: pad every verify to gamma + 1 (exact) or not (padded to verify_widths)
    tree: object = None  # ours: a decoding.TreeConfig (token trees, variable widths), or None for chains



DEFAULT_KERNELS = "ours plain greedy, default kernels"  # row name: plain greedy with F.linear instead of packed weights


def build_methods(drafters, gammas, draft_available: bool, cfg: SpecBenchConfig, auto_only=None,
                  fixed_only=None, slow=(), slow_prompts=None, variable=(), trees=None,
                  packed: bool = False) -> list[Method]:
    methods = [Method("ours plain greedy", "plain")]
    if packed:
        methods.append(Method(DEFAULT_KERNELS, "plain-default"))
    for d in drafters:
        if d == "draft" and not draft_available:
            continue
        for g in gammas:
            if g == "auto" and auto_only is not None and d not in auto_only:
                continue
            if g != "auto" and fixed_only is not None and d not in fixed_only:
                continue
            methods.append(Method(f"ours {d} g={g}", "ours", d, g, max_prompts=slow_prompts if d in slow else None))
    for d, g in variable:
        methods.append(Method(f"ours {d} g={g} var", "ours", d, g, fixed_window=False))
    for d, tree in (trees or {}).items():
        methods.append(Method(f"ours {d} tree n={tree.nodes} var", "ours", d, "tree", fixed_window=False, tree=tree))
    methods.append(Method("hf greedy", "hf"))
    if draft_available and "draft" in drafters:
        methods.append(Method("hf assistant_model", "hf", hf_kwargs={"assistant_model": None}, matches="draft"))
    for d in drafters:
        if d.startswith("early-exit:"):
            methods.append(Method(f"hf assistant_early_exit={d.split(':')[1]}", "hf",
                                  hf_kwargs={"assistant_early_exit": int(d.split(":")[1])}, matches=d,
                                  max_prompts=slow_prompts if d in slow else None))
    if any(d.startswith("ngram") for d in drafters):
        methods.append(Method("hf prompt_lookup", "hf", hf_kwargs={
            "prompt_lookup_num_tokens": cfg.hf_prompt_lookup_tokens,
            "max_matching_ngram_size": cfg.hf_max_matching_ngram},
            matches=next(d for d in drafters if d.startswith("ngram"))))
    return methods


def make_runner(m: Method, target, draft, n_new: int, stop_at_eos: bool = False, widths=None):
    """A function prompt_ids [n] -> (tokens, Generation | None) for method ``m``."""

    if m.kind in ("plain", "plain-default"):
        cfg = SpecConfig(max_new_tokens=n_new, stop_at_eos=stop_at_eos)
        if m.kind == "plain-default":  # the same model with its packed linears switched back to F.linear

            def run_default(ids):
                with packing_disabled(target):
                    return _tokens(generate(target, ids, cfg))
            return run_default
        return lambda ids: _tokens(generate(target, ids, cfg))
    if m.kind == "ours":
        drafter = make_drafter(m.drafter, target, load=lambda _: (draft,))
        cfg = SpecConfig(gamma=4 if m.tree else m.gamma, max_new_tokens=n_new, stop_at_eos=stop_at_eos,
                         fixed_window=m.fixed_window, verify_widths=None if m.fixed_window else widths, tree=m.tree)
        return lambda ids: _tokens(speculative_generate(target, drafter, ids, cfg))
    kwargs = dict(m.hf_kwargs)
    if "assistant_model" in kwargs:
        kwargs["assistant_model"] = draft
    pad = target.generation_config.pad_token_id
    pad = pad if pad is not None else 0
    eos = _eos(target) if stop_at_eos else None

    @torch.no_grad()
    def run(ids):
        x = ids[None]  # [1, n]
        n_layers = target.config.num_hidden_layers
        try:
            out = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n_new,
                                  do_sample=False, eos_token_id=eos, pad_token_id=pad, **kwargs)
        finally:  # HF early exit lowers num_hidden_layers and does not restore it when drafting fails
            target.config.num_hidden_layers = n_layers
        return out[0, x.shape[1]:].tolist(), None
    return run


def _eos(target):
    e = target.generation_config.eos_token_id
    return e if e is not None else target.config.eos_token_id


def _tokens(gen):
    return gen.tokens, gen


def run_model(target, draft, prompts: list[torch.Tensor], methods: list[Method], n_new: int, progress=None,
              stop_at_eos: bool = False, widths=None) -> None:
    """Run every method on every prompt (rotating order per prompt), filling times/outputs/gens."""
    runners = [make_runner(m, target, draft, n_new, stop_at_eos, widths) for m in methods]
    for m in methods:  # warm-up on the start of the first prompt, 4 tokens; HF may not support a kind
        try:
            make_runner(m, target, draft, min(4, n_new), stop_at_eos, widths)(
                prompts[0][:8] if prompts[0].numel() > 8 else prompts[0])
        except Exception as e:
            if m.kind != "hf":
                raise
            m.error = f"{type(e).__name__}: {str(e)[:200]}"
    keep = [i for i, m in enumerate(methods) if not m.error]
    failed = [m for m in methods if m.error]
    methods[:] = [methods[i] for i in keep] + failed
    runners = [runners[i] for i in keep]
    n_run = len(runners)
    for i, ids in enumerate(prompts):
        order = list(range(n_run))
        order = order[i % len(order):] + order[: i % len(order)]
        for j in order:
            if methods[j].max_prompts is not None and i >= methods[j].max_prompts:
                continue
            t0 = time.perf_counter()
            toks, gen = runners[j](ids)
            methods[j].times.append(time.perf_counter() - t0)
            methods[j].outputs.append(list(toks))
            methods[j].gens.append(gen)
            if progress:
                progress(1)
