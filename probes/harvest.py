"""Run prompts through a bridge and store activations at every position with per-token labels.

Prompts are batched only with prompts of the same token length, so no padding ever enters an
activation. Each rank of a ``torchrun`` job takes prompts ``rank, rank + N, ...`` and writes its
own shards; rank 0 merges the journals into the manifest at the end::

    torchrun --nproc-per-node 2 -m beliefscope.probes.harvest --model target --n-prompts 400 --out acts/target

Usage (not run as a doctest: it needs stored activations, probes or a model)::

    store = harvest(bridge, tok, examples, ["resid_post"], "all", "acts/x")
    store.manifest["n_rows"] > 0
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
from beliefscope.hooks import layer_names, stream
from beliefscope.models.devices import rank_device
from beliefscope.models.load import load_model
from beliefscope.models.profile import model_profile, model_shapes
from beliefscope.probes.harvest_data import (
    add_data_arguments,
    check_context,
    data_examples,
    fit_to_context,
    load_for_harvest,
    store_dtype,
    store_label_names,
)
from beliefscope.probes.store import DTYPES, LABEL_NAMES, ActivationStore, plan_shards
from beliefscope.probes.twin import checkpoint_hash, random_init_like, random_twin  # noqa: F401 (re-exported)
from beliefscope.tasks import get_task, parse_events_range

from beliefscope.base.files import check_writable_parent
from beliefscope.base.progress import progress_bar

EMBED_HOOK = "blocks.0.hook_resid_pre"  # the input to block 0: what an embedding-only probe reads


@dataclass
class HarvestConfig:
    """What `beliefscope harvest` runs (everything except `out` and speed knobs is hashed)."""

    model: str = "target"  # checkpoint folder, alias ("target", "smollm2"), or hub name
    task: str = "coinflip"  # task family (tasks.get_task)
    rendering: str | None = None  # "toy" or "natural"; None: the model's own (models.profile.model_profile)
    fmt: str = "direct"  # "direct" or "cot"
    split: str = "train"  # natural templates: "train", "heldout", "all", or "train+heldout" (half each)
    n: int | None = None  # number of prompts (None: 1000)
    seed: int = 0  # example seed
    events: str = "1-8"  # inclusive range of events per prompt
    hooks: str = "resid_post"  # comma-separated hook kinds or full names (embedding is always added)
    layers: str = "all"  # "all" or comma-separated layer indices
    dtype: str = "auto"  # stored dtype: float32 / float16 / bfloat16, or "auto": float16 for pretrained (natural
    #   English) models, whose probe accuracies it leaves unchanged (README), float32 for the toy models
    random_init_seed: int = 0  # seed of the random-init twin model (harvested into OUT/random_init)


def make_examples(cfg: HarvestConfig) -> list:
    """The examples a config describes, in prompt-id order."""

    if cfg.rendering is None:
        cfg = replace(cfg, rendering=model_profile(cfg.model).rendering)
    if cfg.n is None:
        cfg = replace(cfg, n=1000)

    if cfg.split == "train+heldout":
        half = cfg.n // 2
        train = get_task(cfg.task, rendering=cfg.rendering, fmt=cfg.fmt, split="train")
        held = get_task(cfg.task, rendering=cfg.rendering, fmt=cfg.fmt, split="heldout")
        return train.examples(cfg.n - half, cfg.seed, cfg.events) + held.examples(half, cfg.seed + 1, cfg.events)
    task = get_task(cfg.task, rendering=cfg.rendering, fmt=cfg.fmt, split=cfg.split)
    return task.examples(cfg.n, cfg.seed, cfg.events)


def hook_names_for(model, hooks, layers) -> list[str]:
    """Full hook names for kinds x layers, with the embedding hook first."""

    kinds = [h.strip() for h in hooks.split(",")] if isinstance(hooks, str) else list(hooks)
    if isinstance(layers, str) and layers != "all":
        layers = [int(x) for x in layers.split(",")]
    names = [EMBED_HOOK]
    for k in kinds:
        if k.startswith(("blocks.", "hook_")):
            names.append(k)
        else:
            names += layer_names(model, k, layers)
    return list(dict.fromkeys(names))


def row_labels(ex, lab, prompt_id: int) -> dict[str, np.ndarray]:
    """Per-token label arrays for one example (the keys are `LABEL_NAMES`)."""
    T = len(lab.input_ids)
    held = int(ex.meta.get("split") == "heldout")
    extra = {}
    state = lab.state
    if "token_labels" in ex.meta:  # a researcher's record: every named label, and its cross-validation group
        extra = {**ex.meta["token_labels"](lab.offsets), "group_id": np.full(T, ex.meta["group_index"])}
        state = extra[ex.meta["label"]]
    return {**extra, "state": state, "parity": lab.parity, "events_so_far": lab.events_so_far,
            "is_event_boundary": lab.is_event_boundary.astype(np.int64), "token_id": lab.input_ids,
            "position": np.arange(T), "prompt_id": np.full(T, prompt_id), "n_events": np.full(T, ex.n_events),
            "in_prompt": lab.in_prompt.astype(np.int64), "in_answer": lab.in_answer.astype(np.int64),
            "template_split": np.full(T, held)}


def harvest(model, tokenizer, examples, hooks, layers, out, *, config: dict | None = None,
            batch_size: int = 16, shard_rows: int = 8192, dtype: str = "float32",
            max_gb: float | None = None, progress=None, rank: int = 0, world_size: int = 1,
            barrier=None, pause_after_shard: float = 0.0, extra_header: dict | None = None) -> ActivationStore:
    """Store activations of `hooks` x `layers` for every token of every example's full text.

    `config` (JSON-able) is hashed together with the model's checkpoint hash, the hook names
    and a hash of the example texts; reopening `out` with another config is refused. `progress`
    is called as ``progress(tokens_done, tokens_total)`` for this rank. `barrier` synchronises ranks (torchrun).
    Returns the store (complete once every rank has finished and rank 0 has merged).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is unknown; choose one of {sorted(DTYPES)}")
    if not examples:
        raise ValueError("no examples to harvest: pass at least one prompt (--n >= 1)")
    names = hook_names_for(model, hooks, layers)
    labels = [ex.labels(tokenizer) for ex in examples]
    check_context(model, [len(lab.input_ids) for lab in labels])
    n_rows = sum(len(lab.input_ids) for lab in labels)
    width = model.cfg.d_model
    bytes_per_row = len(names) * width * torch.finfo(DTYPES[dtype]).bits // 8 + 4 * len(LABEL_NAMES)
    est = n_rows * bytes_per_row
    if max_gb is not None and est > max_gb * 1e9:
        raise ValueError(f"this harvest needs about {est / 1e9:.2f} GB ({n_rows} tokens x {len(names)} hooks "
                         f"x {width} x {dtype}), over --max-gb {max_gb}: use fewer prompts, layers or float16")
    texts = hashlib.sha256("\x00".join(ex.text for ex in examples).encode()).hexdigest()[:16]
    header = {
        "config": {**(config or {}), "examples_hash": texts, "n_prompts": len(examples), "hooks": names,
                   "dtype": dtype, "checkpoint_hash": checkpoint_hash(model)},
        "model": {"id": str(getattr(model, "name_or_path", type(model).__name__)),
                  "n_layers": int(model.cfg.n_layers), "d_model": int(width)},
        "hooks": names, "dtype": dtype, "shapes": {h: [width] for h in names},
        "n_prompts": len(examples), "estimated_bytes": est,
        "prompt_lengths": [len(lab.input_ids) for lab in labels],
        "state_names": list(examples[0].state_names),
        **(extra_header or {}),
    }
    header["checkpoint_hash"] = header["config"]["checkpoint_hash"]
    if rank == 0:
        store = ActivationStore.create(out, header, rank=0)
    if barrier:
        barrier()
    if rank != 0:
        store = ActivationStore.create(out, header, rank=rank)
    done = store.done_prompts()
    mine = [i for i in range(rank, len(examples), world_size) if i not in done]
    mine.sort(key=lambda i: (len(labels[i].input_ids), i))
    total, done_tokens = sum(len(labels[i].input_ids) for i in mine), 0
    out_dtype = DTYPES[dtype]
    model.eval()
    # Each activation is copied once, by the hook, straight into its rows of the shard buffer
    # (no clone per forward, no concatenation per shard). Rows are prompt after prompt.
    buf: dict[str, torch.Tensor] = {}  # hook -> [shard rows, ...], allocated at its first forward
    filled: dict[str, int] = {}  # hook -> rows written into its buffer so far
    at = {"row": 0, "rows": 0}  # where the current forward's rows start in the shard; shard size

    def sink(name: str, act: torch.Tensor) -> None:  # act: [batch, pos, ...]
        n = act.shape[0] * act.shape[1]
        if name not in buf:
            buf[name] = torch.empty((at["rows"], *act.shape[2:]), dtype=out_dtype)
            filled[name] = 0
        buf[name][at["row"]:at["row"] + n].view(act.shape).copy_(act)
        filled[name] += n

    with stream(model, names, sink), torch.no_grad():
        for shard in plan_shards(mine, [len(lab.input_ids) for lab in labels], batch_size, shard_rows):
            rows = sum(len(labels[j].input_ids) for batch in shard for j in batch)
            buf.clear()
            filled.clear()
            at.update(row=0, rows=rows)
            lab = {k: np.empty(rows, dtype=np.int32) for k in store.label_names}
            prompts = []
            for batch in shard:
                T = len(labels[batch[0]].input_ids)
                model(torch.as_tensor(np.stack([labels[j].input_ids for j in batch])), return_type=None)  # [batch, pos]
                for b, j in enumerate(batch):
                    r = at["row"] + b * T
                    for k, v in row_labels(examples[j], labels[j], j).items():
                        lab[k][r:r + T] = v
                    prompts.append((j, T))
                at["row"] += T * len(batch)
                done_tokens += T * len(batch)
                if progress is not None:
                    progress(done_tokens, total)
            short = {h: filled.get(h, 0) for h in names if filled.get(h, 0) != rows}
            if short:
                raise RuntimeError(f"hooks fired for other than the shard's {rows} tokens (rows written: {short}): "
                                   "each hook must fire once per forward over every token; choose other --hooks")
            store.write_shard(rank, {h: buf[h] for h in names}, lab, prompts)
            buf.clear()
            if max_gb is not None and store.bytes_written() > max_gb * 1e9:
                raise ValueError(f"store {out} passed --max-gb {max_gb}; stopped (rerun with a larger limit to resume)")
            if pause_after_shard:
                time.sleep(pause_after_shard)
    if barrier:
        barrier()
    if rank == 0:
        store.finalize()
    if barrier:
        barrier()
    return ActivationStore(out, store.manifest) if rank == 0 else store


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Harvest options shared by `beliefscope harvest` and `python -m beliefscope.probes.harvest`."""
    d = HarvestConfig()
    p.add_argument("--model", default=d.model, help="checkpoint folder or alias (target, smollm2)")
    p.add_argument("--task", default=d.task)
    p.add_argument("--rendering", default=None, choices=["toy", "natural"],
                   help="prompt rendering (default: the model's own: natural for pretrained models and folders "
                        "without a model card, the card's for checkpoints trained here)")
    p.add_argument("--fmt", default=d.fmt, choices=["direct", "cot"])
    p.add_argument("--split", default=d.split, choices=["train", "heldout", "all", "train+heldout"])
    p.add_argument("--n", "--n-prompts", dest="n", type=int, default=None,
                   help=f"number of prompts (default {d.n}; with --data, every record; under torchrun spell it "
                        "--n-prompts: torchrun takes --n as its own)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--events", default=d.events, help="events per prompt, LO-HI (use 1-16 for held-out lengths)")
    p.add_argument("--hooks", default=d.hooks, help="comma-separated hook kinds (resid_post, ...)")
    p.add_argument("--layers", default=d.layers, help="'all' or comma-separated layer indices")
    p.add_argument("--store-dtype", dest="dtype", default=d.dtype, choices=["auto", *sorted(DTYPES)],
                   help="dtype the activations are stored in (auto: float16 for pretrained models, float32 for the "
                        "toy ones; the model's own dtype is --dtype)")
    p.add_argument("--random-init-seed", type=int, default=d.random_init_seed)
    p.add_argument("--no-random-init", action="store_true", help="skip the random-init twin store")
    p.add_argument("--out", required=True, help="store folder (resumed if it exists with the same config)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--shard-rows", type=int, default=8192, help="tokens per shard (whole prompts)")
    p.add_argument("--max-gb", type=float, default=None, help="refuse to write more than this")
    p.add_argument("--pause-after-shard", type=float, default=0.0, help=argparse.SUPPRESS)  # tests only
    p.add_argument("--no-progress", action="store_true")

    add_data_arguments(p)
    p.add_argument("--truncate", action="store_true", help="with --data: cut texts longer than the model's context")
    p.add_argument("--skip-long", action="store_true", help="with --data: drop texts longer than the model's context")


def run(args, progress_factory=None, rank: int = 0, world_size: int = 1, barrier=None, say=None) -> dict:
    """Harvest the model store and (unless ``--no-random-init``) the random-init twin store. ``say(line)``
    hears what is about to be written (sizes) before it is."""

    if getattr(args, "data", None):
        return run_data(args, progress_factory, rank, world_size, barrier, say)
    if args.n is None:
        args.n = 1000
    lo, hi = parse_events_range(args.events)
    if args.n < 1:
        raise ValueError(f"--n {args.n}: harvest at least 1 prompt")
    check_writable_parent(os.path.join(args.out, "manifest.json"))  # the store folder's place, before any work

    rendering = args.rendering or model_profile(args.model).rendering  # recorded in the store's config
    args.dtype = store_dtype(args.dtype, model_profile(args.model).rendering)
    cfg = HarvestConfig(model=args.model, task=args.task, rendering=rendering, fmt=args.fmt, split=args.split,
                        n=args.n, seed=args.seed, events=f"{lo}-{hi}", hooks=args.hooks, layers=args.layers,
                        dtype=args.dtype, random_init_seed=args.random_init_seed)
    examples = make_examples(cfg)
    model, tok = load_model(cfg.model)
    return harvest_targets(args, model, tok, examples, asdict(cfg), progress_factory, rank, world_size, barrier, say)


def harvest_targets(args, model, tok, examples, config: dict, progress_factory=None, rank=0, world_size=1,
                    barrier=None, say=None, extra_header: dict | None = None) -> dict:
    """Harvest `examples` through the model into ``args.out`` and (unless ``--no-random-init``) through its
    random-init twin into ``args.out/random_init``; the twin's seed is recorded (requested and used)."""
    targets = [(model, args.out, "model", {})]
    if not args.no_random_init:
        twin, used = random_twin(model, config["random_init_seed"])
        targets.append((twin, os.path.join(args.out, "random_init"), "random_init",
                        {"random_init_seed_used": used}))
        if used != config["random_init_seed"] and say:
            say(f"the random-init twin of seed {config['random_init_seed']} has the model's own weights; "
                f"the twin uses seed {used} (recorded in the store)")
    result = {}
    for m, out, role, more in targets:
        if say:
            sample = examples[:200]
            n_rows = sum(len(ex.labels(tok).input_ids) for ex in sample) * len(examples) / len(sample)
            names = hook_names_for(m, config["hooks"], config["layers"])
            gb = n_rows * len(names) * m.cfg.d_model * torch.finfo(DTYPES[config["dtype"]]).bits / 8 / 1e9
            say(f"{out}: about {gb:.2f} GB ({int(n_rows):,} tokens x {len(names)} hooks x {m.cfg.d_model} x "
                f"{config['dtype']})")
        bar = progress_factory(out) if progress_factory else None
        kw = {"batch_size": args.batch_size, "shard_rows": args.shard_rows, "dtype": config["dtype"],
              "max_gb": args.max_gb, "rank": rank, "world_size": world_size, "barrier": barrier,
              "pause_after_shard": args.pause_after_shard, "extra_header": extra_header}
        store = harvest(m, tok, examples, config["hooks"], config["layers"], out,
                        config={**config, "role": role, **more},
                        progress=None if bar is None else lambda n, t, b=bar: _advance(b, n, t), **kw)
        if bar is not None:
            bar.close()
        result[out] = {"config_hash": store.hash, "n_rows": store.manifest.get("n_rows"),
                       "complete": store.manifest.get("complete"), "hooks": store.hooks,
                       "bytes": store.bytes_written(), **more}
    return result


