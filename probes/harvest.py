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
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, fields, replace

import numpy as np
import torch
import torch.distributed as dist

from beliefscope.base.config_flags import add_config_flags, config_from_args
from beliefscope.base.files import check_writable_parent
from beliefscope.base.progress import advance_to, progress_bar

from ..hooks import hook_names, stream
from ..models.devices import current_defaults, model_defaults, rank_device
from ..models.load import load_model
from ..models.profile import model_profile, model_shapes
from ..tasks import get_task, parse_events_range
from ..tasks.records import DataSource
from ..tasks.score_checks import example_key, text_key
from .harvest_data import (
    check_context,
    data_examples,
    data_notes,
    fit_to_context,
    join_same_texts,
    store_classes,
    store_dtype,
    store_label_names,
)
from .store import DTYPES, LABEL_NAMES, ActivationStore, plan_shards
from .twin import checkpoint_hash, random_init_like, random_twin  # noqa: F401 (re-exported)

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
    hooks: str = "resid_post"  # hook spec: kinds at --layers, KIND@L (resid_post@-1), full names; +embedding
    layers: str = "all"  # the layers of --hooks' bare kinds: "all" or comma-separated indices
    dtype: str = "auto"  # stored dtype: float32 / float16 / bfloat16, or "auto": float16 for pretrained (natural
    #   English) models, whose probe accuracies it leaves unchanged (README), float32 for the toy models
    random_init_seed: int = 0  # seed of the random-init twin model (harvested into OUT/random_init)


@dataclass
class HarvestRunConfig(HarvestConfig, DataSource):
    """Everything one harvest runs: what is harvested (`HarvestConfig`, hashed into the store), your records
    and their mapping when there are some (`tasks.records.DataSource`), where it goes and how fast."""

    out: str = ""  # store folder (resumed if it exists with the same config)
    random_init: bool = True  # also harvest the random-init twin of the model into OUT/random_init
    batch_size: int = 16  # prompts per forward (each batch holds prompts of one token length)
    shard_rows: int = 8192  # tokens per shard (whole prompts)
    max_gb: float | None = None  # refuse to write more than this many GB
    pause_after_shard: float = 0.0  # seconds to wait after each shard (tests interrupt a run there)
    truncate: bool = False  # with --data: cut texts longer than the model's context
    skip_long: bool = False  # with --data: drop texts longer than the model's context

    def hashed(self, **resolved) -> HarvestConfig:
        """The part of this run the store's hash covers, with ``resolved`` values (defaults filled)."""
        return HarvestConfig(**{**{f.name: getattr(self, f.name) for f in fields(HarvestConfig)}, **resolved})


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
    """Full hook names for a hook spec (`hooks.names.parse_hooks`: kinds at ``layers``, ``KIND@L`` items,
    full names), with the embedding hook first."""
    return list(dict.fromkeys([EMBED_HOOK, *hook_names(model, hooks, layers)]))


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


# The harvest's flags, for `beliefscope harvest` (a Command) and the torchrun entry (`main`) alike.
CHOICES = {"rendering": ["toy", "natural"], "fmt": ["direct", "cot"],
           "split": ["train", "heldout", "all", "train+heldout"], "format": ["records", "boxes"]}
HELPS = {"rendering": "prompt rendering (default: the model's own: natural for pretrained models and folders without a "
                      "model card, the card's for checkpoints trained here)",
         "events": "events per prompt, LO-HI (use 1-16 for held-out lengths)"}
BY_HAND = ("n", "dtype", "pause_after_shard")  # fields whose flags are added by `add_hand_flags`


