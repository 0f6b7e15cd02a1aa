"""Figures of a Thinking States model: its belief trajectory beside a lazy model's, and the cache
timeline of one request (chunks appended, thoughts written and dropped).

>>> from beliefscope.models import load_model
>>> from beliefscope.decoding.thinking import run_thinking
>>> model, tok = load_model("thinking")
>>> run = run_thinking(model, tok("A coin is heads . Alice flips . State ?")["input_ids"], max_new_tokens=1)
>>> fig = cache_timeline_figure(run, tok)
>>> len(fig.axes)
1
"""

from __future__ import annotations

import os

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..cache import Provenance
from ..decoding.thinking import run_thinking
from ..models.load import load_model
from ..models.thinking.config import THOUGHT
from ..tasks.parse import parse_prompt
from .beliefs import trajectory
from .common import check_probe_matches, load_probe, save_fig, token_strings
from .forced import forced_answers
from .plots import BELIEF_CMAP, PROVENANCE_COLORS, PROVENANCE_NAMES


def cache_timeline_figure(run, tok, title: str = "") -> Figure:
    """One row per step of a chunk-by-chunk run: the context cache (chunks, answer) on the left
    of the gap, T's cache on the right (the chunk it reads, then its thought, tagged THOUGHT), and
    each thought crossed out when it is rolled back. Colours are the caches' own provenance codes."""
    rows = []  # (label, context length, thought tokens or None, dropped?)
    steps = list(run.chunk_steps)
    ends = {e: z for e, z in run.thoughts}
    for a, e in steps:
        rows.append((f"chunk {a}-{e}", e, None, False))
        if e in ends:
            rows.append(("T writes", e, ends[e], False))
            rows.append(("rolled back", e, ends[e], True))
    if run.tokens:
        rows.append(("answer", run.prompt_len + len(run.tokens), None, False))
    width = run.prompt_len + len(run.tokens) + 2 + max((len(z) for _, z in run.thoughts), default=0)
    fig = Figure(figsize=(min(16, 2 + 0.32 * width), 0.9 + 0.32 * len(rows)))
    ax = fig.add_subplot()
    for y, (label, n, z, dropped) in enumerate(reversed(rows)):
        for i in range(n):
            code = int(Provenance.PREFILL) if i < run.prompt_len else int(Provenance.VERIFIED)
            ax.add_patch(_cell(i, y, PROVENANCE_COLORS[code]))
        if z is not None:
            for k, t in enumerate(z):
                x = n + 1 + k
                ax.add_patch(_cell(x, y, PROVENANCE_COLORS[int(THOUGHT)], alpha=0.35 if dropped else 1))
                ax.text(x + 0.47, y + 0.5, tok.convert_ids_to_tokens(t), ha="center", va="center", fontsize=6,
                        rotation=90)
                if dropped:
                    ax.plot([x, x + 0.95], [y + 0.1, y + 0.9], color="k", lw=0.8)
        ax.text(-0.5, y + 0.5, label, ha="right", va="center", fontsize=7)
    ax.set_xlim(-0.2, width)
    ax.set_ylim(0, len(rows))
    ax.set_yticks([])
    ax.set_xlabel("cache position (context | thought span in T's cache)")
    codes = [int(Provenance.PREFILL), int(Provenance.VERIFIED), int(THOUGHT)]
    ax.legend(handles=[Patch(color=PROVENANCE_COLORS[c], label=PROVENANCE_NAMES[c]) for c in codes],
              loc="upper right", fontsize=7, ncols=3)
    ax.set_title(title or f"Thinking States: {len(run.thoughts)} thoughts written and dropped; "
                          f"the context holds {run.cache.seq_len} positions", fontsize=9)
    fig.tight_layout()
    return fig


def _cell(x, y, color, alpha=1.0):

    return Rectangle((x, y + 0.1), 0.95, 0.8, color=color, alpha=alpha)