def run_data(args, progress_factory=None, rank: int = 0, world_size: int = 1, barrier=None, say=None) -> dict:
    """`harvest --data`: the records are read and checked before the model loads, long texts are refused
    (or skipped or cut, and counted) before any forward, and every label goes into the store by name."""

    check_writable_parent(os.path.join(args.out, "manifest.json"))
    data = load_for_harvest(args)
    args.dtype = store_dtype(args.dtype, model_profile(args.model).rendering)
    if args.n is not None:
        if args.n < 1:
            raise ValueError(f"--n {args.n}: harvest at least 1 record")
        data.records = data.records[:args.n]
    model, tok = load_model(args.model)
    data, fitted = fit_to_context(data, tok, model_shapes(model).n_ctx, truncate=args.truncate,
                                  skip_long=args.skip_long)
    if say and (fitted["skipped"] or fitted["truncated"]):
        say(f"{len(fitted['skipped'])} record(s) skipped and {len(fitted['truncated'])} cut to the model's context")
    examples = data_examples(data)
    config = {"model": args.model, "data_config": asdict(data.config), "n": len(examples), "hooks": args.hooks,
              "layers": args.layers, "dtype": args.dtype, "random_init_seed": args.random_init_seed,
              "truncate": bool(args.truncate), "skip_long": bool(args.skip_long)}
    extra = {"source": "data", "data_source": data.source, "label_names": store_label_names(data),
             "label_classes": data.classes, "label_kinds": data.kinds, "primary_label": data.label_names[0],
             "record_ids": [r.id for r in data.records], "context_fit": fitted}
    result = harvest_targets(args, model, tok, examples, config, progress_factory, rank, world_size, barrier, say,
                             extra)
    for r in result.values():
        r.update(records=len(examples), labels={n: data.classes[n] for n in data.label_names},
                 skipped=len(fitted["skipped"]), truncated=len(fitted["truncated"]))
    return result


