"""Train toy GPT-2 models on the state-tracking tasks, with a length curriculum.

Plain training stalls on state tracking (a 4-layer model stayed at chance on the direct answer
without a curriculum), so the maximum number of events grows from 1 to `max_events` each time
the model answers the current lengths well.

>>> cfg = TrainConfig(preset="tiny", steps=2, batch_size=4)
>>> cfg.model_config(vocab_size=32).n_layer
1
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from ..tasks import get_task
from .evaluate import evaluate
from .lm_batch import make_batch
from .tokenizer import toy_tokenizer

PRESETS = {
    # name: (n_layer, n_embd, n_head); all share n_positions so the cache benchmark reaches 4096
    "target": (4, 128, 4),
    "draft": (1, 64, 2),
    "tiny": (1, 32, 2),
}

# Training settings of the shipped checkpoints, so `beliefscope train --preset P` rebuilds them.
# (Target at lr 1e-3 stalled at 4 events for 1,000+ steps; 3e-4 with 40% CoT went through.)
PRESET_TRAINING = {
    "target": {"lr": 3e-4, "steps": 9000, "seed": 2, "cot_fraction": 0.4},
    "draft": {"lr": 1e-3, "steps": 3000, "seed": 0, "cot_fraction": 0.5},
    "tiny": {"lr": 1e-3, "steps": 500, "seed": 0, "cot_fraction": 0.5},
}


@dataclass
class TrainConfig:
    """Everything that determines a trained toy checkpoint."""

    task: str = "coinflip"  # task family name (tasks.get_task)
    preset: str = "target"  # architecture preset: target / draft / tiny
    steps: int = 6000  # maximum optimizer steps (training stops early once the curriculum is done)
    batch_size: int = 64  # sequences per step
    lr: float = 1e-3  # peak AdamW learning rate
    weight_decay: float = 0.01  # AdamW weight decay
    warmup: int = 200  # linear warm-up steps
    max_events: int = 8  # longest story seen in training (held-out lengths are longer)
    cot_fraction: float = 0.5  # share of chain-of-thought examples (the rest direct answer)
    promote_at: float = 0.97  # direct-answer accuracy on the current max length that unlocks +1 event
    check_every: int = 100  # steps between curriculum checks
    finish_steps: int = 1500  # steps trained after the curriculum reaches max_events
    n_positions: int = 4608  # context length (positions beyond training lengths are untrained)
    seed: int = 0  # seeds torch and the data stream
    threads: int = 2  # torch CPU threads
    eval_n: int = 500  # held-out prompts per format for the model card's eval (0 skips it)
    extra: dict = field(default_factory=dict)  # free-form notes copied into the model card

    def model_config(self, vocab_size: int) -> GPT2Config:
        if self.preset not in PRESETS:
            raise ValueError(f"preset {self.preset!r} is unknown; choose one of {sorted(PRESETS)}")
        n_layer, n_embd, n_head = PRESETS[self.preset]
        return GPT2Config(vocab_size=vocab_size, n_positions=self.n_positions, n_embd=n_embd,
                          n_layer=n_layer, n_head=n_head, bos_token_id=1, eos_token_id=1,
                          pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


@torch.no_grad()
def direct_accuracy(model, tok, task_name: str, n: int, seed: int, events) -> float:
    """Next-token accuracy of the answer word on direct-format prompts (left padded)."""
    exs = get_task(task_name, fmt="direct").examples(n, seed, events)
    enc = tok([e.prompt for e in exs], return_tensors="pt", padding=True)
    pos = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], position_ids=pos).logits
    pred = logits[:, -1].argmax(-1)  # [batch]
    gold = torch.tensor([tok(e.completion)["input_ids"][0] for e in exs])
    return (pred == gold).float().mean().item()


def train(cfg: TrainConfig, out: str | None = None, progress: Callable[[dict], None] | None = None):
    """Train a toy GPT-2 for `cfg`; save to `out` (atomically) if given. Returns (model, tok, card)."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tok = toy_tokenizer()
    model = GPT2LMHeadModel(cfg.model_config(len(tok)))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = random.Random(cfg.seed)
    tasks = {fmt: get_task(cfg.task, fmt=fmt) for fmt in ("direct", "cot")}
    cur_max, finished_at, history = 1, None, []
    step = 0
    for step in range(1, cfg.steps + 1):
        lr = cfg.lr * min(1.0, step / cfg.warmup)
        if finished_at is not None:  # cosine-free linear decay during the finishing phase
            lr *= max(0.05, 1 - (step - finished_at) / cfg.finish_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        exs = []
        for _ in range(cfg.batch_size):
            # half of the batch at the current frontier length, half spread over shorter ones
            k = cur_max if rng.random() < 0.5 else rng.randint(1, cur_max)
            fmt = "cot" if rng.random() < cfg.cot_fraction else "direct"
            exs.append(tasks[fmt].example(rng.randrange(10**12), k))
        ids, lab, mask = make_batch(tok, exs)
        model.train()
        loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % cfg.check_every == 0:
            model.eval()
            acc = direct_accuracy(model, tok, cfg.task, 128, 10**6 + step, (cur_max, cur_max))
            history.append({"step": step, "loss": round(loss.item(), 4), "max_events": cur_max, "acc": acc})
            if progress:
                progress(history[-1])
            if acc >= cfg.promote_at and cur_max < cfg.max_events:
                cur_max += 1
            elif acc >= cfg.promote_at and finished_at is None:
                finished_at = step
            if finished_at is not None and step - finished_at >= cfg.finish_steps:
                break
    model.eval()
    card = {"train_config": asdict(cfg), "steps": step, "curriculum_reached": cur_max,
            "curriculum_finished_at": finished_at, "history": history,
            "model_config": model.config.to_dict()}
    if cfg.eval_n:
        card["eval"] = card_eval(model, tok, cfg.task, cfg.eval_n, cfg.max_events)
    if out:
        save_checkpoint(model, tok, card, out)
    return model, tok, card


def card_eval(model, tok, task: str, n: int, max_events: int = 8) -> dict:
    """Held-out eval for the model card: trained lengths and the longer held-out lengths."""

    return {f"{lo}-{hi}": evaluate(model, task, f"{lo}-{hi}", n=n, tokenizer=tok)
            for lo, hi in ((1, max_events), (max_events + 1, 2 * max_events))}


def save_checkpoint(model, tok, card: dict, out: str) -> None:
    """save_pretrained + tokenizer + model_card.json, written to a temp folder then renamed."""
    parent = os.path.dirname(os.path.abspath(out)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-ckpt-", dir=parent)
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        with open(os.path.join(tmp, "model_card.json"), "w") as f:
            json.dump(card, f, indent=1, default=str)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
