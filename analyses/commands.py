"""`beliefscope beliefs | forced | instrument | trace | determinism | demo | view` (registered by beliefscope/cli.py).

Shell::

    beliefscope demo --out runs/demo
    beliefscope beliefs --model target --probes runs/demo/probes/target \\
        --prompt "A coin is heads . Alice flips . State ?" --out b.png
    beliefscope forced --model target --probes runs/demo/probes/target --n 50 --out forced.png --json
    beliefscope trace --model target --drafter draft:draft --probes runs/demo/probes/target \\
        --draft-probes runs/demo/probes/draft --out trace.png
"""

from __future__ import annotations

import json
import os


def _emit(args, res: dict, lines: list[str]) -> int:
    if args.json:
        print(json.dumps(res, indent=1, default=float))
    else:
        print("\n".join(lines))
    return 0


def _bar(args, desc, total):
    from beliefscope.analyses.common import progress_bar

    return progress_bar(desc, total, disable=args.no_progress)


def cmd_beliefs(args) -> int:
    from beliefscope.analyses.beliefs import BeliefsConfig, main

    res = main(BeliefsConfig(model=args.model, probes=args.probes, prompt=args.prompt, out=args.out, task=args.task,
                             layer=args.layer, forced=not args.no_forced))
    if "thoughts" in res:  # a Thinking States model: its own beliefs
        lines = [f"thoughts {' '.join(map(str, res['thoughts']))} (truth {' '.join(res['truth_at_boundaries'])}; "
                 f"{res['thought_accuracy']:.0%} right); forced answers {' '.join(res['forced'])}; "
                 f"answer {res['answer']}"]
    else:
        lines = [f"layer {res['layer']}: probe follows the true state on {res['accuracy_at_layer']:.1%} "
                 f"of tokens after the first event; answer {res['answer']}"]
    return _emit(args, res, [*lines, *[f"wrote {p}" for p in res["files"]]])


def cmd_forced(args) -> int:
    from beliefscope.analyses.forced import ForcedConfig, main

    bar = _bar(args, "forced answers", args.n)
    res = main(ForcedConfig(model=args.model, probes=args.probes, out=args.out, n=args.n, seed=args.seed,
                            events=args.events, rendering=args.rendering, layer=args.layer), progress=bar.update)
    bar.close()
    return _emit(args, res, [f"{res['n_boundaries']} event boundaries of {res['n_prompts']} prompts: probe (layer "
                             f"{res['layer']}) agrees with the forced answer on {res['agreement']:.1%}; forced "
                             f"accuracy {res['forced_accuracy']:.1%}, probe accuracy {res['probe_accuracy']:.1%}",
                             *[f"wrote {p}" for p in res["files"]]])


def cmd_instrument(args) -> int:
    from beliefscope.analyses.instrument import InstrumentConfig, main, prompts_read, table_lines, write
    from beliefscope.files import check_writable_parent
    from beliefscope.tasks import parse_events_range

    for n, flag in ((args.n_train, "--n-train"), (args.n_test, "--n-test"), (args.causal_n, "--causal-n")):
        if n < 1:
            raise ValueError(f"{flag} must be at least 1, got {n}")
    from beliefscope.tasks import get_task

    task = get_task(args.task)
    bands = tuple(b.strip() for b in args.bands.split(",")) if args.bands else tuple(task.bands[:3])
    for b in bands:
        parse_events_range(b)
    if args.out:
        check_writable_parent(os.path.join(args.out, "instrument.json"))
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    cfg = InstrumentConfig(models=models, task=args.task, n_train=args.n_train, n_test=args.n_test, bands=bands,
                           causal_n=args.causal_n)
    bar = _bar(args, "prompts read", prompts_read(cfg))
    res = main(cfg, progress=bar.update)
    bar.close()
    if args.out:
        res["files"] = write(res, args.out)
    return _emit(args, res, table_lines(res))


