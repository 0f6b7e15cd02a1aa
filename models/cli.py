"""`beliefscope train` and `beliefscope eval`.

Imports inside the command functions are CLI start-up (said here, as the architecture asks): an area is
imported to register its commands, and each command loads torch and its models only when it runs, so
``beliefscope CMD --help`` answers at once.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from beliefscope.base.config_flags import Command, register_command
from beliefscope.base.files import atomic_write_json, atomic_write_text, check_writable_parent

from .evaluate import EvalConfig
from .profile import model_profile


@dataclass
class TrainCommandConfig:
    """What `beliefscope train` trains; a None field takes the preset's value (models.train's
    PRESET_TRAINING, models.train_rope's ROPE_PRESETS, models.thinking.train's PRETRAINED_PRESETS)."""

    out: str  # checkpoint folder to write
    task: str = "coinflip"  # task family: coinflip, cups or variables
    preset: str = "target"  # target, draft, tiny (GPT-2), direct-rope, cot-rope, thinking (Llama with RoPE) or
    #   smollm2-thinking (Thinking States over SmolLM2-135M-Instruct) and its baselines smollm2-direct, smollm2-cot
    #   (LoRA adapters answering in text)
    steps: int | None = None  # maximum optimizer steps (default: the preset's)
    lr: float | None = None  # peak learning rate (default: the preset's)
    cot_fraction: float | None = None  # share of chain-of-thought examples (default: the preset's)
    max_events: int | None = None  # longest story in training (default: the task's, 8 for coinflip and cups, 10
    #   for variables)
    seed: int | None = None  # seed (default: the preset's)
    threads: int | None = None  # torch CPU threads (default: the preset's; use 1 on a machine shared with other jobs)
    device: str = "auto"  # RoPE and smollm2 presets: where the steps run (cpu, cuda, cuda:N or mps); auto is cuda
    #   when available, else cpu. The GPT-2 presets (target, draft, tiny) train on the cpu
    n_eval: int | None = None  # RoPE presets: held-out prompts per length band evaluated into the model card
    #   (default: the preset's 200; 0 skips the evaluation)
    empty_thoughts: bool = False  # thinking presets: a bare <eos> thought where the state does not change; S
    #   carries over (speculative prefill accepts such chunks without a C call)
    trained: str | None = None  # smollm2-thinking: what is trained (frozen: T, C and the injection; lora, its
    #   default: + adapters on the backbone; full)
    lora_rank: int | None = None  # smollm2-thinking --trained lora: adapter rank (default 8)
    lora_targets: str | None = None  # smollm2-thinking --trained lora: comma-separated layers given adapters
    #   (default q_proj,v_proj)
    batch_size: int | None = None  # smollm2-thinking: stories per step (default 8)
    checkpoint_every: int | None = None  # smollm2-thinking: steps between resumable checkpoints in
    #   OUT/train_state.pt (default 10)
    autocast: str | None = None  # smollm2-thinking: bfloat16 matmuls under torch.autocast (default bfloat16)
    wordings: str | None = None  # smollm2-thinking: natural train sentences (default wide; wider adds stays that
    #   mention flipping; widest adds events told by their outcome; people adds openings that name the face down
    #   or as the subject, and passed turns)
    questions: str | None = None  # smollm2-thinking: how stories ask (fixed: two questions ending in 'A:'; varied:
    #   train-half question forms, after or before the story, with or without 'A:')
    chat_share: float | None = None  # smollm2-thinking: share of stories (0-1) given inside the backbone's chat
    #   template
    init_from: str | None = None  # smollm2-thinking: warm-start from this checkpoint's trained parts (same
    #   backbone and adapters)
    measure_cost: bool = False  # smollm2-thinking: time a few steps of each option (full, lora, frozen,
    #   frozen+bf16), write OUT/training_cost.json (copied into the model card) and stop
    force: bool = False  # allow --out to be a shipped checkpoint folder
    progress: bool = True  # draw the training progress bar (--no-progress: none)

    def chosen(self, *names: str) -> dict:
        """The fields ``names`` that were set, under the trainer configs' names (n_eval -> eval_n,
        chat_share -> chat): an unset one keeps the preset's value."""
        rename = {"n_eval": "eval_n", "chat_share": "chat"}
        return {rename.get(k, k): getattr(self, k) for k in names if getattr(self, k) is not None}


def register(sub) -> None:
    register_command(sub, TRAIN)
    register_command(sub, EVAL)


