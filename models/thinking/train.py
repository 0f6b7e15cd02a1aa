"""Train Thinking States over a pretrained backbone (``smollm2-thinking``): resumable, on CPU or CUDA.

The same `models.thinking` machinery as the toy ``thinking`` preset, over SmolLM2-135M-Instruct:
natural-English coin-flip stories (train templates and names; evaluation uses the held-out ones),
a chunk per sentence (``.`` ends each event), thoughts " heads" / " tails" then <eos>.

What is trained (``trained``): ``frozen`` trains T, C and the injection only (gradients still flow
through the frozen backbone to the state added at block ``l_in``); ``lora`` adds low-rank adapters
to the backbone; ``full`` trains every weight (its checkpoint holds the whole backbone).

The baselines train in the same loop (``method``): ``smollm2-direct`` and ``smollm2-cot`` give the
backbone the same adapters, stories and steps, with no T or C, and learn to answer in text, directly
or after the state of each event (`models.adapters`).

Training is resumable: every ``checkpoint_every`` steps the trained weights, the optimiser and the
history go to ``OUT/train_state.pt`` (temp file, then rename). The batch of step s is drawn from
``(seed, s)`` alone and the learning rate depends on s alone, so a run killed at any point and
resumed ends where an uninterrupted run ends, with no step lost or repeated. At the end only the
trained parts are written (`models.thinking.ckpt`), composed over the backbone at load time.

>>> cfg = ThinkingTrainConfig(steps=4, checkpoint_every=2)
>>> cfg.lr_at(1) < cfg.lr_at(cfg.warmup) and cfg.lr_at(4) < cfg.lr
True
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from safetensors.torch import load_file

from beliefscope.base.files import atomic_write_json, check_writable_parent

from ...tasks import get_task
from ...tasks.questions import in_chat
from ..adapters import AdaptedLM
from ..cards import read_card
from ..evaluate import evaluate_bands
from ..load import HOST, checkpoints_dir, default_device, load_hf, load_model
from ..lora import add_lora
from ..names import checkpoint_path
from ..train_state import load_state, save_state
from .ckpt import PARTS_FILES, backbone_sha256, save_parts
from .data import make_batch
from .model import ThinkingConfig, ThinkingStates

COST_FILE = "training_cost.json"

# Training settings of the pretrained Thinking States presets (`beliefscope train --preset NAME`).
PRETRAINED_PRESETS = {"smollm2-thinking": {"trained": "lora"},  # + the ThinkingTrainConfig defaults (LoRA q, v, rank 8)
                      # its baselines: the same stories, steps and adapters, answering in text
                      "smollm2-direct": {"method": "direct", "trained": "lora"},
                      "smollm2-cot": {"method": "cot", "trained": "lora"}}
# `beliefscope train` flags of the fields a run may set (models.thinking.cli reads the same ones)
FLAGS = {"task": "--task", "steps": "--steps", "lr": "--lr", "seed": "--seed", "trained": "--trained",
         "batch_size": "--batch-size", "autocast": "--autocast", "lora_rank": "--lora-rank",
         "lora_targets": "--lora-targets", "max_events": "--max-events", "wordings": "--wordings",
         "init_from": "--init-from", "questions": "--questions", "chat": "--chat-share"}
# Fields that may differ between a run and its resumption (they do not change the trajectory).
RESUME_FREE = ("threads", "device", "checkpoint_every", "eval_n")


def rebuild_command(cfg) -> str:
    """The `beliefscope train` command that trains ``cfg`` again: the preset, then every flag whose
    value differs from the preset's.

    >>> rebuild_command(ThinkingTrainConfig(**PRETRAINED_PRESETS["smollm2-thinking"], wordings="wider",
    ...                                     empty_unchanged=True))
    'beliefscope train --preset smollm2-thinking --wordings wider --empty-thoughts --out DIR'
    """
    base = ThinkingTrainConfig(preset=cfg.preset, **PRETRAINED_PRESETS.get(cfg.preset, {}))
    flags = [f"{flag} {getattr(cfg, k)}" for k, flag in FLAGS.items() if getattr(cfg, k) != getattr(base, k)]
    flags += ["--empty-thoughts"] if cfg.empty_unchanged and not base.empty_unchanged else []
    return " ".join([f"beliefscope train --preset {cfg.preset}", *flags, "--out DIR"])


@dataclass
class ThinkingTrainConfig:
    """Everything that determines a Thinking States model trained over a pretrained backbone."""

    preset: str = "smollm2-thinking"  # name recorded in the model card (`beliefscope train --preset`)
    method: str = "thinking"  # "thinking": T, C, injection (+ adapters); "direct" / "cot": adapters answer in text
    backbone: str = "smollm2"  # the pretrained model: a name models.load.load_hf knows, or a folder
    task: str = "coinflip"  # task family (tasks.get_task)
    rendering: str = "natural"  # task rendering the backbone reads ("natural" English, or "toy" in tests)
    wordings: str = "wide"  # natural train sentences: "basic" (2 flip / 2 stay), "wide" (+ 6 / 6 paraphrases)
    #   "wider" (+ 6 / 6 more, with stays that mention flipping: tasks.coinflip.NATURAL_*_MORE) or "widest"
    #   (+ 6 / 6 told by their outcome: tasks.coinflip.NATURAL_*_MOST)
    questions: str = "fixed"  # how stories ask for the answer: "fixed" (two questions ending in "A:") or "varied"
    #   (train-half question forms of tasks.questions, after or before the story, with or without "A:")
    chat: float = 0.0  # share of training stories given as a user turn of the backbone's chat template
    init_from: str | None = None  # warm start: a composed checkpoint (name or folder) of the same method, adapters
    #   and backbone whose trained parts replace the fresh ones before step 1 (a resumed run ignores it)
    trained: str = "frozen"  # "frozen": T, C, injection; "lora": + backbone adapters; "full": every weight
    lora_rank: int = 8  # adapter rank when trained == "lora"
    lora_targets: str = "q_proj,v_proj"  # comma-separated linear layers given adapters (Hu et al.'s default: q, v)
    steps: int = 800  # optimiser steps (the shipped smollm2-thinking: 800, LoRA, bf16 autocast, 1 CPU thread)
    batch_size: int = 8  # stories per step
    lr: float = 1e-3  # peak AdamW learning rate (linear warm-up, then linear decay to 10%)
    warmup: int = 20  # warm-up steps
    weight_decay: float = 0.0  # AdamW weight decay
    min_events: int = 1  # shortest story in training
    max_events: int = 8  # longest story in training (longer ones are held out)
    l_in: int = 1  # S is added at blocks.{l_in}.hook_resid_pre
    l_out: int = -2  # T reads blocks.{l_out}.hook_resid_post (-2: second-to-last)
    chunking: str = "events"  # "events": a chunk per sentence (ends at `boundary`); "fixed": chunk_size tokens
    chunk_size: int = 8  # tokens per chunk when chunking is "fixed"
    boundary: str = "."  # the token that ends an event sentence
    empty_unchanged: bool = False  # the thought after a chunk that keeps the state is a bare <eos>
    autocast: str = "bfloat16"  # "bfloat16": matmuls in bfloat16 under torch.autocast (weights stay float32); "none"
    parts_dtype: str = "float16"  # dtype of the stored trained parts (keeps the checkpoint under 16 MB)
    seed: int = 0  # seeds T/C's random parts and the data stream
    threads: int = 1  # torch CPU threads (1 on a machine shared with other jobs)
    device: str | None = None  # None: CUDA when available, else the CPU
    checkpoint_every: int = 10  # steps between resumable checkpoints (OUT/train_state.pt)
    eval_n: int = 0  # held-out prompts per band evaluated into the model card (0 skips it)

    def lr_at(self, step: int) -> float:
        """Learning rate of optimiser step ``step`` (1-based): a function of the step alone."""
        warm = min(1.0, step / max(1, self.warmup))
        decay = 1 - 0.9 * max(0.0, (step - self.warmup) / max(1, self.steps - self.warmup))
        return self.lr * warm * decay

    def check(self) -> None:
        if self.trained not in ("frozen", "lora", "full"):
            raise ValueError(f"trained={self.trained!r} is unknown: use 'frozen', 'lora' or 'full'")
        if self.method not in ("thinking", "direct", "cot"):
            raise ValueError(f"method={self.method!r} is unknown: use 'thinking', 'direct' or 'cot'")
        if self.method != "thinking" and self.trained == "frozen":
            raise ValueError(f"method={self.method!r} with trained='frozen' trains nothing (no T or C): "
                             "use trained='lora' or 'full'")
        if self.autocast not in ("none", "bfloat16"):
            raise ValueError(f"autocast={self.autocast!r} is unknown: use 'none' or 'bfloat16'")
        if not 0.0 <= self.chat <= 1.0:
            raise ValueError(f"chat={self.chat} is a share of the stories: use a number from 0 to 1")
        if self.steps < 1 or self.batch_size < 1 or self.checkpoint_every < 1:
            raise ValueError(f"steps ({self.steps}), batch_size ({self.batch_size}) and checkpoint_every "
                             f"({self.checkpoint_every}) must all be >= 1")


def build(cfg: ThinkingTrainConfig, device=None, backbone=None):
    """``(ThinkingStates, tokenizer, backbone_sha256)`` with only the chosen parts requiring grad.
    ``backbone``: an already loaded ``(model, tokenizer)`` pair to reuse (float32, unmodified)."""

    cfg.check()
    device = default_device(device if device is not None else cfg.device)
    hf, tok = backbone if backbone is not None else load_hf(cfg.backbone, device=HOST, dtype=torch.float32)
    digest = backbone_sha256(hf)
    torch.manual_seed(cfg.seed)
    tcfg = ThinkingConfig(l_in=cfg.l_in, l_out=cfg.l_out, chunking=cfg.chunking, chunk_size=cfg.chunk_size,
                          boundary=cfg.boundary, empty_unchanged=cfg.empty_unchanged)
    if cfg.method == "thinking":
        model = ThinkingStates(hf, tok, tcfg)
    else:

        model = AdaptedLM(hf, tok)
    for p in hf.parameters():
        p.requires_grad_(cfg.trained == "full")
    if cfg.trained == "lora":
        if not add_lora(hf, cfg.lora_rank, targets=tuple(cfg.lora_targets.split(","))):
            raise ValueError(f"lora_targets={cfg.lora_targets!r} names no linear layer of {cfg.backbone!r}: "
                             "use its projection names, e.g. q_proj,v_proj")
    model.name_or_path = cfg.preset
    return model.to(device).train(), tok, digest


def batch_examples(cfg: ThinkingTrainConfig, step: int, tok=None) -> list:
    """The stories of optimiser step ``step``: drawn from ``(seed, step)`` alone; a ``cfg.chat`` share of
    them inside ``tok``'s chat template."""

    split = {"split": "train", "wordings": cfg.wordings} if cfg.rendering == "natural" else {}
    if cfg.questions != "fixed":
        split["questions"] = cfg.questions
    task = get_task(cfg.task, rendering=cfg.rendering, fmt="cot" if cfg.method == "cot" else "direct", **split)
    rng = random.Random(f"thinking-train/{cfg.seed}/{step}")
    out = [task.example(rng.randrange(10**12), rng.randint(cfg.min_events, cfg.max_events))
           for _ in range(cfg.batch_size)]
    if cfg.chat > 0:
        crng = random.Random(f"thinking-chat/{cfg.seed}/{step}")  # its own stream: chat=0 batches stay as they were
        out = [in_chat(ex, tok) if crng.random() < cfg.chat else ex for ex in out]
    return out