def _advance(bar, n: int, total: int) -> None:
    bar.total = total
    bar.update(n - bar.n)


def main(argv=None) -> int:
    """Entry point of ``torchrun ... -m beliefscope.probes.harvest``, kept as a module because torchrun
    starts a module or a script in every process: harvest sharded across the processes, then rank 0
    writes the result as JSON to stdout. In one process, ``beliefscope harvest`` is the same."""
    import json

    p = argparse.ArgumentParser(prog="beliefscope.probes.harvest", description=__doc__.split("\n")[0])
    add_arguments(p)
    p.add_argument("--device", default="auto", help="auto: this process's GPU (cuda:LOCAL_RANK) when there are GPUs, "
                                                    "else the CPU; or cpu, cuda, cuda:N")
    p.add_argument("--dtype", dest="model_dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = p.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))

    device = rank_device(args.device, int(os.environ.get("LOCAL_RANK", "0")))
    barrier = None
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        barrier = dist.barrier
    factory = None
    if not args.no_progress and rank == 0:

        factory = lambda out: progress_bar(f"harvest {os.path.basename(out)}", leave=True)
    try:
        from beliefscope.models.devices import model_defaults

        with model_defaults(device=device, dtype=args.model_dtype):
            result = run(args, factory, rank, world, barrier)
    finally:
        if world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
    if rank == 0:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