def _train(cfg: TrainCommandConfig, progress=None) -> dict:
    from beliefscope.base.progress import progress_bar

    from ..tasks import get_task
    from .thinking.train import PRETRAINED_PRESETS
    from .train import PRESET_TRAINING, PRESETS, TrainConfig, train
    from .train_rope import ROPE_PRESETS

    get_task(cfg.task)  # validate the name before spending time
    if cfg.preset in ROPE_PRESETS:
        return _train_rope(cfg)
    if cfg.preset in PRETRAINED_PRESETS:
        from .thinking.cli import train_pretrained_thinking

        return train_pretrained_thinking(cfg, _echo)
    if cfg.preset not in PRESETS:
        raise ValueError(f"preset {cfg.preset!r} is unknown; choose one of "
                         f"{sorted(PRESETS) + list(ROPE_PRESETS) + list(PRETRAINED_PRESETS)}")
    from .devices import HOST, default_device

    if cfg.device != "auto" and default_device(cfg.device) != HOST:
        raise ValueError(f"--device {cfg.device} is for the RoPE and smollm2 presets; preset {cfg.preset!r} "
                         "trains on the cpu: drop --device")
    chosen = cfg.chosen("steps", "lr", "seed", "cot_fraction", "threads")
    tcfg = TrainConfig(task=cfg.task, preset=cfg.preset, max_events=cfg.max_events or 8,
                       **{**PRESET_TRAINING[cfg.preset], **chosen})
    bar = progress_bar(f"train {cfg.preset}", total=tcfg.steps, disable=not cfg.progress, leave=True)

    def progress(h):
        bar.update(tcfg.check_every)
        bar.set_postfix(loss=h["loss"], events=h["max_events"], acc=round(h["acc"], 3))

    _, _, card = train(tcfg, cfg.out, progress=progress)
    bar.close()
    return {"out": cfg.out, "steps": card["steps"], "curriculum_reached": card["curriculum_reached"]}


def _train_lines(res: dict) -> list[str]:
    if "costs" in res:
        return [f"wrote {res['costs']}"]
    if "parts_bytes" in res:
        return [f"wrote {res['out']} after {res['steps']} steps ({res['parts_bytes'] / 2**20:.1f} MiB of trained "
                "parts over the backbone)"]
    acc = {band: r["answer_accuracy"] for band, r in (res.get("eval") or {}).items()}
    return [f"wrote {res['out']} after {res['steps']} steps" + (f"; answer accuracy by events {acc}" if acc else "")]


def _train_rope(cfg: TrainCommandConfig) -> dict:
    from beliefscope.base.files import check_writable_parent
    from beliefscope.base.progress import progress_bar, resume_bar

    from .train_rope import RopeTrainConfig, train_rope

    check_writable_parent(cfg.out)
    rcfg = RopeTrainConfig(preset=cfg.preset, task=cfg.task, max_events=cfg.max_events,
                           empty_thoughts=cfg.empty_thoughts, **cfg.chosen("steps", "lr", "seed", "threads", "n_eval"))
    bar = progress_bar(f"train {cfg.preset}", total=rcfg.steps, disable=not cfg.progress, leave=True)

    def progress(h):
        if "resumed_from" in h:
            return resume_bar(bar, h["resumed_from"])
        bar.update(h["step"] - bar.n)
        bar.set_postfix({k: v for k, v in h.items() if k not in ("step", "seconds")})

    _, _, card = train_rope(rcfg, cfg.out, progress=progress)
    bar.close()
    return {"out": cfg.out, "steps": card["steps"], "eval": card.get("eval")}


TRAIN = Command(
    name="train", config=TrainCommandConfig, run=_train, lines=_train_lines, bars="progress", json_indent=None,
    help="train a toy model: GPT-2 presets with a length curriculum, or the RoPE presets (direct-rope, cot-rope, "
         "thinking) on equal terms; or Thinking States over SmolLM2 (smollm2-thinking: resumable, re-run the same "
         "command to continue)",
    required=("out",), skip=("progress",), renamed={"--eval-n": "--n-eval"},
    choices={"trained": ["frozen", "lora", "full"], "autocast": ["none", "bfloat16"],
             "wordings": ["basic", "wide", "wider", "widest", "people"], "questions": ["fixed", "varied"]},
    as_json=lambda res: res.get("table", res),
    epilog="beliefscope train --preset thinking --steps 20 --n-eval 20 --out my-thinking")


