"""Speculative-decoding trace: the KV cache through draft, verify and rollback, acceptance per step, and
beliefs where drafts fail.

One featured run is drawn as the cache went through it (after prefill, after the draft proposed,
after verify + rollback with the rejected entries kept, after the next verify), coloured by the
cache's own provenance codes. Over `n` prompts, every rejected draft is located, and the draft's
and the target's probe readouts are compared where it matters:

- toy chain-of-thought prompts: a rejected state word at chain slot k claims the state after
  event k, so both models' beliefs are read at event k's boundary token (true state: after event k);
- otherwise (natural prompts, non-state tokens): at the input position whose prediction was rejected.

Readouts come from one forward per model over the committed sequence; with causal attention these
are the activations of the committed positions in the verify pass.

Usage (not run as a doctest: it needs stored activations, probes or a model)::

    res = main(TraceConfig(model="target", drafter="draft:draft", probes="p/target",
                           draft_probes="p/draft", out="trace.png"))
    sorted(res)[:3]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..cache import Provenance
from ..decoding import (
    EarlyExitDrafter,
    ModelDrafter,
    SpecConfig,
    TreeConfig,
    make_drafter,
    speculative_generate,
)
from ..hooks import hook_name
from ..models.load import load_model
from ..models.profile import model_profile
from ..tasks import get_task, parse_events_range
from ..tasks.parse import parse_prompt
from . import plots, plots_decoding
from .common import (
    best_probe_layer,
    check_probe_matches,
    check_probe_rendering,
    check_writable_parent,
    load_probe,
    probe_readout,
    save_fig,
    sibling,
    token_strings,
)


@dataclass
class TraceConfig:
    """`beliefscope trace`: speculative decoding with a trace, over `n` prompts plus one featured run."""

    model: str = "target"  # target checkpoint folder or alias
    drafter: str = "draft:draft"  # decoding.make_drafter spec: draft:PATH, early-exit:K, ngram:N, bf16
    probes: str = ""  # target probe folder ("" = no belief comparison)
    draft_probes: str = ""  # probe fitted on the draft model (draft:PATH); early-exit:K reuses the target probe
    prompt: str | None = None  # featured prompt (default: the first sampled prompt with a rejected draft)
    n: int = 30  # sampled prompts for the acceptance and belief statistics
    seed: int = 777  # prompt seed
    events: str = "4-12"  # events per prompt
    fmt: str = "cot"  # toy prompt format: cot (multi-token answers) or direct
    rendering: str | None = None  # toy / natural (default: natural for smollm2)
    gamma: int = 4  # tokens drafted per step
    max_new_tokens: int = 24  # generation budget per prompt
    out: str = "trace.png"  # cache timeline PNG; "-acceptance" and "-beliefs" siblings


@dataclass
class Rejection:
    """One verify step that discarded drafts, with the beliefs read where the claim was made."""

    prompt: int  # index of the prompt
    step: int  # verify step
    position: int  # absolute position of the first rejected draft
    rejected: str  # the first rejected draft token
    committed: str  # the reference's token at that position
    event: int | None  # 1-based event the rejected token claims the state after (toy CoT), else None
    belief_position: int  # token where the beliefs are read
    true_state: int  # true state index at that claim
    p_draft: float | None  # draft probe P(state 0) at belief_position (None without a draft probe)
    p_target: float | None  # target probe P(state 0) at belief_position


def chain_events(tok, ex, n_generated: int) -> list[int | None]:
    """For each generated slot, the 1-based event whose state the reference chain writes there (or None)."""
    comp = tok(ex.completion, add_special_tokens=False)["input_ids"]
    words = [tok.decode([i]).strip() for i in comp]
    out, k = [], 0
    for w in words:
        if w in ex.state_names:
            k += 1
            out.append(min(k, ex.n_events))
        else:
            out.append(None)
    return (out + [None] * n_generated)[:n_generated]


def draft_reader(cfg: TraceConfig, drafter, target, target_probe, draft_probe):
    """A function ids -> draft P(state 0) per position, or None when the drafter has no belief to read."""

    if isinstance(drafter, EarlyExitDrafter) and target_probe is not None:
        hook = hook_name("resid_post", drafter.k - 1)  # the draft's last layer is the target's layer k-1
        if hook in target_probe.hooks:
            return lambda ids: probe_readout(target, target_probe, ids, [hook])[0]
    if isinstance(drafter, ModelDrafter) and draft_probe is not None:
        check_probe_matches(draft_probe, drafter.model, cfg.drafter)
        hook = hook_name("resid_post", best_probe_layer(draft_probe, cfg.draft_probes))
        return lambda ids: probe_readout(drafter.model, draft_probe, ids, [hook])[0]
    return None


def timeline_stages(tok, gen, prompt_ids, step_index: int, context: int = 10):
    """Rows of the cache timeline around one verify step, from the run's cache and trace."""

    st = gen.trace.steps[step_index]
    ids = list(prompt_ids) + list(gen.tokens)  # committed tokens
    final = gen.cache.recorder.provenance_of(0).tolist()
    pos, k = st.position, len(st.proposals)
    keep = pos + 1 + st.accepted
    rejected_codes = [int(Provenance.REJECTED)] * (k - st.accepted)
    for span in gen.cache.recorder.rejected:  # the entries the cache kept for study (keep_rejected)
        if span.start == keep:
            rejected_codes = [int(c) for c in span.provenance[: k - st.accepted].tolist()]
            break
    lo = max(0, min(pos, len(prompt_ids)) - context)
    n_prompt = len(prompt_ids)
    s = lambda a, b: token_strings(tok, ids[a:b]) if b > a else []
    drafted = token_strings(tok, [ids[pos], *st.proposals])
    rows = [
        ("after prefill", s(lo, n_prompt), [0] * (n_prompt - lo)),
        # the pending token (the last committed one, written by the same forward) keeps its own colour
        (f"decode: step {st.index} drafts", s(lo, pos) + drafted, final[lo:pos + 1] + [int(Provenance.DRAFT)] * k),
        ("verify + rollback", s(lo, keep) + token_strings(tok, st.rejected), final[lo:keep] + rejected_codes),
    ]
    nxt = final[lo:keep + 1]
    if len(nxt) == keep + 1 - lo:  # the run went on: the reference's token now sits at position `keep`
        rows.append(("next verify", s(lo, keep + 1), nxt))
    return rows, lo


