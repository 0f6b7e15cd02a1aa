"""``beliefscope generate``: speculative (or plain) decoding from the command line.

Imports inside the command functions are CLI start-up (said here, as the architecture asks): an area is
imported to register its commands, and each command loads torch and its models only when it runs, so
``beliefscope CMD --help`` answers at once.

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers()
>>> register(sub)
"""

from __future__ import annotations


def register(subparsers) -> None:
    from beliefscope.base.config_flags import Command, register_command

    from .config import GenerateConfig

    register_command(subparsers, Command(
        name="generate", help="generate with speculative decoding (verify + rollback)", config=GenerateConfig,
        run=lambda cfg, progress: run_generate(cfg), lines=_generate_lines, notes=_generate_notes, json_indent=None,
        required=("prompt",), choices={"prefill": ["chunked", "speculative"]},
        epilog='beliefscope generate --model target --drafter ngram:3 --prompt "A coin is heads . Alice flips . '
               'Think :"'))
    register_datastore(subparsers)


def _generate_lines(res: dict) -> list[str]:
    """The answer (a Thinking States model's thoughts first, one per chunk)."""
    if "thoughts" not in res:
        return [res["text"]]
    lines = [f"  after {t['after']!s:<28} thinks: {t['thought']}" + ("  (empty: no change)" if t["empty"] else "")
             for t in res["thoughts"]]  # an empty thought leaves S as it was: the state is unchanged
    return [*lines, f"answer: {res['text']}"]


def _generate_notes(res: dict) -> list[str]:
    if "thoughts" in res:
        return []
    compiled = f", compiled: {res['compiled']}" if res.get("compiled") else ""
    return [f"[{res['drafter']}] {len(res['tokens'])} tokens in {res['steps']} steps, alpha={res['alpha']}, "
            f"{res['seconds']:.2f}s{compiled}"]


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
        from .tune import measure_verify_widths

        return measure_verify_widths(model, ids)[0]
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise ValueError(f"--verify-widths {text!r} is invalid: use fixed, auto or a list such as 1,5,8") from None
    if not widths or min(widths) < 1:
        raise ValueError(f"--verify-widths {text!r}: widths must be >= 1, e.g. 1,5,8")
    return widths


def _generate_thinking(model, tok, cfg, gamma: int) -> dict:
    """A Thinking States model: chunk-by-chunk greedy decoding, its thoughts beside the answer."""
    from .thinking import run_thinking

    if cfg.drafter != "none" or cfg.temperature:
        raise ValueError("a Thinking States model decodes greedily and without a drafter: drop --drafter and "
                         "--temperature")
    if cfg.compile:
        raise ValueError("--compile replays the decode forwards of a causal LM; a Thinking States model decodes "
                         "chunk by chunk with its own thought forwards, which are not recorded: drop --compile")
    ids = tok(_prompt_text(cfg, tok))["input_ids"]
    run = run_thinking(model, ids, max_new_tokens=cfg.max_new_tokens, prefill=cfg.prefill, k=cfg.k)
    starts = {e: a for a, e, complete in model.spans(ids) if complete}
    thoughts = [{"after": tok.decode(ids[starts[e]: e]) if e in starts else "(generated)", "position": e,
                 "thought": tok.decode(z), "empty": model.carries(z)} for e, z in run.thoughts]
    return {"model": cfg.model, "text": tok.decode(run.tokens, skip_special_tokens=True), "tokens": run.tokens,
            "thoughts": thoughts, "context_length": run.cache.seq_len,
            "thought_tokens_dropped": sum(s.end - s.start for s in run.thought_cache.recorder.rejected),
            "prefill": cfg.prefill, "backbone_forwards_prefill": len(run.chunk_steps)}


def _prompt_text(cfg, tok) -> str:
    """The prompt as given, or inside the tokenizer's chat template with ``--chat``."""
    from ..tasks.questions import chat_text

    return chat_text(tok, cfg.prompt) if cfg.chat else cfg.prompt


def _pack(model) -> None:
    from ..models.packed import pack_linears, require_packable
    from .core import hf_model

    require_packable(hf_model(model))
    pack_linears(hf_model(model))


def run_generate(cfg) -> dict:
    """`beliefscope generate` (a `GenerateConfig`): the text and every number of the run. The model's own
    decoding picks the path (`_generate`: a Thinking States model decodes chunk by chunk)."""
    from functools import singledispatch

    from ..models.load import load_model
    from ..models.thinking.model import ThinkingStates

    gamma = _gamma(cfg.gamma)  # arguments first, then the model
    if cfg.packed:
        from ..models.packed import packing_available

        if not packing_available():
            raise ValueError("--packed: this torch build has no oneDNN weight packing; drop --packed")
    model, tok = load_model(cfg.model)
    generate = singledispatch(_generate_plain)
    generate.register(ThinkingStates, _generate_thinking)
    return generate(model, tok, cfg, gamma)


def _generate_plain(model, tok, cfg, gamma: int) -> dict:
    """A causal LM: speculative decoding with the drafter (plain greedy without one)."""
    from .config import SpecConfig
    from .drafters import make_drafter
    from .speculative import equals, speculative_generate

    if cfg.packed:
        _pack(model)
    drafter = make_drafter(cfg.drafter, model)
    ids = tok(_prompt_text(cfg, tok))["input_ids"]
    widths = _verify_widths(cfg.verify_widths, model, ids)
    spec = SpecConfig(gamma=gamma, temperature=cfg.temperature, seed=cfg.seed,
                      max_new_tokens=cfg.max_new_tokens, trace=bool(cfg.trace), fixed_window=widths is None,
                      verify_widths=widths or None, compile=cfg.compile)
    out = speculative_generate(model, drafter, ids, spec, tokenizer=tok)
    if cfg.trace and out.trace is not None:
        out.trace.save(cfg.trace)
    return {"model": cfg.model, "drafter": cfg.drafter, "gamma": spec.gamma,
            "verify_widths": "fixed" if widths is None else list(widths), "equals": equals(model, drafter, spec),
            "text": tok.decode(out.tokens), **out.summary()}


def register_datastore(subparsers) -> None:
    from beliefscope.base.config_flags import Command, register_command

    from .store_build import DatastoreConfig

    register_command(subparsers, Command(
        name="datastore", help="build the n-gram store of the retrieval drafter (store:PATH) from the model's own "
                               "greedy outputs on training prompts", config=DatastoreConfig,
        run=_datastore, lines=lambda res: [f"wrote {res['out']}: {res['n_tokens']:,} tokens, "
                                           f"{res['ngrams']:,} n-grams"],
        total=lambda cfg: cfg.n, renamed={"--prompts": "--n"}, unit="greedy outputs", required=("out",),
        choices={"workload": ["coinflip", "stdlib"], "split": ["train", "heldout", "all"]},
        epilog="beliefscope datastore --model smollm2 --out my-store.json"))


def _datastore(cfg, progress) -> dict:
    from ..models.load import load_model
    from ..tasks.base import parse_events_range
    from ..tasks.instruct import chat_prompts
    from .store_build import StoreBuildConfig, build_store

    if cfg.n < 1:
        raise ValueError(f"--n {cfg.n}: build the store from at least 1 prompt")
    events = parse_events_range(cfg.events)
    model, tok = load_model(cfg.model)
    if cfg.workload == "stdlib":
        from .general_prompts import general_chat_prompts

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