def _autocast(cfg: ThinkingTrainConfig, device: torch.device):

    if cfg.autocast == "none":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def train_step(model, tok, cfg: ThinkingTrainConfig, opt, step: int) -> dict:
    """One optimiser step on the batch of `step`; returns its losses and seconds."""

    t0 = time.perf_counter()
    device = next(model.parameters()).device
    for g in opt.param_groups:
        g["lr"] = cfg.lr_at(step)
    examples = batch_examples(cfg, step, tok)
    if cfg.method == "thinking":
        batch = make_batch(examples, tok, model.thinking_config, device=device)
        tokens = int(batch.mask.sum())
    else:
        batch = model.make_batch(examples, device=device)  # (ids, labels, mask)
        tokens = int(batch[2].sum())
    with _autocast(cfg, device):
        loss, parts = model.loss(batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"step": step, "loss": round(loss.item(), 4), **{k: round(v, 4) for k, v in parts.items()},
            "seconds": round(time.perf_counter() - t0, 2), "tokens": tokens}


def check_out(out: str, force: bool = False, need_bytes: int = 0) -> str:
    """Refuse, before step 1, to write over a shipped checkpoint without ``force`` or into a
    folder whose disk lacks ``need_bytes`` free. Returns abspath(out)."""

    out = check_writable_parent(out)
    shipped = os.path.realpath(checkpoints_dir())
    if os.path.realpath(out).startswith(shipped + os.sep) and not force:
        raise ValueError(f"{out} is a shipped checkpoint folder: train into another folder (e.g. runs/NAME) and "
                         "copy the result, or pass --force to write over it")
    probe = out
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    if free < need_bytes:
        raise ValueError(f"{probe} has {free / 2**20:.0f} MiB free but training needs about "
                         f"{need_bytes / 2**20:.0f} MiB for its checkpoints: free space or choose another --out")
    return out


