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
from functools import singledispatch

import numpy as np
import torch

from ..hooks.names import check_computed, hook_name, resolve_hooks
from ..models.thinking.model import ThinkingStates
from ..models.tokenizer import answer_token_ids
from ..probes.intervals import group_interval, scored
from .pairs import Pair, counterfactual_state
from .patching import (  # noqa: F401 (last_logits, last_logits_grad: re-exported)
    Prefilled,
    last_logits,
    last_logits_grad,
    patch_hooks,
    resumed_logits,
    row_batches,
    source_pass,
)
from .subspaces import site_bases

POSITION_RULES = "last, last_event, event:K (0-based, negative from the end), end:J (J-th token from the end), pos:N"


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


@singledispatch
def check_inputs(model, site_list: list[Site], bases: dict | None = None) -> None:
    """Refuse, before any forward: a Thinking States model (its overload, below), unknown hooks, bases wider than
    the residual."""
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


@check_inputs.register(ThinkingStates)
def _refuse_thinking(model, site_list: list[Site], bases: dict | None = None) -> None:
    raise ValueError("this model writes thoughts between chunks, which a plain forward does not run: swap its "
                     "written state with analyses.interchange_thinking.thinking_interchange (what `beliefscope "
                     "interchange` runs for such a model)")


def source_activations(model, prep: Prepared, site_list: list[Site], batch_size: int = 16) -> torch.Tensor:
    """``[P, S, d]`` float32: each source's activation at each site's hook and position."""
    return source_pass(model, prep.source_ids, prep.pos_source, site_list, prep.answer_ids, batch_size)[0]


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


def interchange(model, tok, pairs: list[Pair], site_list: list[Site], subspace=None, *, probe=None,
                batch_size: int = 16, seed: int = 0, progress=None) -> InterchangeResult:
    """Interchange interventions of every pair at every site (see the module). ``subspace``: None (the whole
    activation), "probe" (the span of ``probe``'s class directions at each site's hook), "random:k" (a random
    rank-k subspace per site, seeded), a ``[d, k]`` tensor (one basis for every site) or ``{Site: [d, k]}``
    (DAS's). Scored: pairs whose base and source the model answers right with no intervention (an unchanged wrong
    answer would otherwise count as the counterfactual one), at sites where the counterfactual answer differs from
    the base's. ``progress(n)`` is called with the rows done."""

    bases, label = site_bases(model, site_list, subspace, probe=probe, seed=seed)
    check_inputs(model, site_list, bases)
    prep = prepare(tok, pairs, site_list)
    src, source_logits = source_pass(model, prep.source_ids, prep.pos_source, site_list, prep.answer_ids,
                                     batch_size)  # [P, S, d], [P, C]
    source_state = np.asarray([p.source.final_state for p in pairs])
    source_right = source_logits.argmax(1).numpy() == source_state  # [P]
    P, S = prep.target.shape
    ran = ~prep.noop & (prep.target != prep.base_state[:, None])  # [P, S] rows whose answer should change
    answers = np.full((P, S), -1, dtype=np.int64)
    logits = np.full((P, S, len(prep.answer_ids)), np.nan, dtype=np.float32)
    shift = np.zeros((P, S))
    clean = torch.zeros(P, len(prep.answer_ids))  # [P, C] the bases' own class logits
    for lo in range(0, P, batch_size):  # the bases of a batch are prefilled once; their rows resume from them
        chunk = np.arange(lo, min(P, lo + batch_size))
        base = Prefilled(model, [prep.base_ids[i] for i in chunk], prep.answer_ids, batch_size)
        clean[chunk] = base.logits
        todo = np.argwhere(ran[chunk]) + [lo, 0]  # [n, 2] (pair, site)
        starts = prep.pos_base[todo[:, 0], todo[:, 1]]  # [n] the patched token of each row
        widths = np.asarray([len(prep.base_ids[i]) for i in todo[:, 0]]) - starts
        budget = batch_size * max(len(prep.base_ids[i]) for i in chunk)  # a clean forward's tokens
        for rows in row_batches(widths, budget, max_rows=8 * batch_size):
            pi, sj = todo[rows, 0], todo[rows, 1]
            vals = src[torch.as_tensor(pi), torch.as_tensor(sj)]  # [b, d]
            hooks = patch_hooks(sj, np.zeros(len(pi), dtype=np.int64), vals, site_list, bases)
            got = resumed_logits(model, base, pi - lo, starts[rows],
                                 [prep.base_ids[i][p:] for i, p in zip(pi, starts[rows])], hooks,
                                 prep.answer_ids)  # [b, C]
            logits[pi, sj] = got.numpy()
            answers[pi, sj] = got.argmax(1).numpy()
            t, b = torch.as_tensor(prep.target[pi, sj]), torch.as_tensor(prep.base_state[pi])
            ar = torch.arange(len(pi))
            before = clean[torch.as_tensor(pi)]
            shift[pi, sj] = ((got[ar, t] - got[ar, b]) - (before[ar, t] - before[ar, b])).numpy()
            if progress:
                progress(len(rows))
        base.close()
    base_right = clean.argmax(1).numpy() == prep.base_state  # [P]
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
