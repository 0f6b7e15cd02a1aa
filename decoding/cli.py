"""``beliefscope generate``: speculative (or plain) decoding from the command line.

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers()
>>> register(sub)
"""

from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate with speculative decoding (verify + rollback)")
    p.add_argument("--model", default="target", help="checkpoint folder, alias (target, draft, smollm2)")
    p.add_argument("--drafter", default="none",
                   help="none | draft:PATH | early-exit:K | ngram:N | store:PATH | bf16 (none = plain cached decoding)")
    p.add_argument("--gamma", default="4", help="tokens drafted per step (an integer >= 1) or 'auto'")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 = sampling")
    p.add_argument("--seed", type=int, default=0, help="request seed (sampling is seeded per position)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true",
                   help="give the prompt as a user turn of the model's chat template (SmolLM2-Instruct's ChatML)")
    p.add_argument("--verify-widths", dest="widths", default="fixed",
                   help="fixed: every verify is gamma+1 wide (exact vs the fixed-shape reference); auto: each verify "
                        "as wide as its draft, padded to widths measured fastest here; or a list such as 1,5,8")
    p.add_argument("--packed", action="store_true",
                   help="pre-pack the linear weights for oneDNN (CPU, float32 only): a verify forward of a few tokens "
                        "then costs about one decode step (models.packed)")
    p.add_argument("--trace", dest="trace_file", default=None, help="write the per-step Trace as JSON to this file")
    p.add_argument("--prefill", default="chunked", choices=("chunked", "speculative"),
                   help="Thinking States models: read the prompt chunk by chunk, or draft k chunks per forward with "
                        "drafted thoughts and keep what T confirms (the same thoughts and answer, fewer forwards)")
    from beliefscope.decoding.thinking_prefill import PREFILL_K

    p.add_argument("--k", type=int, default=PREFILL_K, help="chunks drafted per forward with --prefill speculative")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_generate)
    register_datastore(subparsers)


def _gamma(text: str):
    if text == "auto":
        return "auto"
    try:
        gamma = int(text)
    except ValueError:
        gamma = 0
    if gamma < 1:
        raise ValueError(f"--gamma {text!r} is invalid: give an integer >= 1 or 'auto'")
    return gamma


def _verify_widths(text: str, model, ids):
    """None (fixed windows), () (variable, no padding) or the widths to pad to."""
    if text == "fixed":
        return None
    if text == "auto":
        from beliefscope.decoding.tune import measure_verify_widths

        return measure_verify_widths(model, ids)[0]
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise ValueError(f"--verify-widths {text!r} is invalid: use fixed, auto or a list such as 1,5,8") from None
    if not widths or min(widths) < 1:
        raise ValueError(f"--verify-widths {text!r}: widths must be >= 1, e.g. 1,5,8")
    return widths


def _generate_thinking(args) -> int:
    """A Thinking States model: chunk-by-chunk greedy decoding, its thoughts printed beside the answer."""
    from beliefscope.models import load_model
    from beliefscope.decoding.thinking import run_thinking

    if args.drafter != "none" or args.temperature:
        raise ValueError("a Thinking States model decodes greedily and without a drafter: drop --drafter and "
                         "--temperature")
    model, tok = load_model(args.model)
    ids = tok(_prompt_text(args, tok))["input_ids"]
    run = run_thinking(model, ids, max_new_tokens=args.max_new_tokens, prefill=args.prefill, k=args.k)
    starts = {e: a for a, e, complete in model.spans(ids) if complete}
    thoughts = [{"after": tok.decode(ids[starts[e]: e]) if e in starts else "(generated)", "position": e,
                 "thought": tok.decode(z), "empty": model.carries(z)} for e, z in run.thoughts]
    text = tok.decode(run.tokens, skip_special_tokens=True)
    if args.json:
        print(json.dumps({"model": args.model, "text": text, "tokens": run.tokens, "thoughts": thoughts,
                          "context_length": run.cache.seq_len,
                          "thought_tokens_dropped": sum(s.end - s.start for s in run.thought_cache.rejected),
                          "prefill": args.prefill, "backbone_forwards_prefill": len(run.chunk_steps)}))
    else:
        for t in thoughts:  # an empty thought leaves S as it was: the state is unchanged
            print(f"  after {t['after']!s:<28} thinks: {t['thought']}" + ("  (empty: no change)" if t["empty"] else ""))
        print(f"answer: {text}")
    return 0