def trajectory_pair_figure(panels: list[dict], state_name: str = "heads") -> Figure:
    """Heatmaps of P(state) per layer x token, one panel per model, with the truth, forced answers
    and (for a thinking model) its thoughts as markers. A panel is a dict with keys ``title``,
    ``p`` ``[L, T]``, ``layers``, ``tokens``, ``truth [T]`` (1 = state_name), ``boundaries``,
    ``forced [n]`` (P(state_name) at the boundaries) and optionally ``thoughts [n]`` (1 = state_name)."""
    fig = Figure(figsize=(max(9.0, 0.36 * len(panels[0]["tokens"]) + 3.5), 3.6 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, pn in zip(axes, panels, strict=True):
        p = np.asarray(pn["p"])
        L, T = p.shape
        img = np.vstack([p, np.full((1, T), np.nan), np.asarray(pn["truth"], float)[None]])
        im = ax.imshow(img, aspect="auto", cmap=BELIEF_CMAP, vmin=0, vmax=1, interpolation="nearest")
        ax.set_yticks(list(range(L)) + [L + 1], [("emb" if x < 0 else f"L{x}") for x in pn["layers"]] + ["truth"],
                      fontsize=7)
        ax.set_xticks(range(T), pn["tokens"], rotation=90, fontsize=7)
        b = np.asarray(pn["boundaries"])
        if "forced" in pn:
            ax.scatter(b, np.full(len(b), -0.9), c=np.asarray(pn["forced"]), cmap=BELIEF_CMAP, vmin=0, vmax=1,
                       marker="s", s=40, edgecolors="k", linewidths=0.5, clip_on=False, label="forced answer")
        if pn.get("thoughts") is not None:
            ax.scatter(b, np.full(len(b), L + 0.5), c=np.asarray(pn["thoughts"], float), cmap=BELIEF_CMAP, vmin=0,
                       vmax=1, marker="D", s=40, edgecolors="k", linewidths=0.5, label="thought")
        ax.set_ylim(L + 1.6, -1.4)
        ax.set_title(pn["title"], fontsize=9)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.colorbar(im, ax=list(axes), label=f"P({state_name})", shrink=0.6, location="left", pad=0.08)
    return fig


TITLE = "A model whose beliefs exist: Thinking States beside the lazy target"
CAPTIONS = ["Probe P(heads) at every layer and token of the same story: the Thinking States model (top; diamonds: "
            "its thoughts) and the direct-answer target (bottom); squares: forced answers at each event boundary; "
            "bottom strip: the truth.",
            "The Thinking States request on its KV caches: each chunk is appended to the context; after it, T "
            "writes a thought (purple) in its own cache, which is rolled back, so the context never holds a thought."]


def demo_step(target, target_tok, target_probes: str, thinking_probes: str, prompt: str, figs: str) -> dict:
    """The demo's Thinking States section: the thinking model's belief trajectory beside the lazy
    target's on the same prompt (probe heatmaps, forced answers, thoughts, truth), and the cache
    timeline of that request. Returns the summary numbers and the files written."""

    ex = parse_prompt(prompt, "coinflip")
    model, tok = load_model("thinking")
    panels, summary = [], {"prompt": prompt}
    for name, m, t, pdir in (("thinking", model, tok, thinking_probes), ("target", target, target_tok, target_probes)):
        probe = load_probe(pdir)
        check_probe_matches(probe, m, name)
        traj = trajectory(m, t, probe, ex)
        fa = forced_answers(m, t, ex)
        truth = (traj.true_state == 0).astype(float)
        b = traj.boundaries
        at_b = {layer: float(np.mean(((traj.row(layer)[b] < 0.5).astype(int)) == traj.true_state[b]))
                for layer in traj.layers}
        best = max(at_b, key=at_b.get)
        pn = {"title": "", "p": traj.p_state, "layers": traj.layers, "tokens": traj.tokens, "truth": truth,
              "boundaries": b, "forced": fa.p_state[:, 0]}
        if fa.thought_state is not None:
            pn["thoughts"] = (fa.thought_state == 0).astype(float)
        kind = "Thinking States" if name == "thinking" else "direct-answer GPT-2 (the lazy target)"
        where = "the embedding" if best < 0 else f"layer {best}"
        pn["title"] = (f"{kind}: the probe at {where} reads the state at {at_b[best]:.0%} of event boundaries; "
                       f"forced answers {np.mean((fa.p_state[:, 0] < 0.5).astype(int) == fa.true_state):.0%}")
        panels.append(pn)
        summary[name] = {"probe_accuracy_at_boundaries_by_layer": at_b, "best_layer": best,
                         "forced_accuracy": float(np.mean((fa.p_state[:, 0] < 0.5).astype(int) == fa.true_state))}
        if fa.thought_state is not None:
            summary[name]["thought_accuracy"] = float(np.mean(fa.thought_state == fa.true_state))
    pair = os.path.join(figs, "beliefs-thinking-vs-lazy.png")
    save_fig(trajectory_pair_figure(panels, state_name=ex.state_names[0]), pair)
    run = run_thinking(model, tok(ex.prompt)["input_ids"], max_new_tokens=2)
    timeline = os.path.join(figs, "thinking-cache-timeline.png")
    save_fig(cache_timeline_figure(run, tok), timeline)
    summary["answer"] = tok.decode(run.tokens, skip_special_tokens=True)
    summary["thoughts"] = [tok.decode(z) for _, z in run.thoughts]
    summary["tokens"] = token_strings(tok, tok(ex.prompt)["input_ids"])
    summary["files"] = [pair, timeline]
    return summary


def _thought_text(tok, z) -> str:
    return " ".join(tok.convert_ids_to_tokens(t) for t in z if t != tok.eos_token_id) or "∅"


def speculative_prefill_figure(run, tok, title: str = "") -> Figure:
    """Speculative prefill of one request, a pair of rows per drafting forward: the chunks drafted
    (DRAFT) and the thought T wrote after each (empty: a bare <eos>; in red with the drafted one
    where T first contradicted the draft, in grey after it, where the chunk saw a wrong S), then
    what was kept (VERIFIED, up to and including that chunk) and what was rolled back (crossed out)."""
    rows = []  # (label, [(position, provenance code, crossed)], {chunk end: (thought, drafted or None)})
    drafted = run.spec_drafts or [[None] * len(d) for d in run.spec_thoughts]
    for (a0, e1, kept), thoughts, guesses in zip(run.spec_steps, run.spec_thoughts, drafted, strict=True):
        before = [(i, int(Provenance.PREFILL if i < a0 else Provenance.DRAFT), False) for i in range(e1)]
        marks = {e: (z, g, e == kept < e1 and g is not None and list(g) != list(z), e > kept)  # cut / stale S
                 for (e, z), g in zip(thoughts, guesses, strict=True)}
        rows.append((f"draft {a0}-{e1}", before, marks))
        after = [(i, int(Provenance.VERIFIED if a0 <= i < kept else Provenance.REJECTED if i >= kept
                          else Provenance.PREFILL), i >= kept) for i in range(e1)]
        rows.append((f"keep {a0}-{kept}" + (f", roll back {kept}-{e1}" if kept < e1 else ""), after, {}))
    width = max((len(r[1]) for r in rows), default=1) + 1
    fig = Figure(figsize=(min(18, 2.5 + 0.2 * width), 0.9 + 0.3 * len(rows)))
    ax = fig.add_subplot()
    for y, (label, cells, thoughts) in enumerate(reversed(rows)):
        for i, code, crossed in cells:
            ax.add_patch(_cell(i, y, PROVENANCE_COLORS[code], alpha=0.45 if crossed else 1))
            if crossed:
                ax.plot([i, i + 0.95], [y + 0.1, y + 0.9], color="k", lw=0.6)
        for end, (z, guess, cut, stale) in thoughts.items():
            text = _thought_text(tok, z)
            ax.text(end - 0.5, y + 1.0, f"{text} (drafted {_thought_text(tok, guess)})" if cut else text,
                    ha="center", va="bottom", fontsize=5,
                    color="tab:red" if cut else "0.6" if stale else PROVENANCE_COLORS[int(THOUGHT)])
        ax.text(-0.5, y + 0.5, label, ha="right", va="center", fontsize=7)
    ax.set_xlim(-0.2, width)
    ax.set_ylim(0, len(rows) + 0.6)
    ax.set_yticks([])
    ax.set_xlabel("context cache position (T's thought above each drafted chunk's end; ∅: empty, S carried over)\n"
                  "red: where T first contradicted the drafted thought; grey: after it (wrong S, rolled back)")
    codes = [int(Provenance.PREFILL), int(Provenance.DRAFT), int(Provenance.VERIFIED), int(Provenance.REJECTED)]
    ax.legend(handles=[Patch(color=PROVENANCE_COLORS[c], label=PROVENANCE_NAMES[c]) for c in codes],
              loc="upper right", fontsize=7, ncols=4)
    chunks = sum(len(d) for d in run.spec_thoughts)
    ax.set_title(title or f"Speculative prefill: {len(run.spec_steps)} drafting forwards, {chunks} chunks drafted, "
                          f"{len(run.thoughts)} thoughts kept", fontsize=9)
    fig.tight_layout()
    return fig