def add_hand_flags(p: argparse.ArgumentParser) -> None:
    """``--n`` (alias ``--n-prompts``: torchrun takes ``--n`` as its own), ``--store-dtype`` (``--dtype`` is the
    model's) and the tests' hidden ``--pause-after-shard``."""
    p.add_argument("--n", "--n-prompts", dest="n", type=int, default=None,
                   help="number of prompts (default 1000; with --data, every record; under torchrun spell it "
                        "--n-prompts: torchrun takes --n as its own)")
    p.add_argument("--store-dtype", dest="dtype", default=HarvestRunConfig.dtype, choices=["auto", *sorted(DTYPES)],
                   help="dtype the activations are stored in (auto: float16 for pretrained models, float32 for the "
                        "toy ones; the model's own dtype is --dtype)")
    p.add_argument("--pause-after-shard", type=float, default=0.0, help=argparse.SUPPRESS)  # tests only


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Harvest options of `python -m beliefscope.probes.harvest`: one flag per `HarvestRunConfig` field, with its
    default and comment (``--n`` and ``--store-dtype`` by hand)."""
    add_config_flags(p, HarvestRunConfig, skip=BY_HAND, required=("out",), choices=CHOICES, helps=HELPS)
    add_hand_flags(p)


def run(cfg: HarvestRunConfig, progress_factory=None, rank: int = 0, world_size: int = 1, barrier=None,
        say=None) -> dict:
    """Harvest the model store and (unless ``random_init=False``) the random-init twin store. ``say(line)``
    hears what is about to be written (sizes) before it is."""
    if cfg.data:
        return run_data(cfg, progress_factory, rank, world_size, barrier, say)
    n = 1000 if cfg.n is None else cfg.n
    lo, hi = parse_events_range(cfg.events)
    if n < 1:
        raise ValueError(f"--n {n}: harvest at least 1 prompt")
    check_writable_parent(os.path.join(cfg.out, "manifest.json"))  # the store folder's place, before any work

    rendering = cfg.rendering or model_profile(cfg.model).rendering  # recorded in the store's config
    hashed = cfg.hashed(rendering=rendering, n=n, events=f"{lo}-{hi}",
                        dtype=store_dtype(cfg.dtype, model_profile(cfg.model).rendering))
    examples = make_examples(hashed)
    model, tok = load_model(hashed.model)
    return harvest_targets(cfg, model, tok, examples, asdict(hashed), progress_factory, rank, world_size, barrier, say,
                           {"text_keys": [example_key(ex) for ex in examples]})  # `probe --out`: which fold held each


def harvest_targets(cfg: HarvestRunConfig, model, tok, examples, config: dict, progress_factory=None, rank=0,
                    world_size=1, barrier=None, say=None, extra_header: dict | None = None) -> dict:
    """Harvest `examples` through the model into ``cfg.out`` and (unless ``random_init=False``) through its
    random-init twin into ``cfg.out/random_init``; the twin's seed is recorded (requested and used)."""
    targets = [(model, cfg.out, "model", {})]
    if cfg.random_init:
        twin, used = random_twin(model, config["random_init_seed"])
        targets.append((twin, os.path.join(cfg.out, "random_init"), "random_init",
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
        kw = {"batch_size": cfg.batch_size, "shard_rows": cfg.shard_rows, "dtype": config["dtype"],
              "max_gb": cfg.max_gb, "rank": rank, "world_size": world_size, "barrier": barrier,
              "pause_after_shard": cfg.pause_after_shard, "extra_header": extra_header}
        store = harvest(m, tok, examples, config["hooks"], config["layers"], out,
                        config={**config, "role": role, **more},
                        progress=None if bar is None else lambda n, t, b=bar: advance_to(b, n, t), **kw)
        if bar is not None:
            bar.close()
        result[out] = {"config_hash": store.hash, "n_rows": store.manifest.get("n_rows"),
                       "complete": store.manifest.get("complete"), "hooks": store.hooks,
                       "bytes": store.bytes_written(), **more}
    return result


def run_data(cfg: HarvestRunConfig, progress_factory=None, rank: int = 0, world_size: int = 1, barrier=None,
             say=None) -> dict:
    """`harvest --data`: the records are read and checked before the model loads, long texts are refused
    (or skipped or cut, and counted) before any forward, and every label goes into the store by name."""
    check_writable_parent(os.path.join(cfg.out, "manifest.json"))
    data = cfg.load()
    dtype = store_dtype(cfg.dtype, model_profile(cfg.model).rendering)
    if cfg.n is not None:
        if cfg.n < 1:
            raise ValueError(f"--n {cfg.n}: harvest at least 1 record")
        data.records, data.shared_texts = join_same_texts(data.records[:cfg.n], data.source)  # repeats in the n
    for line in data_notes(data) if say else ():
        say(line)
    model, tok = load_model(cfg.model)
    data, fitted = fit_to_context(data, tok, model_shapes(model).n_ctx, truncate=cfg.truncate, skip_long=cfg.skip_long)
    if say and (fitted["skipped"] or fitted["truncated"]):
        say(f"{len(fitted['skipped'])} record(s) skipped and {len(fitted['truncated'])} cut to the model's context")
    examples = data_examples(data)
    config = {"model": cfg.model, "data_config": asdict(data.config), "n": len(examples), "hooks": cfg.hooks,
              "layers": cfg.layers, "dtype": dtype, "random_init_seed": cfg.random_init_seed,
              "truncate": bool(cfg.truncate), "skip_long": bool(cfg.skip_long)}
    extra = {"source": "data", "data_source": data.source, "label_names": store_label_names(data),
             "label_classes": store_classes(data), "label_kinds": data.kinds, "primary_label": data.label_names[0],
             "record_ids": [r.id for r in data.records], "text_keys": [text_key(r.text) for r in data.records],
             "context_fit": fitted}
    result = harvest_targets(cfg, model, tok, examples, config, progress_factory, rank, world_size, barrier, say,
                             extra)
    for r in result.values():
        r.update(records=len(examples), labels={n: data.classes[n] for n in data.label_names},
                 skipped=len(fitted["skipped"]), truncated=len(fitted["truncated"]), shared_texts=data.shared_texts)
    return result


def main(argv=None) -> int:
    """Entry point of ``torchrun ... -m beliefscope.probes.harvest``, kept as a module because torchrun
    starts a module or a script in every process: harvest sharded across the processes, then rank 0
    writes the result as JSON to stdout. In one process, ``beliefscope harvest`` is the same."""

    p = argparse.ArgumentParser(prog="beliefscope.probes.harvest", description=__doc__.split("\n")[0])
    add_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--device", default="auto", help="auto: this process's GPU (cuda:LOCAL_RANK) when there are GPUs, "
                                                    "else the CPU; or cpu, cuda, cuda:N")
    p.add_argument("--dtype", dest="model_dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    factory = None
    if not args.no_progress and rank == 0:
        factory = lambda out: progress_bar(f"harvest {os.path.basename(out)}", leave=True)
    result = run_sharded(config_from_args(HarvestRunConfig, args), args.device, args.model_dtype, factory)
    if rank == 0:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0


def run_sharded(cfg: HarvestRunConfig, device: str | None = None, model_dtype: str | None = None,
                progress_factory=None, say=None) -> dict:
    """`run` in one process of a ``torchrun`` job (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``; gloo): this process
    harvests prompts ``rank, rank + N, ...`` on ``rank_device(device, LOCAL_RANK)``, and rank 0 merges the shards
    once every rank is done. Both ``-m beliefscope harvest`` and ``-m beliefscope.probes.harvest`` run it. ``device``
    and ``model_dtype`` None: those of the enclosing `model_defaults` (the command line's ``--device``, ``--dtype``).
    Returns the result on rank 0 and None on the others."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    cur = current_defaults()
    device = device or ("auto" if cur["device"] is None else str(cur["device"]))
    model_dtype = model_dtype or cur["dtype"]
    dev = rank_device(device, int(os.environ.get("LOCAL_RANK", "0")))
    barrier = None
    if world > 1:

        dist.init_process_group("gloo")
        barrier = dist.barrier
    try:
        with model_defaults(device=dev, dtype=model_dtype):
            result = run(cfg, progress_factory if rank == 0 else None, rank, world, barrier,
                         say if rank == 0 else None)
    finally:
        if world > 1:

            dist.destroy_process_group()
    return result if rank == 0 else None


if __name__ == "__main__":
    sys.exit(main())
