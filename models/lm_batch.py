"""Completion-only LM batches: a prompt and its completion, the loss on the completion and <eos>
(shared by the toy trainers and the adapter baselines of `models.adapters`).

>>> from beliefscope.models.tokenizer import toy_tokenizer
>>> from beliefscope.tasks import get_task
>>> tok = toy_tokenizer()
>>> ex = get_task("coinflip").example(seed=1, n_events=1)
>>> ids, labels, mask = make_batch(tok, [ex])
>>> tok.decode([t for t in labels[0].tolist() if t != -100]) == ex.completion.strip() + " <eos>"
True
"""

from __future__ import annotations

import torch


def make_batch(tok, examples, device=None):
    """Right-padded token batch with loss only on completion tokens and the final <eos>."""
    rows, labels = [], []
    for ex in examples:
        p = tok(ex.prompt)["input_ids"]
        c = tok(ex.completion)["input_ids"] + [tok.eos_token_id]
        rows.append(p + c)
        labels.append([-100] * len(p) + c)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)  # [batch, pos]
    lab = torch.full((len(rows), width), -100, dtype=torch.long)  # [batch, pos]
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # [batch, pos]
    for i, (r, lb) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(lb)] = torch.tensor(lb)
        mask[i, : len(r)] = 1
    return ids.to(device), lab.to(device), mask.to(device)