def _trained_named(model) -> dict:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def warm_start(model, name_or_path: str, digest: str) -> None:
    """Copy a composed checkpoint's trained parts (T, C, the injection, LoRA weights) into ``model``,
    whose trained parameters must be exactly those parts; refused by name on another backbone."""

    path = checkpoint_path(name_or_path)
    card = read_card(path)
    if card.get("backbone_sha256") != digest:
        raise ValueError(f"init_from={name_or_path!r} was trained over another backbone (weights hash "
                         f"{str(card.get('backbone_sha256'))[:16]}..., this one {digest[:16]}...): warm-start from a "
                         "checkpoint of the same backbone, or leave init_from unset")
    parts = load_file(os.path.join(path, PARTS_FILES[card.get("kind", "thinking")]))
    named = _trained_named(model)
    if set(parts) != set(named):
        raise ValueError(f"init_from={name_or_path!r} holds other trained parts than this model "
                         f"(e.g. {sorted(set(parts) ^ set(named))[:3]}): warm-start from a checkpoint trained with "
                         "the same method, trained parts, lora_rank and lora_targets")
    with torch.no_grad():
        for n, p in named.items():
            p.copy_(parts[n].to(p.dtype))


def train_thinking(cfg: ThinkingTrainConfig, out: str, progress: Callable[[dict], None] | None = None,
                   force: bool = False, backbone=None):
    """Train (or resume) into `out`; at the end write the parts-only checkpoint there.

    ``progress(event)`` gets ``{"resumed_from": step}`` once, then every step's record.
    Returns ``(model, tokenizer, card)``."""

    cfg.check()
    torch.set_num_threads(cfg.threads)
    model, tok, digest = build(cfg, backbone=backbone)
    trained = list(_trained_named(model).values())
    check_out(out, force, need_bytes=4 * sum(p.numel() for p in trained) * 4)  # weights, 2 Adam moments, temp
    os.makedirs(out, exist_ok=True)
    opt = torch.optim.AdamW(trained, lr=cfg.lr, weight_decay=cfg.weight_decay)
    start, history = load_state(out, cfg, _trained_named(model), opt, free=RESUME_FREE)
    if start == 0 and cfg.init_from:
        warm_start(model, cfg.init_from, digest)
    if progress:
        progress({"resumed_from": start})
    model.train()
    for step in range(start + 1, cfg.steps + 1):
        history.append(train_step(model, tok, cfg, opt, step))
        if progress:
            progress(history[-1])
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            save_state(out, step, _trained_named(model), opt, history, cfg)
    model.eval()
    card = {"rendering": cfg.rendering, "train_config": asdict(cfg), "steps": cfg.steps, "history": history,
            **({"thinking_config": asdict(model.thinking_config)} if cfg.method == "thinking" else {}),
            "method": cfg.method, "trained": cfg.trained,
            "rebuild": rebuild_command(cfg)}
    cost = os.path.join(out, COST_FILE)
    if os.path.exists(cost):

        with open(cost) as f:
            card["training_cost"] = json.load(f)
    if cfg.trained == "lora":
        card["lora_rank"], card["lora_targets"] = cfg.lora_rank, cfg.lora_targets
    card = save_parts(model, out, card, cfg.backbone, digest, getattr(torch, cfg.parts_dtype),
                      kind="thinking" if cfg.method == "thinking" else "adapters")
    if cfg.eval_n:

        loaded, ltok = load_model(out, device=cfg.device)  # evaluate what ships (parts in parts_dtype)
        card["eval"] = evaluate_bands(loaded, ltok, cfg.task, cfg.eval_n, bands=("1-8", "9-16", "17-32"),
                                      fmt="cot" if cfg.method == "cot" else "direct",
                                      rendering=cfg.rendering)
        atomic_write_json(os.path.join(out, "model_card.json"), card)
    return model, tok, card


