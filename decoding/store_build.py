"""Build an ``NGramStore`` from the target's own greedy outputs on training prompts.

Generation is batched through HF ``generate`` (left padding). It is resumable: every finished
batch is appended to ``<out>.partial.jsonl`` and skipped on the next run, and the store itself is
written atomically at the end.

>>> from beliefscope.models.testing import tiny_gpt2
>>> model = tiny_gpt2()
>>> outs = greedy_outputs(model, [[3, 4, 5], [6, 7]], StoreBuildConfig(max_new_tokens=4, batch_size=2))
>>> [len(o) for o in outs]
[4, 4]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from .core import hf_model, vocab_size
from .datastore import NGramStore
from .lists import ListCounter


@dataclass
class StoreBuildConfig:
    """What goes into an n-gram store."""

    max_new_tokens: int = 96  # greedy tokens generated per training prompt
    batch_size: int = 16  # prompts per HF generate call
    max_n: int = 4  # longest n-gram counted
    include_prompts: bool = True  # also count the prompts' own n-grams (the outputs quote them)


@dataclass
class DatastoreConfig:
    """`beliefscope datastore`: which model answers which training requests, and how the store is counted."""

    out: str = ""  # output JSON (resumes from OUT.partial.jsonl if present)
    model: str = "smollm2"  # checkpoint folder or alias (target, smollm2)
    workload: str = "coinflip"  # the requests: coin-flip story rewrites (tasks.instruct), or requests about the
    #   Python standard library's docstrings (decoding.general_prompts, its 'store' half; --events and --split
    #   do not apply)
    n: int = 320  # training prompts to generate from
    seed: int = 1  # prompt seed
    events: str = "5-9"  # events per story, e.g. 5-9
    split: str = "train"  # story templates and names to use (benchmarks run on heldout)
    max_new_tokens: int = 96  # greedy tokens per prompt
    batch_size: int = 16  # prompts per HF generate call
    max_n: int = 4  # longest n-gram counted


@torch.no_grad()
def greedy_outputs(model, prompts: list, config: StoreBuildConfig, pad_id: int = 0, done=None, progress=None) -> list:
    """Greedy continuations (token lists, eos kept) of token-id ``prompts``, ``batch_size`` at a time.

    ``done(i, outputs_of_batch)`` is called after every batch starting at prompt ``i`` (for resuming).
    """
    hf = hf_model(model)
    outs = []
    for i in range(0, len(prompts), config.batch_size):
        batch = [list(map(int, p)) for p in prompts[i:i + config.batch_size]]
        width = max(map(len, batch))
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # [b, width], left padded
        mask = torch.zeros_like(ids)
        for r, p in enumerate(batch):
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        gen = hf.generate(ids, attention_mask=mask, max_new_tokens=config.max_new_tokens, do_sample=False,
                          pad_token_id=pad_id)[:, width:]  # [b, <= max_new_tokens]
        eos = hf.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
        got = []
        for row in gen.tolist():
            cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
            got.append(row[:cut])
        outs.extend(got)
        if done is not None:
            done(i, got)
        if progress is not None:
            progress(len(batch))
    return outs


def build_store(model, prompts: list, out_path: str, config: StoreBuildConfig | None = None, meta: dict | None = None,
                pad_id: int = 0, progress=None, tokenizer=None) -> NGramStore:
    """Generate (resuming from ``<out>.partial.jsonl``), count, save ``out_path``, delete the partial file.

    With ``tokenizer``, the store also records the token ids of numbered-list items
    (``decoding.lists.ListCounter``), which the store drafter uses to open each next item."""
    config = config or StoreBuildConfig()
    partial = out_path + ".partial.jsonl"
    finished: dict[int, list] = {}
    if os.path.exists(partial):
        with open(partial) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    break  # a torn last line from an interrupted run: regenerate that batch
                finished[rec["i"]] = rec["outputs"]
    todo = [i for i in range(0, len(prompts), config.batch_size) if i not in finished]
    if progress is not None:
        progress(len(prompts) - sum(min(config.batch_size, len(prompts) - i) for i in todo))
    with open(partial, "a") as f:
        for i in todo:
            def done(_, got, i=i):
                f.write(json.dumps({"i": i, "outputs": got}) + "\n")
                f.flush()
                finished[i] = got
            greedy_outputs(model, prompts[i:i + config.batch_size], config, pad_id, done, progress)
    store = NGramStore(config.max_n, {**(meta or {}), "vocab_size": vocab_size(model), "n_prompts": len(prompts),
                                      "max_new_tokens": config.max_new_tokens,
                                      "include_prompts": config.include_prompts})
    if tokenizer is not None:

        store.meta["list_counter"] = ListCounter.from_tokenizer(tokenizer).to_meta()
    for i in sorted(finished):
        for j, out in enumerate(finished[i]):
            seq = list(map(int, prompts[i + j])) + out if config.include_prompts else out
            store.add(seq)
    store.save(out_path)
    os.remove(partial)
    return store
