"""The forwards behind an interchange sweep: the sources' activations, the clean answers, and the patched rows.

Every forward reads the class words at each sequence's last token only: where the model takes
``logits_to_keep`` (transformers' causal LMs do), the output layer runs at those positions alone, not at every
token (on SmolLM2 the output layer is a fifth of a forward's arithmetic).

The patched rows resume from their base's clean KV cache: the bases of a batch are prefilled once (that forward
also gives their clean answers), and every row, a (pair, site), copies its base's keys and values up to the
patched token and runs only the tokens from there on, patched at the first of them. Nothing before the patched
token changes, so this is what a full recompute gives, to float rounding (tests/test_interchange.py). Rows are
run longest first, as many per forward as a clean forward of the batch's bases has tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from ..cache import KVCache
from ..hooks import hooked, stream
from ..models.forward import takes_logits_to_keep
from ..models.profile import hf_of

MAX_SOURCE_BYTES = 4 * 2 ** 30  # source activations kept for one call
OUTPUT_HOOKS = ("ln_final", "unembed")  # hook names at or after the output layer: these need every position's logits


def padded(seqs: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[b, T_max]`` ids (pad 0: a causal model's real tokens never read it) and lengths ``[b]``."""
    lens = torch.as_tensor([len(s) for s in seqs])
    ids = torch.zeros(len(seqs), int(lens.max()), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.as_tensor(s)
    return ids, lens


def device_of(model) -> torch.device:
    return next(model.parameters()).device


def keep_last(model, lens: torch.Tensor, hooks=()) -> tuple[dict, torch.Tensor]:
    """``(forward kwargs, [b] column of each row's last token in the logits that forward returns)``: the output
    layer runs only at the rows' last positions where the model allows it and no hook in ``hooks`` sits at the
    output (it would see those positions alone)."""
    last = lens - 1  # [b]
    if not takes_logits_to_keep(hf_of(model)) or any(h.startswith(OUTPUT_HOOKS) for h in hooks):
        return {}, last
    cols = torch.unique(last)  # sorted
    return {"logits_to_keep": cols}, torch.searchsorted(cols, last)


def last_logits(model, seqs: list, answer_ids: list, fwd_hooks=None) -> torch.Tensor:
    """``[b, C]`` float32: the class words' logits at each sequence's last token, under ``fwd_hooks`` (no gradient;
    `last_logits_grad` keeps it)."""
    with torch.no_grad():
        return last_logits_grad(model, seqs, answer_ids, fwd_hooks).cpu()


def last_logits_grad(model, seqs: list, answer_ids: list, fwd_hooks=None) -> torch.Tensor:
    """`last_logits` on the model's device, differentiable in what the hooks put in (DAS trains through it)."""
    ids, lens = padded(seqs)
    fwd_hooks = fwd_hooks or []
    kw, col = keep_last(model, lens, [name for name, _ in fwd_hooks])
    with hooked(model, fwd_hooks):
        logits = model(ids.to(device_of(model)), return_type="logits", **kw)  # [b, T or kept, V]
    return logits[torch.arange(len(seqs), device=logits.device), col.to(logits.device)][:, answer_ids].float()


@torch.no_grad()
def source_pass(model, source_ids: list, pos_source: np.ndarray, site_list: list, answer_ids: list,
                batch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """``([P, S, d] float32, [P, C] float32)``: each source's activation at each site's hook and position, and the
    source's own class logits at its last token, from one forward per batch of sources."""
    P, S, d = len(source_ids), len(site_list), int(model.cfg.d_model)
    if P * S * d * 4 > MAX_SOURCE_BYTES:
        raise ValueError(f"{P} pairs x {S} sites would keep {P * S * d * 4 / 2 ** 30:.1f} GiB of source activations: "
                         "pass fewer pairs, layers or positions per call")
    out, logits = torch.zeros(P, S, d), torch.zeros(P, len(answer_ids))
    by_hook: dict[str, list[int]] = {}
    for j, s in enumerate(site_list):
        by_hook.setdefault(s.hook, []).append(j)
    for lo in range(0, P, batch_size):
        rows = list(range(lo, min(P, lo + batch_size)))
        ids, lens = padded([source_ids[i] for i in rows])
        r = torch.as_tensor(rows)

        def sink(name, act, r=r):
            for j in by_hook[name]:
                pos = torch.as_tensor(pos_source[r, j]).to(act.device)
                out[r, j] = act[torch.arange(len(r), device=act.device), pos].float().cpu()

        kw, col = keep_last(model, lens, list(by_hook))
        with stream(model, list(by_hook), sink):
            got = model(ids.to(device_of(model)), return_type="logits", **kw)  # [b, T or kept, V]
        logits[r] = got[torch.arange(len(rows), device=got.device), col.to(got.device)][:, answer_ids].float().cpu()
    return out, logits


def patch_hooks(rows_site: np.ndarray, rows_pos: np.ndarray, values: torch.Tensor, site_list: list,
                bases: dict | None = None) -> list:
    """Forward hooks putting ``values [b, d]`` (row r's source activation) at row r's site and position, whole or
    in its site's subspace (``bases[site]`` ``[d, k]`` orthonormal, None: the whole activation)."""
    hooks: dict[str, list[int]] = {}
    for r, j in enumerate(rows_site):
        hooks.setdefault(site_list[j].hook, []).append(r)

    def make(rows):
        r_idx = torch.as_tensor(rows)
        Qs = [(bases or {}).get(site_list[rows_site[r]]) for r in rows]

        def fn(act, *, hook):
            dev = act.device
            pos = torch.as_tensor(rows_pos[rows]).to(dev)
            idx = r_idx.to(dev)
            a = act[idx, pos].float()  # [n, d]
            s = values[r_idx].to(dev)
            new = s.clone()
            for k, Q in enumerate(Qs):
                if Q is not None:
                    Qd = Q.to(dev, torch.float32)
                    new[k] = a[k] + ((s[k] - a[k]) @ Qd) @ Qd.T
            act = act.clone()
            act[idx, pos] = new.to(act.dtype)
            return act
        return fn

    return [(h, make(rows)) for h, rows in hooks.items()]


class Prefilled:
    """The clean KV caches of many sequences (one row each, ``batch_size`` per prefill forward, no gradient) and
    their clean class logits ``[n, C]``: what every patched row of theirs resumes from."""

    def __init__(self, model, seqs: list, answer_ids: list, batch_size: int = 16):
        self.chunks: list[KVCache] = []  # one cache per prefill forward
        self.where: list[tuple[int, int]] = []  # (chunk, row) of each sequence
        logits = []
        with torch.no_grad():
            for lo in range(0, len(seqs), batch_size):
                part = seqs[lo: lo + batch_size]
                ids, lens = padded(part)
                cache = KVCache.for_model(model, batch=len(part), capacity=ids.shape[1] + 8)
                kw, col = keep_last(model, lens)
                got = model(ids.to(device_of(model)), past_key_values=cache, return_type="logits", **kw)
                logits.append(got[torch.arange(len(part), device=got.device), col.to(got.device)][
                    :, answer_ids].float().cpu())
                self.where += [(len(self.chunks), r) for r in range(len(part))]
                self.chunks.append(cache)
        self.logits = torch.cat(logits)  # [n, C]

    @staticmethod
    def nbytes(model, seqs: list) -> int:
        """What the caches of ``seqs`` hold, in bytes (float32 keys and values of every layer)."""
        cfg = model.cfg
        kv = int(getattr(cfg, "n_key_value_heads", None) or cfg.n_heads) * int(cfg.d_head)
        return sum(len(s) for s in seqs) * int(cfg.n_layers) * 2 * kv * 4

    def prefix(self, layer: int, idx, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[b, kv_heads, upto, d_head]`` keys and values of sequences ``idx`` at ``layer``, their first ``upto``
        positions (the rows' own prefixes; what lies past a row's own length is never read)."""
        where = np.asarray([self.where[int(i)] for i in idx])  # [b, 2] (chunk, row)
        parts, order = [], []
        for c in np.unique(where[:, 0]):  # one gather per prefill chunk
            mine = np.nonzero(where[:, 0] == c)[0]
            k, v = self.chunks[c].keys(layer, row=None), self.chunks[c].values(layer, row=None)
            rows = torch.as_tensor(where[mine, 1], device=k.device)
            n = min(upto, k.shape[2])
            pad = (0, 0, 0, upto - n)  # a short chunk: zeros past its padded length
            parts.append((torch.nn.functional.pad(k[rows, :, :n], pad), torch.nn.functional.pad(v[rows, :, :n], pad)))
            order.append(mine)
        if len(parts) == 1:
            return parts[0]
        back = torch.as_tensor(np.argsort(np.concatenate(order)))  # rows back in the order of ``idx``
        k = torch.cat([a for a, _ in parts])
        v = torch.cat([b for _, b in parts])
        return k[back.to(k.device)], v[back.to(v.device)]

    def close(self) -> None:
        for cache in self.chunks:
            cache.close()


def resumed_logits_grad(model, base: Prefilled, idx, starts: np.ndarray, rest: list, hooks: list,
                        answer_ids: list) -> torch.Tensor:
    """``[b, C]`` class logits (on the model's device, differentiable in what ``hooks`` put in) of sequences ``idx``
    of ``base`` resumed at tokens ``starts``, running ``rest[r]`` (the sequence's tokens from there on) under
    ``hooks``: only those tokens run; the prefix's keys and values are the clean ones (no gradient: nothing before
    the patched token depends on the patch)."""
    width, upto = max(len(x) for x in rest), int(starts.max())
    cache = KVCache.for_model(model, batch=len(rest), capacity=upto + width + 8)
    if upto:
        with torch.no_grad():  # one buffer copy per layer; each row keeps its own prefix
            kv = [base.prefix(layer, idx, upto) for layer in range(base.chunks[0].config.n_layers)]
            cache.fill_rows([k for k, _ in kv], [v for _, v in kv], [int(p) for p in starts])
    cont, lens = padded(rest)
    kw, col = keep_last(model, lens, [name for name, _ in hooks])
    with hooked(model, hooks):
        logits = model(cont.to(device_of(model)), return_type="logits", **cache.forward_kwargs(width), **kw)
    cache.close()
    return logits[torch.arange(len(rest), device=logits.device), col.to(logits.device)][:, answer_ids].float()


def resumed_logits(model, base: Prefilled, idx, starts: np.ndarray, rest: list, hooks: list,
                   answer_ids: list) -> torch.Tensor:
    """`resumed_logits_grad` without a gradient, on the host."""
    with torch.no_grad():
        return resumed_logits_grad(model, base, idx, starts, rest, hooks, answer_ids).cpu()


def row_batches(widths: np.ndarray, budget: int, max_rows: int) -> list[np.ndarray]:
    """Indices of ``widths`` in batches, longest first: a batch's rows times its widest row stay within ``budget``
    tokens (at least one row per batch) and ``max_rows`` rows.

    >>> [b.tolist() for b in row_batches(np.array([1, 5, 2, 5]), budget=10, max_rows=8)]
    [[1, 3], [2, 0]]
    """
    order = np.argsort(-widths, kind="stable")
    out, lo = [], 0
    while lo < len(order):
        n = max(1, min(max_rows, budget // max(1, int(widths[order[lo]]))))
        out.append(order[lo: lo + n])
        lo += n
    return out
