"""`beliefscope train --preset smollm2-thinking`: Thinking States over a pretrained backbone.

Resumable: re-running the same command continues from ``OUT/train_state.pt``. The progress bar
(stderr) shows the loss and the seconds per step. Every line of output goes through ``echo``
(`models.cli`'s printer), so this module writes nothing itself.

Imports inside the command functions are CLI start-up (said here, as the architecture asks): an area is
imported to register its commands, and each command loads torch and its models only when it runs, so
``beliefscope CMD --help`` answers at once.
"""

from __future__ import annotations

import os


def _config(cfg):
    """The trainer's config from the command's (``models.cli.TrainCommandConfig``): unset fields keep the preset's."""
    from .train import PRETRAINED_PRESETS, ThinkingTrainConfig

    chosen = cfg.chosen("steps", "lr", "seed", "threads", "n_eval", "trained", "batch_size", "checkpoint_every",
                        "autocast", "lora_rank", "lora_targets", "max_events", "wordings", "init_from", "questions",
                        "chat_share")
    if cfg.empty_thoughts:
        chosen["empty_unchanged"] = True
    return ThinkingTrainConfig(preset=cfg.preset, task=cfg.task, **{**PRETRAINED_PRESETS[cfg.preset], **chosen})


def train_pretrained_thinking(cmd, echo) -> dict:
    """Run the command for ``cmd`` (a ``models.cli.TrainCommandConfig``) and return what it wrote;
    ``echo(text, err=True)`` prints the cost measurements' lines on stderr as they come."""
    from beliefscope.base.files import atomic_write_json
    from beliefscope.base.progress import progress_bar, resume_bar

    from .train import COST_FILE, check_out, measure_costs, train_thinking

    cfg = _config(cmd)
    cfg.check()
    check_out(cmd.out, cmd.force)
    if cmd.measure_cost:
        def show(rec):
            if cmd.progress:
                echo(f"{rec['option']:>12}: {', '.join(f'{s:.1f}' for s in rec['seconds'])} s/step "
                     f"({rec['trained_params']:,} trained weights)", err=True)

        table = measure_costs(cfg, progress=show)
        path = os.path.join(cmd.out, COST_FILE)
        atomic_write_json(path, table)
        return {"costs": path, "table": table}
    bar = progress_bar(f"train {cmd.preset}", total=cfg.steps, disable=not cmd.progress, leave=True)
    bar.mininterval = 0  # one step takes seconds: show each

    def progress(rec):
        if "resumed_from" in rec:
            return resume_bar(bar, rec["resumed_from"])
        bar.set_postfix({k: rec[k] for k in ("loss", "lm", "thought") if k in rec} | {"s_per_step": rec["seconds"]},
                        refresh=False)  # the baselines have no thought loss
        bar.update(rec["step"] - bar.n)

    _, _, card = train_thinking(cfg, cmd.out, progress=progress, force=cmd.force)
    bar.close()
    return {"out": cmd.out, "steps": card["steps"], "parts_bytes": card["parts_bytes"], "eval": card.get("eval")}
