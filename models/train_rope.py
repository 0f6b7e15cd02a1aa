"""Train the RoPE backbones: direct answer, chain of thought, and Thinking States, on equal terms.

The three presets share one Llama-architecture backbone (rotary positions, so nothing in the
architecture stops at the trained length), one data stream (the same stories, 1-8 events, drawn
uniformly), one optimiser and one step budget. Only the format differs:

- ``direct-rope``: prompt ``... State ?``, loss on the answer;
- ``cot-rope``: prompt ``... Think :``, loss on the states after each event, then the answer;
- ``thinking``: direct format plus gold thoughts after every chunk (LM loss + thought loss).

>>> cfg = RopeTrainConfig(preset="thinking", steps=1, batch_size=2, eval_n=0, d_model=32, n_layers=2)
>>> model, tok, card = train_rope(cfg)
>>> card["kind"], card["steps"]
('thinking', 1)
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from beliefscope.base.files import atomic_write_json, check_writable_parent, staged_output

from ..tasks import get_task
from .devices import HOST, default_device
from .evaluate import evaluate_bands
from .lm_batch import make_batch as lm_batch
from .thinking import ThinkingConfig, ThinkingStates
from .thinking.data import make_batch as thinking_batch
from .tokenizer import toy_tokenizer
from .train_state import load_state, save_state

ROPE_PRESETS = ("direct-rope", "cot-rope", "thinking")
# Fields that may differ between a run and its resumption (they do not change the trajectory).
RESUME_FREE = ("threads", "eval_n", "log_every", "checkpoint_every", "device")


# Randomised position range per task: at least the token length of the longest evaluated story, so
# every relative distance met in evaluation was seen in training (coinflip at 64 events is ~200
# tokens, cups at 64 swaps ~330, variables at 100 updates ~420).
TASK_POSITIONS = {"coinflip": 256, "cups": 512, "variables": 1024}
# Cups trained with "fixed" spread fit its training data (loss 4e-4) but scored 0.61 on 1-8 swaps at
# test time, with contiguous positions: which cups the current sentence names is found by relative
# distance, and gap-1 distances were rare in training. "mixed" shows both (coinflip keeps its run).
TASK_SPREAD = {"coinflip": "fixed", "cups": "mixed", "variables": "mixed"}


@dataclass
class RopeTrainConfig:
    """Everything that determines a trained RoPE checkpoint."""

    preset: str = "thinking"  # direct-rope / cot-rope / thinking
    task: str = "coinflip"  # task family (tasks.get_task)
    steps: int = 1000  # optimiser steps (the same for every preset)
    batch_size: int = 64  # stories per step
    lr: float = 1e-3  # peak AdamW learning rate (linear warm-up, then linear decay to 10%)
    warmup: int = 150  # warm-up steps
    weight_decay: float = 0.01  # AdamW weight decay
    min_events: int = 1  # shortest story in training
    max_events: int | None = None  # longest story in training (longer ones are held out); None: the task's own
    n_layers: int = 4  # backbone blocks
    d_model: int = 128  # residual width
    n_heads: int = 4  # attention heads
    n_ctx: int = 4096  # rotary positions the config admits (not trained: RoPE is relative)
    l_in: int = 1  # thinking: S is added at blocks.{l_in}.hook_resid_pre
    l_out: int = -2  # thinking: T reads blocks.{l_out}.hook_resid_post (-2: second-to-last)
    chunking: str = "events"  # thinking: "events" (a chunk per event) or "fixed"
    chunk_size: int = 8  # thinking: tokens per chunk when chunking is "fixed"
    empty_thoughts: bool = False  # thinking: a chunk that leaves the state as it was gets a bare <eos> thought
    #   and S carries over (what speculative prefill in decoding.thinking exploits)
    random_positions: int | None = None  # position ids are a sorted random subset of [0, N) in training
    #   (randomized positional encodings, Ruoss et al. 2023), so relative distances up to N are seen;
    #   0 = plain 0..T-1; None = the task's default (TASK_POSITIONS: longer than its longest test story)
    position_spread: str | None = None  # "fixed": every row draws from [0, N); "mixed": each row from [0, N_row),
    #   N_row log-uniform in [T, N], so dense (test-like, gap 1) and sparse spacings are both seen; None: the task's
    seed: int = 0  # seeds the weights and the data stream
    threads: int = 1  # torch CPU threads (1: OpenMP threads thrash on a shared 2-core machine)
    eval_n: int = 200  # held-out prompts per length band for the model card (0 skips it)
    log_every: int = 25  # steps between progress reports
    checkpoint_every: int = 250  # steps between resumable states in OUT/train_state.pt (with an output folder)
    device: str | None = None  # where the steps run: None is the CLI's --device, else CUDA when available, else
    #   the CPU (weights are initialised and the data drawn on the CPU, so every device starts alike)

    def __post_init__(self):
        if self.random_positions is None:
            self.random_positions = TASK_POSITIONS.get(self.task, 256)
        if self.position_spread is None:
            self.position_spread = TASK_SPREAD.get(self.task, "fixed")
        if self.position_spread not in ("fixed", "mixed"):
            raise ValueError(f"position_spread={self.position_spread!r} is unknown: use 'fixed' or 'mixed'")
        if self.max_events is None:
            self.max_events = get_task(self.task).train_events[1]


def backbone_config(cfg: RopeTrainConfig, vocab_size: int):

    return LlamaConfig(vocab_size=vocab_size, hidden_size=cfg.d_model, intermediate_size=4 * cfg.d_model,
                       num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                       num_key_value_heads=cfg.n_heads, max_position_embeddings=cfg.n_ctx, bos_token_id=1,
                       eos_token_id=1, pad_token_id=0, tie_word_embeddings=False, attn_implementation="sdpa")


def build(cfg: RopeTrainConfig):
    """A fresh ``(model, tokenizer)`` for the preset: a LlamaForCausalLM, or ThinkingStates over one."""

    if cfg.preset not in ROPE_PRESETS:
        raise ValueError(f"preset {cfg.preset!r} is not a RoPE preset; choose one of {ROPE_PRESETS}")
    torch.manual_seed(cfg.seed)
    tok = toy_tokenizer()
    backbone = LlamaForCausalLM(backbone_config(cfg, len(tok)))
    if cfg.preset != "thinking":
        return backbone, tok
    words = getattr(get_task(cfg.task), "thought_words", 1)  # state words per thought (variables: one per variable)
    tcfg = ThinkingConfig(l_in=cfg.l_in, l_out=cfg.l_out, chunking=cfg.chunking, chunk_size=cfg.chunk_size,
                          max_thought=max(3, words + 1), empty_unchanged=cfg.empty_thoughts)
    return ThinkingStates(backbone, tok, tcfg), tok


def random_positions(shape, n: int, spread: str = "fixed") -> torch.Tensor | None:
    """``[B, T]`` position ids: each row a sorted random subset of ``range(n)`` (None when n is 0);
    with ``spread="mixed"`` each row draws from ``range(n_row)``, ``n_row`` log-uniform in ``[T, n]``.

    >>> p = random_positions((2, 5), 100)
    >>> bool((p[:, 1:] > p[:, :-1]).all()) and int(p.max()) < 100
    True
    >>> bool((random_positions((64, 5), 100, "mixed").max(1).values < 99).any())
    True
    """
    B, T = shape
    if not n:
        return None
    if n < T:
        raise ValueError(f"random_positions={n} is shorter than a training sequence ({T} tokens); raise it")
    if spread == "fixed":
        return torch.rand(B, n).topk(T, dim=1).indices.sort(dim=1).values
    span = torch.exp(torch.empty(B, 1).uniform_(math.log(T), math.log(n + 1)))  # [B, 1] log-uniform range
    keys = torch.rand(B, n).masked_fill(torch.arange(n)[None] >= span, -1.0)  # [B, n] out-of-range never drawn
    return keys.topk(T, dim=1).indices.sort(dim=1).values


def rope_rebuild_command(cfg: RopeTrainConfig) -> str:
    """The `beliefscope train` command that trains ``cfg`` again: the preset and task, then every
    flag whose value differs from the default (a card that said only the preset of a 3000-step run
    rebuilt a 1000-step one).

    >>> rope_rebuild_command(RopeTrainConfig(preset="thinking", task="variables", steps=9000))
    'beliefscope train --preset thinking --task variables --steps 9000 --out DIR'
    """
    base = RopeTrainConfig(preset=cfg.preset, task=cfg.task)
    flags = [f"--task {cfg.task}"] if cfg.task != "coinflip" else []
    flags += [f"--{k.replace('_', '-')} {getattr(cfg, k)}" for k in ("steps", "lr", "seed", "max_events")
              if getattr(cfg, k) != getattr(base, k)]
    flags += ["--empty-thoughts"] if cfg.empty_thoughts else []
    return " ".join([f"beliefscope train --preset {cfg.preset}", *flags, "--out DIR"])


def train_rope(cfg: RopeTrainConfig, out: str | None = None, progress: Callable[[dict], None] | None = None):
    """Train one preset; save to `out` atomically if given. Returns (model, tokenizer, card).

    With `out`, the run is resumable: every ``checkpoint_every`` steps its state goes to
    ``out/train_state.pt`` (`models.train_state`), and a run started again with the same settings
    continues from there; ``progress`` then gets ``{"resumed_from": step}`` first."""

    torch.set_num_threads(cfg.threads)
    device = default_device(cfg.device)
    model, tok = build(cfg)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    fmt = "cot" if cfg.preset == "cot-rope" else "direct"
    task = get_task(cfg.task, fmt=fmt)
    rng = random.Random(cfg.seed)
    start, history = 0, []
    if out:

        out = check_writable_parent(out)
        if os.path.isfile(out):
            raise ValueError(f"output {out} is an existing file; give a folder path")
        start, history = load_state(out, cfg, dict(model.named_parameters()), opt, free=RESUME_FREE, rng=rng)
        if start and progress:
            progress({"resumed_from": start})
    t0 = time.time() - (history[-1]["seconds"] if history else 0.0)
    model.train()
    for step in range(start + 1, cfg.steps + 1):
        frac = min(1.0, step / cfg.warmup) * (1 - 0.9 * max(0.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)))
        for g in opt.param_groups:
            g["lr"] = cfg.lr * frac
        exs = [task.example(rng.randrange(10**12), rng.randint(cfg.min_events, cfg.max_events))
               for _ in range(cfg.batch_size)]
        if cfg.preset == "thinking":
            batch = thinking_batch(exs, tok, model.thinking_config, device=device)
            pos = random_positions(batch.ids.shape, cfg.random_positions, cfg.position_spread)
            loss, parts = model.loss(batch, position_ids=None if pos is None else pos.to(device))
        else:
            ids, lab, mask = lm_batch(tok, exs, device=device)
            pos = random_positions(ids.shape, cfg.random_positions, cfg.position_spread)
            loss = model(input_ids=ids, attention_mask=mask, labels=lab,
                         position_ids=None if pos is None else pos.to(device)).loss
            parts = {"lm": loss.item()}
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % cfg.log_every == 0 or step == cfg.steps:
            history.append({"step": step, "loss": round(loss.item(), 4), **{k: round(v, 4) for k, v in parts.items()},
                            "seconds": round(time.time() - t0, 1), "device": _device_name(device)})
            if progress:
                progress(history[-1])
        if out and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
            os.makedirs(out, exist_ok=True)
            save_state(out, step, dict(model.named_parameters()), opt, history, cfg, rng=rng)
    model.eval()
    card = {"kind": "thinking" if cfg.preset == "thinking" else "lm", "rendering": "toy",
            "train_config": asdict(cfg), "steps": cfg.steps, "history": history,
            "rebuild": rope_rebuild_command(cfg), "trained_on": trained_on(history)}
    if cfg.preset == "thinking":
        card["thinking_config"] = asdict(model.thinking_config)
    if cfg.eval_n:

        card["eval"] = evaluate_bands(model, tok, cfg.task, cfg.eval_n, fmt=fmt)
    if out:
        save_rope(model, tok, card, out)
    return model, tok, card


def trained_on(history: list[dict]) -> str:
    """Which device ran which steps, from the history (a run resumed elsewhere names both).

    >>> trained_on([{"step": 25, "device": "cpu"}, {"step": 50, "device": "cpu"}, {"step": 75, "device": "H100"}])
    'cpu (steps 1-50), H100 (steps 51-75)'
    """
    spans, first = [], 1
    for i, h in enumerate(history):
        if i + 1 == len(history) or history[i + 1].get("device") != h.get("device"):
            spans.append(f"{h.get('device', HOST.type)} (steps {first}-{h['step']})")
            first = h["step"] + 1
    return ", ".join(spans)


def _device_name(device: torch.device) -> str:
    """``cpu``, or the GPU's name (what a card says its steps ran on; results differ in the last bits)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def save_rope(model, tok, card: dict, out: str) -> None:
    """save_pretrained (+ thinking.safetensors for Thinking States) into a folder, atomically."""

    with staged_output(out) as tmp:
        backbone = getattr(model, "backbone", model)
        backbone.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if card.get("kind") == "thinking":
            save_file({k: v.detach().to(HOST).contiguous() for k, v in model.thinking_state_dict().items()},
                      os.path.join(tmp, "thinking.safetensors"))
        atomic_write_json(os.path.join(tmp, "model_card.json"), json.loads(json.dumps(card, default=str)))
