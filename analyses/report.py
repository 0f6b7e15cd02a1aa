"""The demo's self-contained `report.html`: figures inlined as base64 PNG, and a plain-language
reading of each figure computed from the numbers in `summary.json` (nothing is canned).

>>> reading_steering({"flip_rate": 0.9, "random": {"mean": 0.02, "std": 0.01, "n": 10}, "layer": 2, "alpha": 1.0,
...                   "n_prompts": 50})[:40]
'Adding the probe direction at layer 2 (α'
"""

from __future__ import annotations

import html

from beliefscope.analyses.common import png_data_uri


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * float(x):.1f}%"


def reading_eval(ev: dict) -> str:
    acc = ev["answer_accuracy"]
    by = ev.get("answer_accuracy_by_events", {})
    worst = min(by.items(), key=lambda kv: kv[1]) if by else None
    s = f"The model answers {_pct(acc)} of {ev['n']} direct prompts ({ev['events']} events) correctly"
    if "exact_match" in ev:
        s += f", and its greedy chain of thought matches the reference exactly on {_pct(ev['exact_match'])}"
    s += "."
    if worst is not None and worst[1] < acc - 0.02:
        s += f" It is weakest with {worst[0]} events ({_pct(worst[1])})."
    elif worst is not None:
        s += " Accuracy is flat across story lengths."
    return s


def reading_probe(rep: dict, who: str = "the model") -> str:
    best = next(r for r in rep["layers"] if r["layer"] == rep["best_layer"])
    base = [v for v in (rep.get("embedding_accuracy"), best.get("random_init_accuracy")) if v is not None]
    gap = best["accuracy"] - max(base) if base else None
    s = (f"Linear probes for the coin's state on {who}: the best layer (L{rep['best_layer']}) reaches "
         f"{_pct(best['accuracy'])} on prompts it never saw (folds split by prompt), against "
         f"{_pct(rep.get('embedding_accuracy'))} from the embeddings alone, "
         f"{_pct(best.get('random_init_accuracy'))} for a randomly initialised model of the same shape, and "
         f"{_pct(rep['majority_accuracy'])} for always guessing the majority class. "
         f"The control task reaches {_pct(best['control_accuracy'])} there "
         f"(selectivity {best['selectivity']:+.3f}).")
    if gap is not None:
        s += (" That is far above every baseline." if gap >= 0.3 else
              f" That is only {100 * gap:.0f} points above the strongest baseline: weak evidence of a state "
              "representation." if gap > 0.05 else " That is no better than the baselines: no evidence that "
              "the state is represented linearly.")
    if best.get("heldout_length_accuracy") is not None:
        s += (f" On longer stories than it was trained on ({rep['heldout_lengths']['test_prompts']} prompts), "
              f"the same probe gets {_pct(best['heldout_length_accuracy'])}.")
    if best.get("heldout_template_accuracy") is not None:
        s += f" On held-out templates and names it gets {_pct(best['heldout_template_accuracy'])}."
    return s


def reading_thinking(th: dict) -> str:
    t, g = th["thinking"], th["target"]
    s = (f"On this story the Thinking States model's probe (layer {t['best_layer']}) reads the state at "
         f"{_pct(t['probe_accuracy_at_boundaries_by_layer'][t['best_layer']])} of event boundaries and its thoughts "
         f"name it at {_pct(t.get('thought_accuracy', float('nan')))}; the direct-answer target's best probe reads "
         f"{_pct(g['probe_accuracy_at_boundaries_by_layer'][g['best_layer']])} although its forced answers are "
         f"right at {_pct(g['forced_accuracy'])}. ")
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
         f"{_pct(bands[first].get('thought_accuracy'))} of event boundaries and its forced answers at "
         f"{_pct(bands[first].get('forced_accuracy'))}, at {last} events {_pct(bands[last].get('thought_accuracy'))} "
         f"and {_pct(bands[last].get('forced_accuracy'))}; its best-layer probe agrees with its thoughts at "
         f"{_pct(bands[first].get('probe_thought_agreement'))}.")
    c = r.get("causal")
    if c:
        s += (f" Swapping the state S at one chunk changes the answer in {_pct(c['answer_flip_rate_swap'])} of "
              f"{c['n']} stories (random vectors of equal norm: {_pct(c['answer_flip_rate_random'])}): the state "
              "it writes down is the one it uses.")
    return s


def reading_view(v: dict) -> str:
    """The viewer's numbers: how often each model's probe follows the truth, and the decode's acceptance."""
    parts = [f"{name}'s probe (layer {m['best_layer']}) follows the truth on {_pct(m['probe_accuracy_at_best'])} of "
             "the tokens after the first event" for name, m in v["models"].items()]
    s = f"On {v['n_stories']} held-out stories, " + "; ".join(parts) + "."
    acc = [a for a in ((v.get("decode") or {}).get("acceptance") or []) if a is not None]
    if acc:
        s += f" Decoded speculatively, {v['decode']['model']} accepted {_pct(sum(acc) / len(acc))} of drafted tokens."
    return s


