"""Forced answers at every event boundary (early answering, Lanham et al. 2023), through KV-cache forks.

The story is prefilled once. At each event boundary i the cache is forked at length i + 1, the
question is appended on the branch, the answer distribution is read, and the branch is dropped.
Each position costs O(question length) instead of O(prefix). A Thinking States model is run the
way it runs (chunk by chunk, its thoughts setting the state the question sees), and its thoughts
are read beside the forced answers and the probe.

>>> from beliefscope.models.load import load_model
>>> from beliefscope.tasks import get_task
>>> bridge, tok = load_model("target")
>>> ex = get_task("coinflip").example(seed=0, n_events=3)
>>> fa = forced_answers(bridge, tok, ex)
>>> fa.p_state.shape, bool(((fa.p_state[:, 0] > 0.5) == (fa.true_state == 0)).all())
((3, 2), True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import singledispatch

import numpy as np
import torch

from ..cache import KVCache
from ..decoding.thinking import thinking_readouts
from ..hooks import hook_name
from ..models.load import load_model
from ..models.profile import model_profile
from ..models.thinking.data import thought_state, thought_word_id
from ..models.thinking.model import ThinkingStates
from ..models.tokenizer import answer_token_ids
from ..probes.crossfit import CrossFitted
from ..probes.intervals import group_interval
from ..tasks import get_task, parse_events_range
from ..tasks.records import DataSource, class_counts
from ..tasks.score_checks import require_two_classes
from . import plots
from .common import (
    best_probe_layer,
    check_probe_matches,
    check_probe_rendering,
    check_probe_states,
    check_writable_parent,
    load_probe,
    probe_distribution,
    probe_for_record,
    save_fig,
    sibling,
)


@dataclass
class ForcedAnswers:
    """Answer distributions read at event boundaries of one example."""

    positions: np.ndarray  # [n] token index of each event boundary in the story
    p_state: np.ndarray  # [n, n_states] answer distribution restricted to the state words
    true_state: np.ndarray  # [n] state index after each event
    story_ids: np.ndarray  # [T] token ids of the story (prompt without the question)
    question_ids: np.ndarray  # [q] token ids of the appended question
    thought_state: np.ndarray | None = None  # [n] state named by the thought at each boundary (-1: none)


def split_story(ex) -> tuple[str, str]:
    """(story, question): the prompt up to the end of the last event, and the rest of it."""
    if not ex.events:
        raise ValueError("an example with no events has no event boundaries to read")
    if "question" in ex.meta:  # a record: its text (all of it, even after the last event) and its own question
        q = ex.meta["question"]
        return ex.prompt[: len(ex.prompt) - len(q)], q
    end = ex.events[-1].span[1]
    return ex.prompt[:end], ex.prompt[end:]


def _state_probs(logits: torch.Tensor, ans: list[int]) -> np.ndarray:
    return torch.softmax(logits[..., ans].double(), -1).cpu().numpy()


@singledispatch
@torch.no_grad()
def forced_answers(bridge, tok, ex, use_fork: bool = True, batch_size: int = 64) -> ForcedAnswers:
    """The model's own answer at every event boundary of ``ex``: the question is appended after each
    event and the answer distribution over the state names is read. With ``use_fork`` the KV cache of
    the story is forked at each boundary (the prefix is computed once; equal to recomputing it to
    ~1e-6); otherwise each prefix is recomputed, ``batch_size`` at a time. A Thinking States model is
    read after its own thoughts, chunk by chunk (its overload, below)."""
    return _forced_plain(bridge, tok, ex, use_fork, batch_size)


@forced_answers.register(ThinkingStates)
@torch.no_grad()
def _forced_thinking(model: ThinkingStates, tok, ex, use_fork: bool = True, batch_size: int = 64) -> ForcedAnswers:
    """Forced answers of a Thinking States model at the end of every event's chunk, with its thoughts (it reads
    each story once, so ``use_fork`` and ``batch_size`` do not apply)."""

    story, question = split_story(ex)
    lab = ex.labels(tok, text=story)
    q_ids = torch.tensor(tok(question, add_special_tokens=False)["input_ids"])
    ans = answer_token_ids(tok, ex.state_names)
    r = thinking_readouts(model, lab.input_ids.tolist(), q_ids.tolist(), ans)
    positions = np.nonzero(lab.is_event_boundary)[0]
    by_end = {e - 1: k for k, e in enumerate(r.ends)}
    if any(int(i) not in by_end for i in positions):
        raise ValueError("the model's chunks do not end at the event boundaries; use chunking='events'")
    rows = [by_end[int(i)] for i in positions]

    words = [thought_word_id(tok, s) for s in ex.state_names]  # " heads" for a BPE vocabulary
    named, last = [], -1  # the state each chunk's thought names; an empty thought carries the last one over
    for z in r.thoughts:
        last = last if model.carries(z) else thought_state(ex, z, words)
        named.append(last)
    thought = np.asarray([named[k] for k in rows])
    return ForcedAnswers(positions, r.p_answer[rows].cpu().numpy(), lab.state[positions], lab.input_ids,
                         q_ids.cpu().numpy(), thought_state=thought)


def _forced_plain(bridge, tok, ex, use_fork: bool = True, batch_size: int = 64) -> ForcedAnswers:
    """Answer distribution after every event; `use_fork=False` recomputes each prefix from scratch.

    With a fork, ``batch_size`` > 1 reads up to that many boundaries in one forward: a batch cache
    holds the story in every row, each row is rolled back (O(1)) to its own boundary, and the
    question runs once over the ragged rows with the cache's own mask and position ids.
    ``batch_size=1`` forks the single-row cache once per boundary.
    """
    story, question = split_story(ex)
    lab = ex.labels(tok, text=story)
    story_ids = torch.as_tensor(lab.input_ids)[None]  # [1, T]
    q_ids = torch.tensor(tok(question, add_special_tokens=False)["input_ids"])[None]  # [1, q]
    positions = np.nonzero(lab.is_event_boundary)[0]
    ans = answer_token_ids(tok, ex.state_names)
    out = []
    if q_ids.shape[1] == 0:  # a text that ends in its own question: the answer is the next word at the boundary
        logits = bridge(story_ids, return_type="logits")[0]  # [T, vocab]
        out = [_state_probs(logits[int(i)], ans) for i in positions]
    elif use_fork and batch_size > 1:
        out = _ragged_forks(bridge, story_ids, q_ids, positions, ans, batch_size)
    elif use_fork:
        cache = KVCache.for_model(bridge, batch=1, capacity=story_ids.shape[1] + q_ids.shape[1] + 8)
        bridge(story_ids, past_key_values=cache, return_type="logits")
        for i in positions:
            with cache.fork(at=int(i) + 1) as branch:
                logits = bridge(q_ids, return_type="logits", **branch.forward_kwargs(q_ids.shape[1]))
            out.append(_state_probs(logits[0, -1], ans))
    else:
        for i in positions:
            ids = torch.cat([story_ids[:, : int(i) + 1], q_ids], dim=1)
            out.append(_state_probs(bridge(ids, return_type="logits")[0, -1], ans))
    return ForcedAnswers(positions, np.stack(out), lab.state[positions], lab.input_ids, q_ids[0].numpy())


def _ragged_forks(bridge, story_ids, q_ids, positions, ans, batch_size) -> list[np.ndarray]:
    """Every boundary of one story in batches: rows share the story, each rolled back to its boundary."""
    T, q = story_ids.shape[1], q_ids.shape[1]
    base = KVCache.for_model(bridge, batch=1, capacity=T + 8)
    bridge(story_ids, past_key_values=base, return_type="logits")
    n_layers = base.config.n_layers
    keys = [base.keys(layer)[None] for layer in range(n_layers)]  # each [1, kv_heads, T, d_head]
    values = [base.values(layer)[None] for layer in range(n_layers)]  # each [1, kv_heads, T, d_head]
    out = []
    for s in range(0, len(positions), batch_size):
        rows = positions[s: s + batch_size]
        n = len(rows)
        cache = KVCache.for_model(bridge, batch=n, capacity=T + q + 8)
        # the story once per row (one buffer copy, no forward); row r ends at its own event boundary
        cache.fill_rows([k.expand(n, -1, -1, -1) for k in keys], [v.expand(n, -1, -1, -1) for v in values],
                        [int(i) + 1 for i in rows])
        logits = bridge(q_ids.expand(n, -1), return_type="logits", **cache.forward_kwargs(q))  # [n, q, vocab]
        out.extend(_state_probs(logits[:, -1], ans))
    return out


# ----------------------------------------------------------------------------- many prompts
@dataclass
class ForcedConfig(DataSource):
    """`beliefscope forced`: forced answers (and the probe, when given) at every event boundary of many prompts:
    sampled task prompts, or your own records (`--data`, with `--question` and `--answers`)."""

    model: str = "target"  # checkpoint folder or alias; must be the model the probe was fit on
    probes: str = ""  # folder written by `beliefscope probe --out` (optional with --data)
    out: str = ""  # agreement-by-event PNG; one example's bars go to OUT with suffix "-example" ("": no figures)
    n: int | None = None  # prompts (default: 50 sampled ones; with --data, every record)
    seed: int = 4242  # prompt seed (use one the probe never saw)
    events: str = "1-8"  # events per prompt, LO-HI
    rendering: str | None = None  # toy / natural (default: natural for smollm2, toy otherwise)
    layer: int | None = None  # probe layer (default: the probe report's best layer)
    label: str = ""  # with --data: the label whose states are forced (default: the data's first label)
    question: str = ""  # with --data: the text appended at every event end, e.g. " Where is the key? It is in the"
    answers: tuple = ()  # with --data: one answer word per class, in class order (default: the class names)


@dataclass
class ForcedVsProbe:
    """Forced answers and probe readouts at every event boundary of many prompts (flattened)."""

    prompt: np.ndarray  # [n] prompt index of each boundary
    event: np.ndarray  # [n] 1-based event index (events completed at that boundary)
    forced_p: np.ndarray  # [n, K] forced-answer distribution over the K states' answer words
    probe_p: np.ndarray | None  # [n, K] probe distribution at the same token (None: no probe)
    true_state: np.ndarray  # [n] true state index
    thought: np.ndarray | None = None  # [n] state named by a Thinking States thought (-1: none); None otherwise
    scored_on: dict = field(default_factory=dict)  # how the probe read the records: out-of-fold / held-out -> count

    @property
    def forced(self) -> np.ndarray:
        """``[n]`` forced-answer P(first state)."""
        return self.forced_p[:, 0]

    @property
    def probe(self) -> np.ndarray:
        """``[n]`` probe P(first state)."""
        return self.probe_p[:, 0]

    def _preds(self):
        fp = self.forced_p.argmax(-1)
        return fp, None if self.probe_p is None else self.probe_p.argmax(-1)

    def rates(self) -> dict:
        """Accuracies (argmax over every state) and agreements."""
        fp, pp = self._preds()
        out = {"forced_accuracy": float(np.mean(fp == self.true_state)), "n_boundaries": len(fp)}
        if pp is not None:
            out.update(agreement=float(np.mean(fp == pp)), probe_accuracy=float(np.mean(pp == self.true_state)))
        if self.thought is not None:
            out.update(thought_accuracy=float(np.mean(self.thought == self.true_state)),
                       forced_thought_agreement=float(np.mean(fp == self.thought)))
            if pp is not None:
                out["probe_thought_agreement"] = float(np.mean(pp == self.thought))
        return out

    def intervals(self) -> dict:
        """95% bootstrap intervals over prompts (records) of every rate, and the chance level ``1 / K``."""
        fp, pp = self._preds()
        hits = {"forced_accuracy": fp == self.true_state}
        if pp is not None:
            hits.update(probe_accuracy=pp == self.true_state, agreement=fp == pp)
        out = {k: [round(x, 4) for x in group_interval(v.astype(float), self.prompt)] for k, v in hits.items()}
        return {**out, "chance": round(1 / self.forced_p.shape[1], 4), "n_records": len(np.unique(self.prompt))}

    def by_event(self) -> dict:
        fp, pp = self._preds()
        ks = sorted(set(self.event.tolist()))
        sel = [self.event == k for k in ks]
        out = {"event": ks, "forced_accuracy": [float(np.mean((fp == self.true_state)[m])) for m in sel],
               "n": [int(m.sum()) for m in sel]}
        if pp is not None:
            out.update(agreement=[float(np.mean((fp == pp)[m])) for m in sel],
                       probe_accuracy=[float(np.mean((pp == self.true_state)[m])) for m in sel])
        return out


def forced_vs_probe_many(bridge, tok, probe, hook: str | None, examples, progress=None,
                         crossfit=None) -> ForcedVsProbe:
    """Forced answers (through cache forks) and the probe's distribution at `hook` (when a probe is given),
    at every event boundary. With `crossfit` (a `CrossFitted`), a record the probe was fitted on is read by
    the fold probe that did not see it; `scored_on` counts the records read each way."""

    cols = {k: [] for k in ("prompt", "event", "forced", "probe", "true_state", "thought")}
    scored_on: dict = {}
    for i, ex in enumerate(examples):
        fa = forced_answers(bridge, tok, ex)
        if probe is not None:
            use, how = (probe, "not cross-fitted") if crossfit is None else probe_for_record(probe, "", ex, crossfit)
            scored_on[how] = scored_on.get(how, 0) + 1
            cols["probe"] += list(probe_distribution(bridge, use, fa.story_ids, [hook])[0][fa.positions])
        cols["prompt"] += [i] * len(fa.positions)
        cols["event"] += list(range(1, len(fa.positions) + 1))
        cols["forced"] += list(fa.p_state)
        cols["true_state"] += fa.true_state.tolist()
        if fa.thought_state is not None:
            cols["thought"] += fa.thought_state.tolist()
        if progress:
            progress(1)
    arrays = {k: np.asarray(v) for k, v in cols.items()}
    res = ForcedVsProbe(arrays["prompt"], arrays["event"], arrays["forced"],
                        arrays["probe"] if probe is not None else None, arrays["true_state"],
                        thought=arrays["thought"] if cols["thought"] else None, scored_on=scored_on)
    return res


def data_examples_for_forced(config: ForcedConfig) -> list:
    """Your records as examples whose prompt is the text and the question, whose states are the answer words."""
    data = config.load()
    label = data.check_label(config.label or data.label_names[0])
    if not config.question.strip() and not data.has_questions() and data.kinds[label] != "text":
        # (a label per text needs no question: its text ends in its own question and is read at its end)
        raise ValueError("forced answers on your data need the question asked at every event end: pass --question, "
                         "e.g. --question ' Where is the key now? It is in the' (or a template over the record's "
                         f"fields, ' Where is the {{object}} now?'), or give every record a {config.question_field!r} "
                         "field")
    require_two_classes(class_counts(data, label), label, data.source)
    n = len(data) if config.n is None else config.n
    if n < 1:
        raise ValueError(f"--n {n}: read at least 1 record")
    return [data.example(i, label, question=config.question, answers=config.answers) for i in range(min(n, len(data)))]


def main(config: ForcedConfig, *, bridge=None, tok=None, progress=None) -> dict:
    """Forced answers (and the probe) at every event boundary; write two figures if `config.out`; return the rates."""

    out = check_writable_parent(config.out) if config.out else ""
    if config.data:
        examples = data_examples_for_forced(config)  # every record checked before any model loads
    else:
        lo, hi = parse_events_range(config.events)
        n = 50 if config.n is None else config.n
        if n < 1:
            raise ValueError(f"n must be at least 1 prompt, got {n}")
        if not config.probes:
            raise ValueError("--probes is required for sampled prompts (it is optional with --data)")
    probe = load_probe(config.probes) if config.probes else None
    if probe is not None and config.data:
        check_probe_states(probe, examples[0])
    if bridge is None:

        bridge, tok = load_model(config.model)
    layer = hook = None
    if probe is not None:
        check_probe_matches(probe, bridge, config.model)
        layer = config.layer if config.layer is not None else best_probe_layer(probe, config.probes)
        hook = hook_name("resid_post", layer)
    rendering = "natural"
    if not config.data:
        rendering = config.rendering or model_profile(config.model).rendering
        check_probe_rendering(probe, rendering)
        examples = get_task("coinflip", rendering=rendering, fmt="direct", split="all").examples(n, config.seed,
                                                                                                   (lo, hi))
    crossfit = CrossFitted.load(config.probes, probe) if probe is not None else None
    if probe is not None and config.data:
        probe_for_record(probe, config.probes, examples[0], crossfit)  # refuses a folder without fold probes
    res = forced_vs_probe_many(bridge, tok, probe, hook, examples, progress, crossfit=crossfit)
    rates, by_event = res.rates(), res.by_event()
    files = _figures(bridge, tok, res, by_event, examples, layer, out) if out else []
    head = {"model": config.model, "probes": config.probes, "layer": layer, "n_prompts": len(examples),
            "scored_on": res.scored_on if probe is not None else None}
    if config.data:
        head.update(data=config.data, label=examples[0].meta["label"], question=config.question,
                    state_names=list(examples[0].meta["classes"]), answers=list(examples[0].state_names))
    else:
        head.update(events=f"{lo}-{hi}", seed=config.seed, rendering=rendering)
    return {**head, **{k: round(v, 4) if isinstance(v, float) else v for k, v in rates.items()},
            "intervals": res.intervals(), "by_event": by_event, "files": files}


def _figures(bridge, tok, res, by_event, examples, layer, out) -> list[str]:
    """The accuracy-by-event figure and one example's bars; returns the paths written."""

    s0 = examples[0].state_names[0]
    fig = plots.agreement_by_event(by_event["event"], by_event["forced_accuracy"], by_event.get("probe_accuracy"),
                                   by_event.get("agreement"), layer, chance=1 / res.forced_p.shape[1])
    ex_i = int(np.argmax([e.n_events for e in examples]))  # the longest story shows the most events
    rows = res.prompt == ex_i
    fa = forced_answers(bridge, tok, examples[ex_i])
    labels = [f"{k + 1} {e.kind}" for k, e in enumerate(examples[ex_i].events)]
    K, truth = res.forced_p.shape[1], res.true_state[rows]
    if K == 2:
        probe = res.probe[rows] if res.probe_p is not None else np.full(int(rows.sum()), np.nan)
        ex_fig = plots.forced_vs_probe(fa.positions, res.forced[rows], probe, (truth == 0).astype(float),
                                       labels=labels, state_name=s0)
    else:  # P(true class) of each, against chance 1/k
        at = np.arange(len(truth))
        probe = res.probe_p[rows][at, truth] if res.probe_p is not None else np.full(len(truth), np.nan)
        ex_fig = plots.forced_vs_probe(fa.positions, res.forced_p[rows][at, truth], probe, None, labels=labels,
                                       chance=1 / K)
    ex_path = sibling(out, "-example")
    save_fig(fig, out)
    save_fig(ex_fig, ex_path)
    return [out, ex_path]
