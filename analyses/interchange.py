"""Interchange interventions at every layer and position: is a readable state *used*?

For a (base, source) pair and a site (a hook and a position rule), the base runs with the activation at the
site replaced by the source's (Geiger et al. 2021), or only its part in a subspace ``Q`` (``[d, k]``,
orthonormal columns): ``a + (s - a) Q Qᵀ``, the distributed interchange of Geiger et al. 2023 (DAS learns Q;
`analyses.das`). The answer is read over the class words at the base's last token. Per site:

- **IIA** (interchange-intervention accuracy): the share of pairs whose answer becomes the counterfactual one
  (`analyses.pairs.counterfactual_state`), over the pairs where that answer differs from the base's own and
  whose base and source the model answers right (Geiger et al.'s filter: an unchanged wrong answer would
  count as the counterfactual one); a site whose token and everything before it are the same in both stories
  changes nothing and is not scored;
- the shift in logit difference, counterfactual class minus the base's class, after minus before;
- a 95% bootstrap interval over base stories (`probes.intervals`).

Rows of many sites and pairs share each forward: every hook patches only the rows of its own site. Each row
resumes from its base's clean KV cache at the patched token (nothing before it changes), so a site near the
end of a story costs a few tokens, not a whole forward (right padding; a causal model's tokens never read the
pads).

>>> from beliefscope.models.load import load_model
>>> from beliefscope.tasks import get_task
>>> from beliefscope.analyses.pairs import task_pairs
>>> bridge, tok = load_model("target")
>>> pairs = task_pairs(get_task("coinflip"), n=8, seed=0, events=(2, 4))
>>> res = interchange(bridge, tok, pairs, sites(bridge, layers=[3], positions=["last_event", "last"]))
>>> [row["iia"]["accuracy"] for row in res.rows]  # the lazy target: unused at the event, all at the question
[0.0, 1.0]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import torch
from beliefscope.analyses.pairs import Pair, counterfactual_state
from beliefscope.hooks import hooked, stream
from beliefscope.hooks.names import check_computed, hook_name, resolve_hooks
from beliefscope.models.profile import writes_thoughts
from beliefscope.models.tokenizer import answer_token_ids
from beliefscope.probes.intervals import group_interval, scored

POSITION_RULES = "last, last_event, event:K (0-based, negative from the end), end:J (J-th token from the end), pos:N"
MAX_SOURCE_BYTES = 4 * 2 ** 30  # source activations kept for one call


@dataclass(frozen=True)
class Site:
    """Where an intervention goes: one hook, at one token chosen per story by a rule."""

    hook: str  # full hook name, e.g. "blocks.3.hook_resid_post"
    position: str  # a rule of POSITION_RULES, resolved in each story on its own

    @property
    def layer(self) -> int:
        m = re.match(r"blocks\.(\d+)\.", self.hook)
        return int(m.group(1)) if m else -1


def sites(model, layers="all", positions=("last_event", "last"), kind: str = "resid_post") -> list[Site]:
    """Every (layer, position rule) site, layers outermost: ``layers`` "all" or a list of block indices."""
    n = int(model.cfg.n_layers)
    layers = list(range(n)) if layers == "all" else [int(x) for x in layers]
    if bad := [x for x in layers if not 0 <= x < n]:
        raise ValueError(f"layers {bad} are out of range: this model has blocks 0..{n - 1}")
    positions = [positions] if isinstance(positions, str) else list(positions)
    for p in positions:
        _parse_position(p)
    return [Site(hook_name(kind, x), p) for x in layers for p in positions]


def _parse_position(rule: str) -> tuple[str, int]:
    m = re.fullmatch(r"(last|last_event)|(event|end|pos):(-?\d+)", str(rule).strip())
    if not m:
        raise ValueError(f"position rule {rule!r} is unknown: use one of {POSITION_RULES}")
    if m.group(1):
        return ("event", -1) if m.group(1) == "last_event" else ("end", 1)
    kind, k = m.group(2), int(m.group(3))
    if kind == "end" and k < 1:
        raise ValueError(f"position rule {rule!r}: end:J counts from 1 (end:1 is the last token)")
    return kind, k


def resolve_position(rule: str, boundaries: np.ndarray, n_tokens: int) -> int | None:
    """The token index ``rule`` names in a story of ``n_tokens`` tokens whose events end at token indices
    ``boundaries``; None where the story has no such token."""
    kind, k = _parse_position(rule)
    if kind == "end":
        return n_tokens - k if k <= n_tokens else None
    if kind == "pos":
        return k if 0 <= k < n_tokens else None
    return int(boundaries[k]) if -len(boundaries) <= k < len(boundaries) else None


@dataclass
class Prepared:
    """The tokens, positions and counterfactual answers of every (pair, site), checked before any forward."""

    base_ids: list  # [P] base prompt token ids (np int64 [T_b])
    source_ids: list  # [P] source prompt token ids
    pos_base: np.ndarray  # [P, S] token index of each site in the base
    pos_source: np.ndarray  # [P, S] token index in the source
    target: np.ndarray  # [P, S] counterfactual class index
    base_state: np.ndarray  # [P] the base's own final state
    noop: np.ndarray  # [P, S] bool: base and source are the same tokens up to the site (nothing changes)
    answer_ids: list  # [C] token ids of the class words
    groups: np.ndarray  # [P] bootstrap unit of each pair


def prepare(tok, pairs: list[Pair], site_list: list[Site]) -> Prepared:
    """Tokenize, resolve every site's position in both stories and every counterfactual answer; refuse what is
    undefined, naming the pairs and the fix."""
    if not pairs:
        raise ValueError("no pairs given: build them with analyses.pairs.task_pairs or record_pairs")
    names = tuple(pairs[0].base.state_names)
    if bad := [p.name for p in pairs if tuple(p.base.state_names) != names or tuple(p.source.state_names) != names]:
        raise ValueError(f"pairs {bad[:5]} answer with other class words than {list(names)}: every pair of one call "
                         "must share its class words")
    answer_ids = answer_token_ids(tok, list(names))
    P, S = len(pairs), len(site_list)
    pb, ps, tgt = (np.zeros((P, S), dtype=np.int64) for _ in range(3))
    noop = np.zeros((P, S), dtype=bool)
    base_ids, source_ids, missing, undefined = [], [], [], []
    for i, pair in enumerate(pairs):
        lb, ls = (ex.labels(tok, text=ex.prompt) for ex in (pair.base, pair.source))
        base_ids.append(lb.input_ids)
        source_ids.append(ls.input_ids)
        bb, bs = (np.nonzero(lab.is_event_boundary)[0] for lab in (lb, ls))
        for j, site in enumerate(site_list):
            a, b = resolve_position(site.position, bb, len(lb.input_ids)), resolve_position(site.position, bs,
                                                                                            len(ls.input_ids))
            if a is None or b is None:
                missing.append(f"{pair.name} at {site.position} ({'base' if a is None else 'source'})")
                continue
            t = counterfactual_state(pair, int(lb.events_so_far[a]), int(ls.events_so_far[b]))
            if t is None:
                undefined.append(f"{pair.name} at {site.position}")
                continue
            pb[i, j], ps[i, j], tgt[i, j] = a, b, t
            noop[i, j] = a == b and np.array_equal(lb.input_ids[: a + 1], ls.input_ids[: b + 1])
    if missing:
        raise ValueError(f"{len(missing)} site(s) lie past a story's text, e.g. {missing[:4]}: choose position rules "
                         f"every story has ({POSITION_RULES}), or drop the short stories")
    if undefined:
        raise ValueError(f"no rule defines the counterfactual answer of {len(undefined)} (pair, site), e.g. "
                         f"{undefined[:4]}: on records without a replay rule only sites at or after the base's last "
                         "event are defined (positions last_event, last or end:J), and the source's state there "
                         "must be labelled")
    return Prepared(base_ids, source_ids, pb, ps, tgt, np.asarray([p.base.final_state for p in pairs]), noop,
                    answer_ids, np.asarray([p.unit for p in pairs]))


def _padded(seqs: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[b, T_max]`` ids (pad 0: a causal model's real tokens never read it) and lengths ``[b]``."""
    lens = torch.as_tensor([len(s) for s in seqs])
    ids = torch.zeros(len(seqs), int(lens.max()), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.as_tensor(s)
    return ids, lens


def check_inputs(model, site_list: list[Site], bases: dict | None = None) -> None:
    """Refuse, before any forward: a Thinking States model, unknown hooks, bases wider than the residual."""
    if writes_thoughts(model):
        raise ValueError("this model writes thoughts between chunks, which a plain forward does not run: swap its "
                         "written state with analyses.interchange_thinking.thinking_interchange (what `beliefscope "
                         "interchange` runs for such a model)")
    if not site_list:
        raise ValueError("no sites given: build them with analyses.interchange.sites(model, layers, positions)")
    hooks = sorted({s.hook for s in site_list})
    resolve_hooks(model, hooks)
    check_computed(model, hooks)
    d = int(model.cfg.d_model)
    for site, Q in (bases or {}).items():
        if Q is not None and (Q.ndim != 2 or Q.shape[0] != d or not 1 <= Q.shape[1] <= d):
            raise ValueError(f"the subspace at {site.hook} {site.position} has shape {list(Q.shape)}: it must be "
                             f"[d_model={d}, k] with 1 <= k <= {d} (the rank cannot exceed d_model)")


@torch.no_grad()
def source_activations(model, prep: Prepared, site_list: list[Site], batch_size: int = 16) -> torch.Tensor:
    """``[P, S, d]`` float32: each source's activation at each site's hook and position."""
    P, S, d = len(prep.source_ids), len(site_list), int(model.cfg.d_model)
    if P * S * d * 4 > MAX_SOURCE_BYTES:
        raise ValueError(f"{P} pairs x {S} sites would keep {P * S * d * 4 / 2 ** 30:.1f} GiB of source activations: "
                         "pass fewer pairs, layers or positions per call")
    out = torch.zeros(P, S, d)
    by_hook: dict[str, list[int]] = {}
    for j, s in enumerate(site_list):
        by_hook.setdefault(s.hook, []).append(j)
    for lo in range(0, P, batch_size):
        rows = list(range(lo, min(P, lo + batch_size)))
        ids, _ = _padded([prep.source_ids[i] for i in rows])
        r = torch.as_tensor(rows)

        def sink(name, act, r=r):
            for j in by_hook[name]:
                pos = torch.as_tensor(prep.pos_source[r, j]).to(act.device)
                out[r, j] = act[torch.arange(len(r), device=act.device), pos].float().cpu()

        with stream(model, list(by_hook), sink):
            model(ids.to(_device(model)), return_type="logits")
    return out


def _device(model) -> torch.device:
    return next(model.parameters()).device


def last_logits(model, seqs: list, answer_ids: list, fwd_hooks=None) -> torch.Tensor:
    """``[b, C]`` float32: the class words' logits at each sequence's last token, under ``fwd_hooks`` (no gradient;
    `last_logits_grad` keeps it)."""
    with torch.no_grad():
        return last_logits_grad(model, seqs, answer_ids, fwd_hooks).cpu()


def last_logits_grad(model, seqs: list, answer_ids: list, fwd_hooks=None) -> torch.Tensor:
    """`last_logits` on the model's device, differentiable in what the hooks put in (DAS trains through it)."""
    ids, lens = _padded(seqs)
    with hooked(model, fwd_hooks or []):
        logits = model(ids.to(_device(model)), return_type="logits")  # [b, T, V]
    return logits[torch.arange(len(seqs), device=logits.device), lens.to(logits.device) - 1][:, answer_ids].float()


def patch_hooks(rows_site: np.ndarray, rows_pos: np.ndarray, values: torch.Tensor, site_list: list[Site],
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


@dataclass
class InterchangeResult:
    """Per-site scores of one interchange sweep, and every (pair, site) answer behind them."""

    sites: list  # [S] Site
    rows: list  # [S] dict per site: iia (accuracy, interval, n_rows, n_groups), logit-difference shift, ...
    answers: np.ndarray  # [P, S] the class the base answered under the intervention (-1: not run, a no-op)
    target: np.ndarray  # [P, S] counterfactual class
    scored_mask: np.ndarray  # [P, S] bool: the pairs each site's IIA is scored on
    base_correct: float  # share of base stories the model answers right with no intervention
    subspace: str  # what was interchanged: "full", "probe", "random:k", "das:k" or "basis:k"
    extra: dict = field(default_factory=dict)  # what the caller adds (probe folder, DAS split, ...)
    logits: np.ndarray | None = None  # [P, S, C] class logits under each intervention (NaN where not run)
    ran: np.ndarray | None = None  # [P, S] bool: rows intervened (scored_mask adds: the model answers both right)

    def to_json(self) -> dict:
        return {"subspace": self.subspace, "base_correct": round(self.base_correct, 4),
                "scored_on": "pairs whose base and source the model answers right, at sites whose counterfactual "
                             "answer differs from the base's own (the site's token or an earlier one differing "
                             "between the stories)",
                "sites": self.rows, **self.extra}

    def iia_grid(self) -> tuple[list[int], list[str], np.ndarray]:
        """(layers, position rules, ``[L, R]`` IIA, NaN where a site was not run) for a heatmap."""
        layers = sorted({s.layer for s in self.sites})
        rules = list(dict.fromkeys(s.position for s in self.sites))
        grid = np.full((len(layers), len(rules)), np.nan)
        for s, row in zip(self.sites, self.rows):
            grid[layers.index(s.layer), rules.index(s.position)] = row["iia"]["accuracy"]
        return layers, rules, grid


def clean_logits(model, seqs: list, answer_ids: list, batch_size: int) -> torch.Tensor:
    """``[n, C]``: the class words' logits at each sequence's last token, no intervention, in chunks."""
    return torch.cat([last_logits(model, seqs[lo: lo + batch_size], answer_ids) for lo in range(0, len(seqs),
                                                                                               batch_size)])


@torch.no_grad()
def patched_logits(model, prep: Prepared, pi: np.ndarray, sj: np.ndarray, values: torch.Tensor, site_list: list,
                   bases: dict | None = None) -> torch.Tensor:
    """``[b, C]`` class logits of rows (pair ``pi[r]``, site ``sj[r]``) under their interventions, each resumed from
    its base's clean KV cache at the patched token: nothing before that token changes, so the bases are prefilled
    once (one row each), every row is rolled back to its own site, and only the tokens from the site on run again,
    patched at the first of them (what a full recompute gives, to float rounding; tests/test_interchange.py)."""
    from beliefscope.cache import KVCache

    distinct = sorted(set(int(i) for i in pi))
    ids, _ = _padded([prep.base_ids[i] for i in distinct])
    dev = _device(model)
    start = prep.pos_base[pi, sj]  # [b] the patched token of each row
    rest = [prep.base_ids[i][p:] for i, p in zip(pi, start)]
    width = max(len(x) for x in rest)
    base = KVCache.for_model(model, batch=len(distinct), capacity=ids.shape[1] + 8)
    model(ids.to(dev), past_key_values=base, return_type="logits")
    rows = torch.as_tensor([distinct.index(int(i)) for i in pi])
    cache = KVCache.for_model(model, batch=len(pi), capacity=ids.shape[1] + width + 8)
    for layer in range(base.config.n_layers):  # each row's base once, by a buffer copy
        k, v = base.keys(layer, row=None), base.values(layer, row=None)  # [distinct, kv_heads, T, d_head]
        cache.update(k[rows.to(k.device)], v[rows.to(v.device)], layer)
    cache.rollback([int(p) for p in start])
    cont, lens = _padded(rest)
    hooks = patch_hooks(sj, np.zeros(len(pi), dtype=np.int64), values, site_list, bases)
    with hooked(model, hooks):
        logits = model(cont.to(dev), return_type="logits", **cache.forward_kwargs(width))  # [b, width, V]
    base.close()
    cache.close()
    return logits[torch.arange(len(pi), device=logits.device), lens.to(logits.device) - 1][
        :, prep.answer_ids].float().cpu()


def interchange(model, tok, pairs: list[Pair], site_list: list[Site], subspace=None, *, probe=None,
                batch_size: int = 16, seed: int = 0, progress=None) -> InterchangeResult:
    """Interchange interventions of every pair at every site (see the module). ``subspace``: None (the whole
    activation), "probe" (the span of ``probe``'s class directions at each site's hook), "random:k" (a random
    rank-k subspace per site, seeded), a ``[d, k]`` tensor (one basis for every site) or ``{Site: [d, k]}``
    (DAS's). Scored: pairs whose base and source the model answers right with no intervention (an unchanged wrong
    answer would otherwise count as the counterfactual one), at sites where the counterfactual answer differs from
    the base's. ``progress(n)`` is called with the rows done."""
    from beliefscope.analyses.subspaces import site_bases

    bases, label = site_bases(model, site_list, subspace, probe=probe, seed=seed)
    check_inputs(model, site_list, bases)
    prep = prepare(tok, pairs, site_list)
    src = source_activations(model, prep, site_list, batch_size)
    clean = clean_logits(model, prep.base_ids, prep.answer_ids, batch_size)  # [P, C]
    source_state = np.asarray([p.source.final_state for p in pairs])
    base_right = clean.argmax(1).numpy() == prep.base_state  # [P]
    source_right = clean_logits(model, prep.source_ids, prep.answer_ids, batch_size).argmax(1).numpy() == source_state
    P, S = prep.target.shape
    ran = ~prep.noop & (prep.target != prep.base_state[:, None])  # [P, S] rows whose answer should change
    answers = np.full((P, S), -1, dtype=np.int64)
    logits = np.full((P, S, len(prep.answer_ids)), np.nan, dtype=np.float32)
    shift = np.zeros((P, S))
    todo = np.argwhere(ran)  # [n, 2] (pair, site)
    for lo in range(0, len(todo), batch_size):
        chunk = todo[lo: lo + batch_size]
        pi, sj = chunk[:, 0], chunk[:, 1]
        vals = src[torch.as_tensor(pi), torch.as_tensor(sj)]  # [b, d]
        got = patched_logits(model, prep, pi, sj, vals, site_list, bases)  # [b, C]
        logits[pi, sj] = got.numpy()
        answers[pi, sj] = got.argmax(1).numpy()
        t, b = torch.as_tensor(prep.target[pi, sj]), torch.as_tensor(prep.base_state[pi])
        ar = torch.arange(len(pi))
        before = clean[torch.as_tensor(pi)]
        shift[pi, sj] = ((got[ar, t] - got[ar, b]) - (before[ar, t] - before[ar, b])).numpy()
        if progress:
            progress(len(chunk))
    scored_mask = ran & (base_right & source_right)[:, None]
    rows = []
    for j, site in enumerate(site_list):
        m = scored_mask[:, j]
        ok = answers[m, j] == prep.target[m, j]
        iia = scored(ok, prep.groups[m], seed=seed).to_json()
        sh = shift[m, j]
        lo_hi = group_interval(sh, prep.groups[m], seed=seed) if m.sum() > 1 else (float("nan"), float("nan"))
        rows.append({"hook": site.hook, "layer": site.layer, "position": site.position, "iia": iia,
                     "logit_diff_shift": round(float(sh.mean()), 4) if len(sh) else float("nan"),
                     "logit_diff_shift_interval": [round(float(x), 4) for x in lo_hi],
                     "not_scored_no_op": int(prep.noop[:, j].sum()),
                     "not_scored_same_answer": int((~prep.noop[:, j] & ~ran[:, j]).sum()),
                     "not_scored_model_wrong": int((ran[:, j] & ~m).sum())})
    return InterchangeResult(site_list, rows, answers, prep.target, scored_mask, float(np.mean(base_right)), label,
                             logits=logits, ran=ran)
