"""`beliefscope train --preset smollm2-thinking`: Thinking States over a pretrained backbone.

Resumable: re-running the same command continues from ``OUT/train_state.pt``. The progress bar
(stderr) shows the loss and the seconds per step. Every line of output goes through ``echo``
(`models.cli`'s printer), so this module writes nothing itself.
"""

from __future__ import annotations

import json
import os


def _config(args):
    from beliefscope.models.train_thinking import PRETRAINED_PRESETS, ThinkingTrainConfig

    chosen = {k: getattr(args, k) for k in ("steps", "lr", "seed", "threads", "eval_n", "trained", "batch_size",
                                            "checkpoint_every", "autocast", "lora_rank", "lora_targets", "max_events",
                                            "wordings", "init_from", "questions", "chat")
              if getattr(args, k, None) is not None}  # unset flags keep the preset's value
    if args.empty_thoughts:
        chosen["empty_unchanged"] = True
    return ThinkingTrainConfig(preset=args.preset, task=args.task, **{**PRETRAINED_PRESETS[args.preset], **chosen})


def train_pretrained_thinking(args, echo) -> int:
    """Run the command; ``echo(text, err=False)`` prints a line (on stderr when ``err``)."""
    from beliefscope.models.train_thinking import COST_FILE, check_out, measure_costs, train_thinking
    from beliefscope.base.progress import progress_bar, resume_bar

    from beliefscope.base.files import atomic_write_json

    cfg = _config(args)
    cfg.check()
    check_out(args.out, args.force)
    if args.measure_cost:
        def show(rec):
            if not args.json:
                echo(f"{rec['option']:>12}: {', '.join(f'{s:.1f}' for s in rec['seconds'])} s/step "
                     f"({rec['trained_params']:,} trained weights)", err=True)

        table = measure_costs(cfg, progress=show)
        atomic_write_json(os.path.join(args.out, COST_FILE), table)
        echo(json.dumps(table) if args.json else f"wrote {os.path.join(args.out, COST_FILE)}")
        return 0
    bar = progress_bar(f"train {args.preset}", total=cfg.steps, disable=args.no_progress, leave=True)
    bar.mininterval = 0  # one step takes seconds: show each

    def progress(rec):
        if "resumed_from" in rec:
            return resume_bar(bar, rec["resumed_from"])
        bar.set_postfix({k: rec[k] for k in ("loss", "lm", "thought") if k in rec} | {"s_per_step": rec["seconds"]},
                        refresh=False)  # the baselines have no thought loss
        bar.update(rec["step"] - bar.n)

    _, _, card = train_thinking(cfg, args.out, progress=progress, force=args.force)
    bar.close()
    res = {"out": args.out, "steps": card["steps"], "parts_bytes": card["parts_bytes"], "eval": card.get("eval")}
    if args.json:
        echo(json.dumps(res))
    else:
        echo(f"wrote {args.out} after {card['steps']} steps ({card['parts_bytes'] / 2**20:.1f} MiB of trained "
              "parts over the backbone)")
    return 0