def cmd_trace(args) -> int:
    from beliefscope.analyses.spec_trace import TraceConfig, main

    bar = _bar(args, "speculative trace", args.n + (1 if args.prompt else 0))
    res = main(TraceConfig(model=args.model, drafter=args.drafter, probes=args.probes or "",
                           draft_probes=args.draft_probes or "", prompt=args.prompt, n=args.n, seed=args.seed,
                           events=args.events, fmt=args.fmt, rendering=args.rendering, gamma=args.gamma,
                           max_new_tokens=args.max_new_tokens, out=args.out), progress=bar.update)
    bar.close()
    return _emit(args, res, [f"acceptance {res['acceptance']}, {res['tokens_per_step']} tokens/step, "
                             f"{res['n_rejections']} rejecting steps; draft belief wrong at rejections "
                             f"{res['draft_belief_wrong_at_rejections']} vs base rate "
                             f"{res['draft_belief_wrong_base_rate']}", *[f"wrote {p}" for p in res["files"]]])


def cmd_determinism(args) -> int:
    from beliefscope.analyses.determinism import DeterminismConfig, main

    from beliefscope.analyses.determinism import int_list

    n = len(str(args.others).split(","))
    shapes = len(int_list(args.window, "--window")) * len(int_list(args.verify_slots, "--verify-slots"))
    bar = _bar(args, "determinism", n * ({"all": 2, "both": 1, "fast": 1, "invariant": 1}.get(args.paths, 0)
                                         + shapes * (args.paths in ("all", "both", "verified"))))
    res = main(DeterminismConfig(model=args.model, prompts=args.prompts, others=args.others, out=args.out,
                                 max_new_tokens=args.max_new_tokens, dtype=args.dtype, window=args.window,
                                 verify_slots=args.verify_slots, n_others=args.n_others, seed=args.seed,
                                 partial=args.partial, paths=args.paths), progress=bar.update)
    bar.close()
    return _emit(args, res, [f"verified unique max {res['verified_unique_max']}, fast path unique max "
                             f"{res['fast_path_unique_max']}, batch-invariant fast path unique max "
                             f"{res['fast_path_invariant_unique_max']}", *[f"wrote {p}" for p in res["files"]]])


def cmd_demo(args) -> int:
    import time

    from beliefscope.analyses.demo import DemoConfig, main
    from beliefscope.models.profile import model_profile

    t = time.perf_counter()
    cfg = DemoConfig(out=args.out, model=args.model, draft=args.draft, quick=args.quick, progress=not args.no_progress)
    if model_profile(args.model).thinking:  # a model that writes its belief down: its own report
        from beliefscope.analyses import demo_thinking

        s = demo_thinking.main(cfg)
        key = {"instrument_verdicts": [r["verdict"] for r in s["instrument"]["models"].values()]}
    else:
        s = main(cfg)
        key = {"probe_best_layer": s["probe"]["best_layer"]}
    out = os.path.abspath(args.out)
    size = os.path.getsize(os.path.join(out, "report.html"))
    return _emit(args, {"out": out, "seconds": round(time.perf_counter() - t, 1), "report_bytes": size, **key},
                 [f"wrote {out}/report.html ({size / 1e6:.2f} MB), summary.json and figures/ in "
                  f"{time.perf_counter() - t:.0f} s"])