# Options `measure_costs` times by default: (label, what is trained, autocast)
COST_OPTIONS = (("full", "full", "none"), ("lora", "lora", "none"), ("frozen", "frozen", "none"),
                ("frozen-bf16", "frozen", "bfloat16"))


def measure_costs(cfg: ThinkingTrainConfig, options=COST_OPTIONS, steps: int = 3, events: int = 8,
                  progress: Callable[[dict], None] | None = None) -> dict:
    """Seconds per optimiser step of each option on the same batches (``cfg.batch_size`` stories of
    ``events`` events), the backbone loaded once. ``{label: {"seconds": [...], "trained_params": n}}``."""

    torch.set_num_threads(cfg.threads)
    hf, tok = load_hf(cfg.backbone, device=HOST, dtype=torch.float32)
    table = {}
    for label, trained, autocast in options:
        ocfg = dataclasses.replace(cfg, trained=trained, autocast=autocast, min_events=events, max_events=events)
        model, _, _ = build(ocfg, backbone=(copy.deepcopy(hf), tok))
        params = list(_trained_named(model).values())
        opt = torch.optim.AdamW(params, lr=ocfg.lr)
        recs = [train_step(model, tok, ocfg, opt, s) for s in range(1, steps + 1)]
        table[label] = {"trained": trained, "autocast": autocast, "trained_params": sum(p.numel() for p in params),
                        "seconds": [r["seconds"] for r in recs], "tokens": recs[0]["tokens"],
                        "batch_size": ocfg.batch_size, "threads": ocfg.threads,
                        "device": str(next(model.parameters()).device)}
        if progress:
            progress({"option": label, **table[label]})
        del model, opt
    return table