def _prompt_text(args, tok) -> str:
    """The prompt as given, or inside the tokenizer's chat template with ``--chat``."""
    from beliefscope.tasks.questions import chat_text

    return chat_text(tok, args.prompt) if getattr(args, "chat", False) else args.prompt


def _pack(model) -> None:
    from beliefscope.decoding.core import hf_model
    from beliefscope.models.packed import pack_linears, require_packable

    require_packable(hf_model(model))
    pack_linears(hf_model(model))


def run_generate(args) -> int:
    from beliefscope.models.profile import model_profile

    if model_profile(args.model).thinking:
        return _generate_thinking(args)
    from beliefscope.decoding.config import SpecConfig
    from beliefscope.decoding.drafters import make_drafter
    from beliefscope.decoding.speculative import equals, speculative_generate
    from beliefscope.models.load import load_model

    gamma = _gamma(args.gamma)  # arguments first, then the model
    if args.packed:
        from beliefscope.models.packed import packing_available

        if not packing_available():
            raise ValueError("--packed: this torch build has no oneDNN weight packing; drop --packed")
    model, tok = load_model(args.model)
    if args.packed:
        _pack(model)
    drafter = make_drafter(args.drafter, model)
    ids = tok(_prompt_text(args, tok))["input_ids"]
    widths = _verify_widths(args.widths, model, ids)
    cfg = SpecConfig(gamma=gamma, temperature=args.temperature, seed=args.seed,
                     max_new_tokens=args.max_new_tokens, trace=bool(args.trace_file), fixed_window=widths is None,
                     verify_widths=widths or None)
    out = speculative_generate(model, drafter, ids, cfg, tokenizer=tok)
    if args.trace_file and out.trace is not None:
        out.trace.save(args.trace_file)
    result = {"model": args.model, "drafter": args.drafter, "gamma": cfg.gamma,
              "verify_widths": "fixed" if widths is None else list(widths), "equals": equals(model, drafter, cfg),
              "text": tok.decode(out.tokens),
              **out.summary()}
    if args.json:
        print(json.dumps(result))
    else:
        print(result["text"])
        print(f"[{args.drafter}] {len(out.tokens)} tokens in {out.steps} steps, alpha={result['alpha']}, "
              f"{out.seconds:.2f}s", file=sys.stderr)
    return 0


def register_datastore(subparsers) -> None:
    from beliefscope.base.config_flags import Command, register_command
    from beliefscope.decoding.store_build import DatastoreConfig

    register_command(subparsers, Command(
        name="datastore", help="build the n-gram store of the retrieval drafter (store:PATH) from the model's own "
                               "greedy outputs on training prompts", config=DatastoreConfig,
        run=_datastore, lines=lambda res: [f"wrote {res['out']}: {res['n_tokens']:,} tokens, "
                                           f"{res['ngrams']:,} n-grams"],
        total=lambda cfg: cfg.n, renamed={"--prompts": "--n"}, unit="greedy outputs", required=("out",),
        choices={"workload": ["coinflip", "stdlib"], "split": ["train", "heldout", "all"]},
        epilog="beliefscope datastore --model smollm2 --out my-store.json"))


def _datastore(cfg, progress) -> dict:
    from beliefscope.decoding.store_build import StoreBuildConfig, build_store
    from beliefscope.models.load import load_model
    from beliefscope.tasks.base import parse_events_range
    from beliefscope.tasks.instruct import chat_prompts

    events = parse_events_range(cfg.events)
    model, tok = load_model(cfg.model)
    if cfg.workload == "stdlib":
        from beliefscope.decoding.general_prompts import general_chat_prompts

        texts = general_chat_prompts(tok, cfg.n, cfg.seed, split="store")
        meta = {"model": cfg.model, "workload": "stdlib docstrings, store split", "prompts": cfg.n,
                "seed": cfg.seed}
    else:
        texts = chat_prompts(tok, cfg.n, cfg.seed, events, cfg.split)
        meta = {"model": cfg.model, "prompts": cfg.n, "seed": cfg.seed, "events": list(events),
                "split": cfg.split, "instruction": "tasks.instruct.REWRITE_INSTRUCTION"}
    prompts = [tok(t)["input_ids"] for t in texts]
    build = StoreBuildConfig(max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, max_n=cfg.max_n)
    store = build_store(model, prompts, cfg.out, build, meta=meta, pad_id=tok.pad_token_id or 0,
                        progress=progress, tokenizer=tok)
    return {"out": cfg.out, "n_tokens": store.n_tokens, "ngrams": sum(len(t) for t in store.tables), "meta": store.meta}