def run(cfg: TraceConfig, target, tok, drafter, examples, target_probe=None, draft_probe=None, progress=None):
    """Speculative decoding over `examples`; returns (generations, rejections, base-rate arrays)."""

    layer = best_probe_layer(target_probe, cfg.probes) if target_probe is not None else None
    read_draft = draft_reader(cfg, drafter, target, target_probe, draft_probe)
    scfg = SpecConfig(gamma=cfg.gamma, max_new_tokens=cfg.max_new_tokens, keep_rejected=True, trace=True)
    gens, rejections = [], []
    base = {"draft_wrong": [], "target_wrong": []}  # at every event boundary of every prompt
    for i, ex in enumerate(examples):
        lab = ex.labels(tok, text=ex.prompt)
        prompt_ids = lab.input_ids.tolist()
        gen = speculative_generate(target, drafter, torch.tensor(prompt_ids), scfg, tokenizer=tok)
        gens.append(gen)
        seq = prompt_ids + gen.tokens
        pt = probe_readout(target, target_probe, seq, [hook_name("resid_post", layer)])[0] if layer is not None \
            else None
        pd = read_draft(seq) if read_draft is not None else None
        b = np.nonzero(lab.is_event_boundary)[0]
        if pd is not None:
            base["draft_wrong"] += ((pd[b] < 0.5).astype(int) != lab.state[b]).tolist()
        if pt is not None:
            base["target_wrong"] += ((pt[b] < 0.5).astype(int) != lab.state[b]).tolist()
        slots = chain_events(tok, ex, len(gen.tokens)) if ex.fmt == "cot" else [None] * len(gen.tokens)
        for st in gen.trace.steps:
            if not st.rejected:
                continue
            r = st.position + 1 + st.accepted  # absolute position of the first rejected draft
            slot = r - len(prompt_ids)
            event = slots[slot] if 0 <= slot < len(slots) else None
            where = int(b[event - 1]) if event else r - 1
            true = ex.events[event - 1].state_after if event else ex.final_state
            rejections.append(Rejection(
                i, st.index, r, tok.decode([st.rejected[0]]).strip(), tok.decode([st.committed[-1]]).strip(),
                event, where, int(true), None if pd is None else round(float(pd[where]), 4),
                None if pt is None else round(float(pt[where]), 4)))
        if progress:
            progress(1)
    return gens, rejections, base, layer


def _rate(xs):
    return round(float(np.mean(xs)), 4) if len(xs) else None


