"""Plain-language readings of the demo's figures, computed from the numbers in its `summary.json` (nothing
is canned): one function per section of `report.html` (`analyses.report` renders the page).

>>> reading_steering({"flip_rate": 0.9, "random": {"mean": 0.02, "std": 0.01, "n": 10}, "layer": 2, "alpha": 1.0,
...                   "n_prompts": 50})[:40]
'Adding the probe direction at layer 2 (α'
"""

from __future__ import annotations

import numpy as np


def pct(x) -> str:
    """A share in [0, 1] as a percentage with one decimal; "n/a" for None."""
    return "n/a" if x is None else f"{100 * float(x):.1f}%"


def reading_eval(ev: dict) -> str:
    acc = ev["answer_accuracy"]
    by = ev.get("answer_accuracy_by_events", {})
    worst = min(by.items(), key=lambda kv: kv[1]) if by else None
    s = f"The model answers {pct(acc)} of {ev['n']} direct prompts ({ev['events']} events) correctly"
    if "exact_match" in ev:
        s += f", and its greedy chain of thought matches the reference exactly on {pct(ev['exact_match'])}"
    s += "."
    if worst is not None and worst[1] < acc - 0.02:
        s += f" It is weakest with {worst[0]} events ({pct(worst[1])})."
    elif worst is not None:
        s += " Accuracy is flat across story lengths."
    return s


def reading_probe(rep: dict, who: str = "the model") -> str:
    best = next(r for r in rep["layers"] if r["layer"] == rep["best_layer"])
    base = [v for v in (rep.get("embedding_accuracy"), best.get("random_init_accuracy")) if v is not None]
    gap = best["accuracy"] - max(base) if base else None
    s = (f"Linear probes for the coin's state on {who}: the best layer (L{rep['best_layer']}) reaches "
         f"{pct(best['accuracy'])} on prompts it never saw (folds split by prompt), against "
         f"{pct(rep.get('embedding_accuracy'))} from the embeddings alone, "
         f"{pct(best.get('random_init_accuracy'))} for a randomly initialised model of the same shape, and "
         f"{pct(rep['majority_accuracy'])} for always guessing the majority class. "
         + (f"The control task reaches {pct(best['control_accuracy'])} there "
            f"(selectivity {best['selectivity']:+.3f})." if best.get("control_accuracy") is not None else
            f"The control task is left out there: {rep.get('control', {}).get('note', 'it is not defined')}."))
    if rep.get("verdict"):  # the margin over the strongest baseline, with its interval
        s += f" Against the strongest baseline: {rep['verdict']}."
    elif gap is not None:
        s += (" That is far above every baseline." if gap >= 0.3 else
              f" That is only {100 * gap:.0f} points above the strongest baseline: weak evidence of a state "
              "representation." if gap > 0.05 else " That is no better than the baselines: no evidence that "
              "the state is represented linearly.")
    if best.get("heldout_length_accuracy") is not None:
        s += (f" On longer stories than it was trained on ({rep['heldout_lengths']['test_prompts']} prompts), "
              f"the same probe gets {pct(best['heldout_length_accuracy'])}.")
    if best.get("heldout_template_accuracy") is not None:
        s += f" On held-out templates and names it gets {pct(best['heldout_template_accuracy'])}."
    return s


def reading_thinking(th: dict) -> str:
    t, g = th["thinking"], th["target"]
    s = (f"On this story the Thinking States model's probe (layer {t['best_layer']}) reads the state at "
         f"{pct(t['probe_accuracy_at_boundaries_by_layer'][t['best_layer']])} of event boundaries and its thoughts "
         f"name it at {pct(t.get('thought_accuracy', float('nan')))}; the direct-answer target's best probe reads "
         f"{pct(g['probe_accuracy_at_boundaries_by_layer'][g['best_layer']])} although its forced answers are "
         f"right at {pct(g['forced_accuracy'])}. ")
    lazy = g["probe_accuracy_at_boundaries_by_layer"][g["best_layer"]] < 0.9 <= g["forced_accuracy"]
    s += ("The target answers correctly when asked but keeps no running state that a linear probe can read: it "
          "computes the state at the question." if lazy else
          "On this story the target's running state is readable too; see the instrument table for the rates "
          "over many prompts.")
    return s


def reading_instrument(r: dict) -> str:
    """One model's `instrument` result: its verdict, band by band accuracies, and the causal check."""
    bands = r["bands"]
    first, last = next(iter(bands)), list(bands)[-1]
    s = (f"{r['verdict'][0].upper()}{r['verdict'][1:]}: at {first} events its thoughts are right at "
         f"{pct(bands[first].get('thought_accuracy'))} of event boundaries and its forced answers at "
         f"{pct(bands[first].get('forced_accuracy'))}, at {last} events {pct(bands[last].get('thought_accuracy'))} "
         f"and {pct(bands[last].get('forced_accuracy'))}; its best-layer probe agrees with its thoughts at "
         f"{pct(bands[first].get('probe_thought_agreement'))}.")
    c = r.get("causal")
    if c:
        s += (f" Swapping the state S at one chunk changes the answer in {pct(c['answer_flip_rate_swap'])} of "
              f"{c['n']} stories (random vectors of equal norm: {pct(c['answer_flip_rate_random'])}): the state "
              "it writes down is the one it uses.")
    return s