def reading_beliefs(b: dict) -> str:
    import numpy as np

    layers, p = b["layers"], np.asarray(b["p_state0"])
    true = np.asarray(b["true_state"])
    start = b["event_boundaries"][0] if b["event_boundaries"] else 0
    acc = {layer: float(np.mean(((p[i] < 0.5).astype(int) == true)[start:])) for i, layer in enumerate(layers)}
    first = layers[0]
    s = (f"On this prompt the probe at layer {b['layer']} follows the true state on {_pct(acc[b['layer']])} of "
         f"the tokens after the first event, against {_pct(acc[first])} at "
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
        s += (f" Forcing the answer after each event (squares) agrees with the probe at {_pct(agree)} of the "
              "event boundaries.")
    return s


def reading_forced(f: dict) -> str:
    s = (f"Over {f['n_prompts']} prompts and {f['n_boundaries']} event boundaries, the forced answer is right "
         f"{_pct(f['forced_accuracy'])} of the time and the probe (layer {f['layer']}) {_pct(f['probe_accuracy'])};"
         f" they agree on {_pct(f['agreement'])}.")
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
    s = (f"With the {t['drafter']} drafter at γ={t['gamma']}, {_pct(t['acceptance'])} of "
         f"{t['drafted']} drafted tokens were accepted over {t['n_prompts']} prompts "
         f"({t['tokens_per_step']} tokens per verify step); {t['n_rejections']} verify steps rejected a draft.")
    d, db = t.get("draft_belief_wrong_at_rejections"), t.get("draft_belief_wrong_base_rate")
    if d is not None and db is not None:
        s += (f" Where drafts were rejected, the draft model's probe had the state wrong {_pct(d)} of the time, "
              f"against {_pct(db)} at event boundaries in general")
        s += (": rejections concentrate where the draft's belief is wrong." if d > db + 0.1 else
              ": rejections are no more likely where the draft's probe is wrong, so the draft's errors are not "
              "explained by its linearly readable belief." if d <= db + 0.02 else
              ": a slight excess, too small to call.")
    elif t["n_rejections"] == 0:
        s += " Nothing was rejected, so there is no belief comparison to draw."
    tw = t.get("target_belief_wrong_at_rejections")
    if tw is not None:
        s += f" The target's probe had it wrong at {_pct(tw)} of those positions."
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
         f"the model's answer on {_pct(st['flip_rate'])} of {st['n_prompts']} prompts; {r['n']} random directions "
         f"of the same norm flip {_pct(r['mean'])} (std {_pct(r['std'])}).")
    s += (" The direction the probe found is used by the model." if st["flip_rate"] >= 0.8 and r["mean"] <= 0.1
          else " The probe direction is at best weakly causal at this strength." if st["flip_rate"] > r["mean"] + 0.2
          else " The probe direction is no more causal than a random one here.")
    return s


CSS = """body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;max-width:1180px;margin:24px auto;
padding:0 20px;color:#222;line-height:1.45}h1{font-size:1.6em;margin-bottom:4px}h2{font-size:1.2em;
border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:34px}p.reading{background:#f6f8fa;border-left:4px solid
#5b8fd9;padding:8px 12px}figure{margin:12px 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}table{border-collapse:collapse;font-size:.85em;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f3f3f3}.meta{color:#666;font-size:.9em}
code{background:#f3f3f3;padding:1px 4px}"""


def table(rows: list[dict], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def render(title: str, meta: str, sections: list[dict]) -> str:
    """sections: [{"title", "reading", "figures": [(png bytes, caption)], "html": extra}] -> HTML text."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1><p class='meta'>{meta}</p>"]
    parts.append("<ul>" + "".join(f"<li><a href='#s{i}'>{html.escape(s['title'])}</a></li>"
                                  for i, s in enumerate(sections)) + "</ul>")
    for i, s in enumerate(sections):
        parts.append(f"<h2 id='s{i}'>{html.escape(s['title'])}</h2>")
        if s.get("reading"):
            parts.append(f"<p class='reading'>{html.escape(s['reading'])}</p>")
        for data, cap in s.get("figures", []):
            parts.append(f"<figure><img src='{png_data_uri(data)}' alt='{html.escape(cap)}'>"
                         f"<figcaption>{html.escape(cap)}</figcaption></figure>")
        parts.append(s.get("html", ""))
    parts.append("</body></html>")
    return "\n".join(parts)