def summarize(gens, rejections, base) -> dict:
    drafted = sum(g.drafted for g in gens)
    accepted = sum(g.accepted for g in gens)
    with_d = [r for r in rejections if r.p_draft is not None]
    with_t = [r for r in rejections if r.p_target is not None]
    ev = [r for r in with_d if r.event]
    return {
        "acceptance": round(accepted / drafted, 4) if drafted else None,
        "drafted": drafted, "accepted": accepted, "verify_steps": sum(g.steps for g in gens),
        "tokens": sum(len(g.tokens) for g in gens),
        "tokens_per_step": round(sum(len(g.tokens) for g in gens) / max(1, sum(g.steps for g in gens)), 3),
        "n_rejections": len(rejections), "n_rejections_at_state_claims": sum(1 for r in rejections if r.event),
        "draft_belief_wrong_at_rejections": _rate([int((r.p_draft < 0.5) != r.true_state) for r in with_d]),
        "draft_belief_wrong_base_rate": _rate(base["draft_wrong"]),
        "target_belief_wrong_at_rejections": _rate([int((r.p_target < 0.5) != r.true_state) for r in with_t]),
        "target_belief_wrong_base_rate": _rate(base["target_wrong"]),
        # does the draft's probe side with the state word the draft wrote (and the verifier rejected)?
        "draft_belief_matches_rejected_word": _rate([int(("heads" if r.p_draft >= 0.5 else "tails") == r.rejected)
                                                     for r in ev if r.rejected in ("heads", "tails")]),
    }


def main(config: TraceConfig, *, target=None, tok=None, drafter=None, progress=None) -> dict:
    """Run the trace, write three figures (timeline, acceptance, draft vs target beliefs)."""

    out = check_writable_parent(config.out)
    if drafter is None and config.drafter.strip() == "none":
        raise ValueError("--drafter none drafts nothing: use draft:PATH, early-exit:K or ngram:N")
    lo, hi = parse_events_range(config.events)
    featured = parse_prompt(config.prompt, "coinflip") if config.prompt else None
    tprobe = load_probe(config.probes) if config.probes else None
    dprobe = load_probe(config.draft_probes) if config.draft_probes else None
    if target is None:

        target, tok = load_model(config.model)
    if tprobe is not None:
        check_probe_matches(tprobe, target, config.model)
    drafter = drafter or make_drafter(config.drafter, target)
    if drafter is None:
        raise ValueError("--drafter none drafts nothing: use draft:PATH, early-exit:K or ngram:N")
    rendering = config.rendering or model_profile(config.model).rendering
    for probe in (tprobe, dprobe):
        if probe is not None:
            check_probe_rendering(probe, rendering)
    fmt = config.fmt if rendering == "toy" else "direct"
    examples = get_task("coinflip", rendering=rendering, fmt=fmt, split="all").examples(config.n, config.seed,
                                                                                      (lo, hi))
    if featured is not None:
        examples = [featured, *examples]
    gens, rejections, base, layer = run(config, target, tok, drafter, examples, tprobe, dprobe, progress)
    summary = summarize(gens, rejections, base)
    fi = 0 if featured is not None else next(
        (r.prompt for r in rejections if r.event), rejections[0].prompt if rejections else 0)
    gen = gens[fi]
    ex = examples[fi]
    prompt_ids = ex.labels(tok, text=ex.prompt).input_ids.tolist()
    steps = gen.trace.steps
    si = next((j for j, st in enumerate(steps) if st.rejected), 0)
    files = [out, sibling(out, "-acceptance")]
    if steps:
        rows, start = timeline_stages(tok, gen, prompt_ids, si)
        st = steps[si]
        title = (f"KV cache of one request through draft, verify, rollback ({config.drafter}, γ={config.gamma})\n"
                 f"step {st.index}: {len(st.proposals)} drafts after the pending token, {st.accepted} kept,"
                 f" {len(st.proposals) - st.accepted} rolled back")
    else:
        rows, start, title = [("after prefill", token_strings(tok, prompt_ids), [0] * len(prompt_ids))], 0, None
    save_fig(plots_decoding.cache_timeline(rows, **({"title": title} if title else {}), start=start), out)
    save_fig(plots_decoding.acceptance_chart([len(s.proposals) for s in steps], [s.accepted for s in steps],
                                    title="Drafts per verify step, featured request"), files[1])
    shown = [r for r in rejections if r.p_target is not None][:16]
    if shown:
        files.append(sibling(out, "-beliefs"))
        labels = [f"p{r.prompt} pos {r.belief_position}" + (f" (ev {r.event})" if r.event else "") for r in shown]
        pd = [np.nan if r.p_draft is None else r.p_draft for r in shown]
        fig = plots.draft_vs_target_beliefs(labels, pd, [r.p_target for r in shown],
                                            [float(r.true_state == 0) for r in shown])
        save_fig(fig, files[-1])
    st = steps[si] if steps else None
    return {
        "model": config.model, "drafter": config.drafter, "gamma": config.gamma, "n_prompts": len(examples),
        "events": f"{lo}-{hi}", "seed": config.seed, "format": fmt, "rendering": rendering,
        "probe_layer": layer, **summary,
        "featured": {"prompt": ex.prompt, "tokens": gen.tokens, "text": tok.decode(gen.tokens),
                     "steps": [{"position": s.position, "proposals": s.proposals, "accepted": s.accepted,
                                "committed": s.committed, "rejected": s.rejected} for s in steps],
                     "timeline_step": None if st is None else st.index,
                     # what the timeline figure draws: (stage, tokens, provenance codes) rows from `start`
                     "timeline": {"rows": [[name, list(toks), [int(c) for c in codes]] for name, toks, codes in rows],
                                  "start": int(start), "title": title},
                     "cache_events": [] if st is None else [list(e) for e in st.events]},
        "rejections": [asdict(r) for r in rejections], "files": files,
    }