def reading_view(v: dict) -> str:
    """The viewer's numbers: how often each model's probe follows the truth, and the decode's acceptance."""
    parts = [f"{name}'s probe (layer {m['best_layer']}) follows the truth on {pct(m['probe_accuracy_at_best'])} of "
             "the tokens after the first event" for name, m in v["models"].items()]
    s = f"On {v['n_stories']} held-out stories, " + "; ".join(parts) + "."
    acc = [a for a in ((v.get("decode") or {}).get("acceptance") or []) if a is not None]
    if acc:
        s += f" Decoded speculatively, {v['decode']['model']} accepted {pct(sum(acc) / len(acc))} of drafted tokens."
    return s


def reading_beliefs(b: dict) -> str:

    layers, p = b["layers"], np.asarray(b["p_state0"])
    true = np.asarray(b["true_state"])
    start = b["event_boundaries"][0] if b["event_boundaries"] else 0
    acc = {layer: float(np.mean(((p[i] < 0.5).astype(int) == true)[start:])) for i, layer in enumerate(layers)}
    first = layers[0]
    s = (f"On this prompt the probe at layer {b['layer']} follows the true state on {pct(acc[b['layer']])} of "
         f"the tokens after the first event, against {pct(acc[first])} at "
         f"{'the embedding' if first < 0 else f'layer {first}'}.")
    bnd = b["event_boundaries"]
    row = p[layers.index(b["layer"])]
    changes = [k for k in range(1, len(bnd)) if true[bnd[k]] != true[bnd[k - 1]]]
    if changes:
        hit = sum(int((row[bnd[k]] < 0.5) == bool(true[bnd[k]])) for k in changes)
        s += (f" Of the {len(changes)} events that change the state, the probe's reading has switched by the "
              f"token completing the event in {hit}.")
    if "forced_p_state0" in b:
        f = np.asarray(b["forced_p_state0"])
        agree = float(np.mean((f < 0.5) == (row[bnd] < 0.5)))
        s += (f" Forcing the answer after each event (squares) agrees with the probe at {pct(agree)} of the "
              "event boundaries.")
    return s


def reading_forced(f: dict) -> str:
    s = (f"Over {f['n_prompts']} prompts and {f['n_boundaries']} event boundaries, the forced answer is right "
         f"{pct(f['forced_accuracy'])} of the time and the probe (layer {f['layer']}) {pct(f['probe_accuracy'])};"
         f" they agree on {pct(f['agreement'])}.")
    be = f["by_event"]
    low = [k for k, a in zip(be["event"], be["forced_accuracy"]) if a < 0.9]
    if low:
        s += f" The forced answer falls below 90% from event {low[0]} on"
        s += "." if len(low) > 1 else f" (only at event {low[0]})."
    else:
        s += " The forced answer stays above 90% at every event count."
    if f["agreement"] < min(f["forced_accuracy"], f["probe_accuracy"]) - 0.05:
        s += " Where they disagree, they are wrong in different places: the two readouts are not redundant."
    return s


def reading_trace(t: dict) -> str:
    s = (f"With the {t['drafter']} drafter at γ={t['gamma']}, {pct(t['acceptance'])} of "
         f"{t['drafted']} drafted tokens were accepted over {t['n_prompts']} prompts "
         f"({t['tokens_per_step']} tokens per verify step); {t['n_rejections']} verify steps rejected a draft.")
    d, db = t.get("draft_belief_wrong_at_rejections"), t.get("draft_belief_wrong_base_rate")
    if d is not None and db is not None:
        s += (f" Where drafts were rejected, the draft model's probe had the state wrong {pct(d)} of the time, "
              f"against {pct(db)} at event boundaries in general")
        s += (": rejections concentrate where the draft's belief is wrong." if d > db + 0.1 else
              ": rejections are no more likely where the draft's probe is wrong, so the draft's errors are not "
              "explained by its linearly readable belief." if d <= db + 0.02 else
              ": a slight excess, too small to call.")
    elif t["n_rejections"] == 0:
        s += " Nothing was rejected, so there is no belief comparison to draw."
    tw = t.get("target_belief_wrong_at_rejections")
    if tw is not None:
        s += f" The target's probe had it wrong at {pct(tw)} of those positions."
    return s


def reading_determinism(d: dict) -> str:
    s = (f"With a {d.get('fast_path_dtype', 'float32')} fast path, verified (deterministic) requests produced at "
         f"most {d['verified_unique_max']} distinct output(s) per "
         f"prompt across {d.get('n_configurations', '?')} batch compositions and arrival orders; the unverified "
         f"fast path produced at most {d['fast_path_unique_max']}.")
    if d["verified_unique_max"] == 1 and d["fast_path_unique_max"] == 1:
        s += (" On this CPU the fast path happened not to change any token either: the verified path is "
              "deterministic by construction (fixed-shape verify), the fast path only because this model's "
              "margins are larger than the batch-dependent rounding.")
    elif d["verified_unique_max"] == 1:
        s += " Batch composition changes the fast path's tokens; verification removes that dependence."
    return s


def reading_steering(st: dict) -> str:
    r = st["random"]
    s = (f"Adding the probe direction at layer {st['layer']} (α={st['alpha']} × the mean residual norm) flips "
         f"the model's answer on {pct(st['flip_rate'])} of {st['n_prompts']} prompts; {r['n']} random directions "
         f"of the same norm flip {pct(r['mean'])} (std {pct(r['std'])}).")
    s += (" The direction the probe found is used by the model." if st["flip_rate"] >= 0.8 and r["mean"] <= 0.1
          else " The probe direction is at best weakly causal at this strength." if st["flip_rate"] > r["mean"] + 0.2
          else " The probe direction is no more causal than a random one here.")
    return s