def cmd_view(args) -> int:
    from beliefscope.analyses.view import ViewConfig, main

    models = tuple(m.strip() for m in args.model.split(",") if m.strip())
    cfg = ViewConfig(models=models, task=args.task, events=args.events, n=args.n, seed=args.seed,
                     prompts=tuple(args.prompt or ()), probes=tuple(args.probes.split(",")) if args.probes else (),
                     n_train=args.n_train, decode=args.decode, drafter=args.drafter, gamma=args.gamma,
                     max_new_tokens=args.max_new_tokens, out=args.out, json_out=args.json_out)
    n = len(args.prompt) if args.prompt else args.n
    bar = _bar(args, "stories read", n * (len(models) + (1 if args.decode else 0)))
    res = main(cfg, progress=bar.update)
    bar.close()
    lines = [f"{name}: probe at layer {m['best_layer']} follows the truth on {m['probe_accuracy_at_best']:.1%} of "
             "tokens after the first event" for name, m in res["models"].items()]
    return _emit(args, res, [*lines, f"wrote {res['out']} ({res['bytes']:,} bytes, {res['n_stories']} stories) in "
                             f"{res['seconds']} s", *[f"wrote {p}" for p in res["files"][1:]]])


def register(subparsers) -> None:
    p = subparsers.add_parser("beliefs", help="belief trajectory of one prompt: heatmap + best-layer line")
    p.add_argument("--model", required=True, help="checkpoint folder or alias (target, smollm2, thinking, "
                   "smollm2-thinking)")
    p.add_argument("--probes", default="", help="probe folder from `beliefscope probe --out` (same model); optional "
                   "for Thinking States models, whose thoughts and forced answers are drawn")
    p.add_argument("--prompt", required=True, help='e.g. "A coin is heads . Alice flips . Bob stays . State ?"')
    p.add_argument("--out", required=True, help="heatmap PNG; the line plot goes next to it (-line)")
    p.add_argument("--task", default="coinflip", choices=["coinflip", "cups"])
    p.add_argument("--layer", type=int, default=None, help="line-plot layer (default: the probe report's best)")
    p.add_argument("--no-forced", action="store_true", help="skip forced answers on the line plot")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_beliefs)

    p = subparsers.add_parser("forced", help="forced answers vs probe at every event boundary of many prompts")
    p.add_argument("--model", required=True)
    p.add_argument("--probes", required=True)
    p.add_argument("--out", default="", help="agreement PNG; one example goes next to it (-example); "
                   "default: numbers only")
    p.add_argument("--n", type=int, default=50, help="prompts")
    p.add_argument("--seed", type=int, default=4242)
    p.add_argument("--events", default="1-8")
    p.add_argument("--rendering", default=None, choices=["toy", "natural"])
    p.add_argument("--layer", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_forced)

    p = subparsers.add_parser(
        "instrument", help="validate the belief instrument: probe, forced answer, thought and truth at every "
        "event boundary, per model and length band, with controls and a causal check",
        epilog="example: beliefscope instrument --models target,thinking --n-train 200 --n-test 100 --json")
    p.add_argument("--models", default="target,direct-rope,cot-rope,thinking", help="comma-separated model names")
    p.add_argument("--task", default="coinflip", help="task the models were trained on: coinflip, cups or variables")
    p.add_argument("--n-train", type=int, default=400,
                   help="prompts of the task's training lengths (1-8 events for coinflip) whose boundaries "
                        "fit the probes")
    p.add_argument("--n-test", type=int, default=200, help="held-out prompts per length band")
    p.add_argument("--bands", default="",
                   help="event-count bands of the held-out prompts (default: the task's first three, 1-8,9-16,17-32 "
                        "for coinflip and cups, 1-10,10-25,25-50 for variables)")
    p.add_argument("--causal-n", type=int, default=200, help="prompts of the causal check (thinking models)")
    p.add_argument("--out", default="", help="write instrument.json and the agreement figure into this folder")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_instrument)

    p = subparsers.add_parser("trace", help="speculative-decoding trace: cache timeline, acceptance, beliefs")
    p.add_argument("--model", required=True)
    p.add_argument("--drafter", default="draft:draft", help="draft:PATH, early-exit:K, ngram:N or bf16")
    p.add_argument("--probes", default=None, help="target probe folder")
    p.add_argument("--draft-probes", default=None, help="probe folder fitted on the draft model")
    p.add_argument("--prompt", default=None, help="featured prompt (toy CoT ends with 'Think :')")
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--seed", type=int, default=777)
    p.add_argument("--events", default="4-12")
    p.add_argument("--fmt", default="cot", choices=["cot", "direct"])
    p.add_argument("--rendering", default=None, choices=["toy", "natural"])
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--out", required=True, help="timeline PNG; -acceptance and -beliefs PNGs go next to it")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_trace)

    # `beliefscope determinism`: the numbers as JSON, and the chart with --out
    name = "determinism" if "determinism" not in subparsers.choices else "determinism-chart"
    p = subparsers.add_parser(name, help="unique outputs vs co-batched requests, fast path vs verified (chart)")
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--others", default="0,1,3,7", help="numbers of co-batched requests")
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--fast-dtype", dest="dtype", default="float32", choices=["float32", "bfloat16"],
                   help="precision of the unverified fast path (verification runs in the model's dtype)")
    p.add_argument("--window", default="4", help="verify window W (pending token + W-1 fast-path drafts); "
                   "several, e.g. 4,16, run the verified requests at every shape of the W x slots grid")
    p.add_argument("--verify-slots", default="4", help="rows B of every verify forward (the fixed shape); several, "
                   "e.g. 2,8, for a grid (verified_unique_max then covers every shape)")
    p.add_argument("--n-others", type=int, default=None, help="background requests per configuration "
                   "(default: half the prompts)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument("--partial", default=None, help="JSON rewritten after every configuration (long runs)")
    p.add_argument("--paths", default="all", choices=["all", "both", "fast", "invariant", "verified"],
                   help="paths the measured prompts run on: all three (default), both (fast + verified), the "
                        "unverified fast path, the batch-invariant fast path (float32, packed linears, tiled "
                        "attention) or verified requests (a path not run reports null)")
    p.add_argument("--out", default=None, help="chart PNG (default: print the numbers only)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_determinism)

    p = subparsers.add_parser("demo", help="every analysis on the shipped checkpoints -> report.html")
    p.add_argument("--out", default="runs/demo", help="report folder (written atomically)")
    p.add_argument("--model", default="target",
                   help="target (toy checkpoints) or smollm2 (the real model); a Thinking States model (thinking, "
                        "smollm2-thinking) gets its own report: answers and thoughts by band, the instrument beside "
                        "the same model without thoughts, one story token by token, the causal check")
    p.add_argument("--draft", default="draft", help="toy draft checkpoint (ignored for smollm2)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (for tests; noisy numbers)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_demo)

    p = subparsers.add_parser("view", help="one self-contained HTML page: every token coloured by the probe's belief, "
                              "with every layer, the truth, forced answer, thought and KV-cache provenance on hover")
    p.add_argument("--model", default="thinking,target", help="comma-separated models shown side by side")
    p.add_argument("--task", default="coinflip", choices=["coinflip", "cups", "variables"],
                   help="task of the stories (the models must have been trained on it)")
    p.add_argument("--events", default="9-16")
    p.add_argument("--n", type=int, default=6, help="stories")
    p.add_argument("--seed", type=int, default=2029)
    p.add_argument("--prompt", action="append", default=None,
                   help="a story as text instead of sampled ones (repeat the flag for several)")
    p.add_argument("--probes", default="", help="comma-separated probe folders, one per model (an empty entry "
                   "fits a probe here); each is refused unless fitted on that model, rendering and task")
    p.add_argument("--n-train", type=int, default=120,
                   help="training-length stories whose event boundaries fit the probes fitted here")
    p.add_argument("--decode", default="auto", help="model decoded speculatively (auto: the first model that writes "
                   "no thoughts; an empty value: none)")
    p.add_argument("--drafter", default="draft:draft", help="draft:PATH, early-exit:K or ngram:N")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--out", default="view.html", help="the page (one file, no network)")
    p.add_argument("--json-out", default="", help="also write the JSON the page was built from")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_view)