def tree_step_codes(gen, step_index: int) -> list[int]:
    """Provenance code of every node of a tree step, read from the run's cache: the accepted path's
    positions in ``gen.cache`` (ACCEPTED), the other nodes' entries in the step's ``cache.recorder.rejected``
    span (REJECTED). Needs ``SpecConfig(tree=..., trace=True, keep_rejected=True)``."""
    st = gen.trace.steps[step_index]
    if st.tree_parents is None or st.rejected_order is None:
        raise ValueError("this trace has no tree steps with kept rejections: run with SpecConfig(tree=TreeConfig(), "
                         "trace=True, keep_rejected=True)")
    final = gen.cache.recorder.provenance_of(0).tolist()
    codes = [None] * len(st.proposals)
    kept = len(st.committed) - 1  # accepted nodes that stayed in the cache
    for j, node in enumerate(st.path[:kept]):
        codes[node] = final[st.position + 1 + j]
    rollbacks = [(e[2], e[3], e[4]) for e in st.events if e[0] == "rollback"]
    span = next((s for s in gen.cache.recorder.rejected if (s.start, s.end, s.step) in rollbacks), None)
    for k, node in enumerate(st.rejected_order):
        if span is not None:
            codes[node] = int(span.provenance[k])
    return codes


def tree_trace(target, tok, drafter, prompt_ids, tree=None, max_new_tokens: int = 24):
    """Tree decoding of one prompt with every rolled-back node kept; returns ``(figure, summary)`` for
    the first step whose accepted path leaves the drafter's first branch (else the step with most
    rejected nodes): branches drafted, path accepted, branches rolled back, from the cache's own provenance.

    >>> from beliefscope.models.testing import tiny_gpt2
    >>> from beliefscope.decoding import NGramDrafter
    >>> from beliefscope.models.tokenizer import toy_tokenizer
    >>> fig, s = tree_trace(tiny_gpt2(), toy_tokenizer(), NGramDrafter(1), [3, 4, 5, 3, 4, 6, 3, 4], max_new_tokens=6)
    >>> s["nodes"] >= 1
    True
    """

    cfg = SpecConfig(max_new_tokens=max_new_tokens, stop_at_eos=False,
                     tree=tree or TreeConfig(nodes=8, depth=4, branch=3), trace=True, keep_rejected=True)
    gen = speculative_generate(target, drafter, prompt_ids, cfg, tokenizer=tok)
    steps = gen.trace.steps
    off = [s.index for s in steps if s.path and s.path != list(range(len(s.path)))]
    i = off[0] if off else max(range(len(steps)), key=lambda j: len(steps[j].proposals) - len(steps[j].path))
    st = steps[i]
    codes = tree_step_codes(gen, i)
    ids = list(prompt_ids) + gen.tokens
    fig = plots_decoding.tree_step(token_strings(tok, st.proposals), st.tree_parents, codes,
                          token_strings(tok, [ids[st.position]])[0],
                          title=f"Token tree at step {i}: {len(st.path)} of {len(st.proposals)} drafts accepted")
    return fig, {"step": i, "nodes": len(st.proposals), "accepted": len(st.path), "path": st.path,
                 "path_leaves_first_branch": bool(off), "codes": codes, "tokens": st.proposals,
                 "parents": st.tree_parents}
