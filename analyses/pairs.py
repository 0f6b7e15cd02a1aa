"""Counterfactual pairs for interchange interventions: a base story and a source story whose state differs.

An interchange intervention (Geiger et al. 2021) runs the base, replaces the activation at one site by the
source's activation there, and asks whether the answer becomes the one the *source's* state would give. The
answer expected is stated by a rule the user can read (`counterfactual_state`):

- a site whose token has read ``d`` events of the source carries, by hypothesis, the source's state after
  ``d`` events;
- the base then goes on with its own later events: a built-in task replays them from that state (a coin's
  flips, the cups' swaps), so the answer is computed, not assumed;
- a record of the user's has no replay rule, so only a site at or after the base's last event is defined:
  the answer is the source's state there (its final state when the site is at or after its last event too).

Where the rule leaves the answer undefined, the pair is refused at that site, naming the records.

>>> from beliefscope.tasks import get_task
>>> pairs = task_pairs(get_task("coinflip"), n=4, seed=0, events=(2, 4))
>>> [p.base.events[0].kind != p.source.events[0].kind for p in pairs]
[True, True, True, True]
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass

from ..tasks.base import Example, parse_events_range

REPLAY_TASKS = ("coinflip", "cups")  # built-in tasks of one state whose replay rule the counterfactual uses


@dataclass(frozen=True)
class Pair:
    """One (base, source) pair: the base runs, the source gives the activation put in at a site."""

    base: Example  # the story that runs, its question appended
    source: Example  # the story whose activation is put in
    name: str  # how errors and JSON name the pair, e.g. "r12<-r40" (base id, source id)
    group: str = ""  # bootstrap unit: pairs sharing a base story share a group ("" = the base's name)

    @property
    def unit(self) -> str:
        return self.group or self.name.split("<-")[0]


def states_after(ex: Example) -> list[int]:
    """``[E + 1]`` the state before any event, then after each event (-1 where unlabelled)."""
    return [int(ex.initial)] + [int(e.state_after) for e in ex.events]


def counterfactual_state(pair: Pair, base_done: int, source_done: int) -> int | None:
    """The answer (a state index) the base should give when a site that has read ``source_done`` events of the
    source replaces its counterpart, which has read ``base_done`` events of the base; None where no rule defines it
    (see the module's rule)."""
    src = states_after(pair.source)[source_done]
    if src < 0:
        return None
    n_base = len(pair.base.events)
    if base_done >= n_base:
        return src
    if pair.base.task not in REPLAY_TASKS:
        return None
    later = importlib.import_module(f"beliefscope.tasks.{pair.base.task}").replay(pair.base, base_done, src)
    return int(later[-1]) if later else src


def task_pairs(task, n: int, seed: int = 0, events=(2, 8), event: int = 0) -> list[Pair]:
    """``n`` minimal pairs from a built-in task: a story, and the same story with one event's kind turned over
    (``event``, 0-based, negative from the end; the first by default, so that every later boundary differs).
    The source's answer is the base's other state. Only the coin task draws such pairs (its events are a flip or
    a stay); the others are refused, naming what to pass instead."""

    if getattr(task, "name", "") != "coinflip":
        raise ValueError(f"minimal pairs are drawn for the coin task only (one flip turned into a stay); task "
                         f"{getattr(task, 'name', task)!r} has none: build Pair(base, source, name) from your own "
                         "examples, or use record_pairs on records")
    lo, hi = parse_events_range(events)
    if event >= lo or event < -lo:
        raise ValueError(f"event={event} is not an event of every story of {lo}-{hi} events: use 0..{lo - 1} or "
                         f"-1..-{lo}, or draw longer stories (events=({event + 1 if event >= 0 else -event}, {hi}))")
    rng = random.Random(f"pairs/{seed}")
    out = []
    for i in range(n):
        s, k = seed * 1_000_003 + i, rng.randint(lo, hi)
        base, source = task.example(s, k), task.example(s, k, toggle=event)
        out.append(Pair(base, source, f"{s}<-{s}~{event % k}"))
    return out


def record_pairs(data, label: str = "", question: str = "", answers=None, by: str = "group", seed: int = 0,
                 max_pairs: int = 0) -> list[Pair]:
    """Pairs from the user's records (a `tasks.records.Data`), whose final states differ:

    - ``by="group"``: every ordered pair of records that share a group (the data's group field, e.g. ``pair``)
      and end in different states;
    - ``by="events"``: each record as the base once, with a source drawn (seeded) among the records that end in
      another state, of the same number of events where there is one.

    ``max_pairs`` > 0 keeps the first that many. Refused: a label of token spans (no state at an event), and a
    pair set that is empty (naming why)."""
    label = data.check_label(label or data.label_names[0])
    if data.kinds[label] == "spans":
        raise ValueError(f"label {label!r} tags token spans, which set no state an answer could follow: pass a "
                         "label of events or one per text")
    if by not in ("group", "events"):
        raise ValueError(f"by={by!r} is unknown: use 'group' (records sharing the group field) or 'events' (pairs "
                         "drawn among records that end in different states)")
    exs = [data.example(i, label, question, answers) for i in range(len(data))]
    final = [ex.final_state for ex in exs]
    out: list[Pair] = []
    if by == "group":
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(data.records):
            groups.setdefault(r.group, []).append(i)
        for members in groups.values():
            out += [Pair(exs[i], exs[j], f"{data.records[i].id}<-{data.records[j].id}", data.records[i].group)
                    for i in members for j in members if i != j and final[i] != final[j] and final[j] >= 0]
        if not out:
            raise ValueError(f"no two records of {data.source} share a group ({data.config.group_field!r}) and end "
                             "in different states, so no pair defines a counterfactual answer: give each pair a "
                             "shared group field, or use by='events'")
    else:
        rng = random.Random(f"record-pairs/{seed}")
        for i, ex in enumerate(exs):
            other = [j for j in range(len(exs)) if final[j] != final[i] and final[j] >= 0]
            same_len = [j for j in other if len(exs[j].events) == len(ex.events)]
            if other and final[i] >= 0:
                j = rng.choice(same_len or other)
                out.append(Pair(ex, exs[j], f"{data.records[i].id}<-{data.records[j].id}", data.records[i].id))
        if not out:
            raise ValueError(f"every record of {data.source} ends in the same state ({label!r}), so no pair "
                             "defines a counterfactual answer: interchange needs records of at least two classes")
    return out[:max_pairs] if max_pairs > 0 else out