def _eval_prepare(cfg: EvalConfig) -> EvalConfig:
    """Refuse bad values before loading anything; fill the model's rendering and its default format."""
    from dataclasses import replace

    from ..tasks import get_task, parse_events_range

    get_task(cfg.task)
    parse_events_range(cfg.events)
    if cfg.n < 1:
        raise ValueError(f"--n must be at least 1 prompt, got {cfg.n}")
    rendering = cfg.rendering or model_profile(cfg.model).rendering
    used = [f for f, on in ((f"--split {cfg.split}", cfg.split is not None),
                            (f"--questions {cfg.questions}", cfg.questions != "fixed"), ("--chat", cfg.chat)) if on]
    if used and rendering != "natural":
        raise ValueError(f"{' and '.join(used)} {'needs' if len(used) == 1 else 'need'} natural English stories; "
                         f"{cfg.model} uses the {rendering!r} rendering: add --rendering natural, or drop it")
    if cfg.into_card and not cfg.table:
        raise ValueError("--into-card writes the --table into the model card: add --table")
    if cfg.table:
        if rendering != "natural" or cfg.task != "coinflip":
            raise ValueError(f"--table asks natural-English coin stories; {cfg.model} uses the {rendering!r} "
                             f"rendering and --task is {cfg.task}: drop --table")
        if cfg.into_card:
            from .names import checkpoint_path

            folder = checkpoint_path(cfg.model, must_exist=False)
            if folder is None or not os.path.isfile(os.path.join(folder, "model_card.json")):
                raise ValueError(f"--into-card needs a model folder with a model_card.json; {cfg.model} has none")
            check_writable_parent(os.path.join(folder, "model_card.json"))
    if cfg.misses is not None:  # a model that writes no thoughts refuses it once loaded (models.evaluate)
        check_writable_parent(cfg.misses)
    n = cfg.n
    if cfg.split == "free":
        from ..tasks.coinflip_free import free_examples

        n = min(n, len(free_examples()))
        if cfg.format not in (None, "direct") or cfg.task != "coinflip":
            raise ValueError(f"--split free holds direct-answer coin stories: use --task coinflip and --format direct "
                             f"(got --task {cfg.task}, --format {cfg.format})")
    return replace(cfg, rendering=rendering, n=n, format=cfg.format or ("both" if rendering == "toy" else "direct"))


def _eval_total(cfg: EvalConfig) -> int:
    """Prompts the progress bar counts: n per format (a Thinking States model reads each story once)."""
    if cfg.table:
        from .evaluate_free import rows_total

        return rows_total(cfg.n)
    return cfg.n * (1 if model_profile(cfg.model).thinking or cfg.format != "both" else 2)


def _eval_run(cfg: EvalConfig, progress) -> dict:
    from .evaluate import evaluate

    if cfg.table:
        return _eval_table(cfg, progress)
    formats = ("direct", "cot") if cfg.format == "both" else (cfg.format,)
    misses = [] if cfg.misses else None
    res = evaluate(cfg.model, cfg.task, cfg.events, cfg.n, cfg.seed, rendering=cfg.rendering, formats=formats,
                   split=cfg.split, progress=progress, questions=cfg.questions, chat=cfg.chat, misses=misses)
    if cfg.misses:
        atomic_write_text(cfg.misses, "".join(json.dumps(m) + "\n" for m in misses))
        res["misses"] = {"path": cfg.misses, "stories": len(misses)}
    return res


def _eval_table(cfg: EvalConfig, progress) -> dict:
    """`--table`: every row of the question table; with `--into-card`, written into the model's card."""
    from .cards import read_card
    from .evaluate_free import card_with_table, question_table
    from .load import load_model
    from .names import checkpoint_path

    model, tok = load_model(cfg.model)
    full: dict = {}
    table = question_table(model, tok, n=cfg.n, progress=progress, full=full)
    res = {"model": cfg.model, "table": table}
    if cfg.into_card:
        folder = checkpoint_path(cfg.model)
        path = os.path.join(folder, "model_card.json")
        atomic_write_json(path, card_with_table(read_card(folder), table, full), indent=1, sort_keys=False)
        res["card"] = path
    return res


def _eval_lines(res: dict) -> list[str]:
    if "table" in res:
        from .evaluate_free import table_lines

        return [f"{res['model']}: answers and thoughts by how the story asks", *table_lines(res["table"]),
                *([f"written into {res['card']}"] if res.get("card") else [])]
    how = f" [{res['split']}{', varied questions' if res.get('questions') == 'varied' else ''}" \
          f"{', chat' if res.get('chat') else ''}]" if res.get("split") else ""
    extra = "".join(f", {k.replace('_', ' ')} {res[k]:.4f}" for k in ("answer_top1", "answer_follows_thought",
                                                                       "thought_accuracy") if k in res)
    head = (f"{res['task']} {res['events']}{how}: exact match {res.get('exact_match', float('nan')):.4f}, "
            f"answer accuracy {res['answer_accuracy']:.4f}{extra} (n={res['n']})")
    tail = [f"  {res['misses']['stories']} stories with a wrong answer or thought: {res['misses']['path']}"] \
        if res.get("misses") else []
    return [head, *(f"  {k:>2} events: {v:.4f}"
                    for k, v in res.get("exact_match_by_events", res["answer_accuracy_by_events"]).items()), *tail]


EVAL = Command(name="eval", help="exact match and answer accuracy of a model on a task", config=EvalConfig,
               run=_eval_run, lines=_eval_lines, total=_eval_total, unit="eval", prepare=_eval_prepare,
               required=("model",), choices={"split": ["train", "heldout", "all", "free"],
                                             "format": ["both", "direct", "cot"], "rendering": ["toy", "natural"],
                                             "questions": ["fixed", "varied"]},
               epilog="beliefscope eval --model thinking --events 17-32 --n 100 --json")


def _echo(text: str, err: bool = False) -> None:
    """The commands' one printer: a line on stdout, or on stderr (flushed) when ``err``."""
    print(text, file=sys.stderr if err else sys.stdout, flush=err)
