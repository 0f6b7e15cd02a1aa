"""`beliefscope harvest`, `beliefscope probe` and `beliefscope steer`.

Shell::

    beliefscope harvest --model target --n 1000 --events 1-16 --out acts/target
    beliefscope probe --acts acts/target --label state --out probes/target --json
    beliefscope steer --model target --probes probes/target --layer 2 --alpha 1 --json  # a config_flags Command
"""

from __future__ import annotations

import json
import os


def _tqdm(desc: str, total: int | None = None, disable: bool = False):
    from beliefscope.progress import progress_bar

    return progress_bar(desc, total, disable=disable, leave=True)


def cmd_harvest(args) -> int:
    from beliefscope.probes.harvest import run

    result = run(args, None if args.no_progress else (lambda out: _tqdm(f"harvest {out}")))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for out, r in result.items():
            print(f"{out}: {r['n_rows']} tokens, {len(r['hooks'])} hooks, config {r['config_hash']}, "
                  f"complete={r['complete']}")
    return 0


def cmd_probe(args) -> int:
    from beliefscope.probes.report import ReportConfig, probe_report
    from beliefscope.probes.store import ActivationStore

    store = ActivationStore.open(args.acts)
    store.check_label(args.label)
    rpath = args.random_init or os.path.join(args.acts, "random_init")
    random_store = ActivationStore.open(rpath) if os.path.exists(rpath) and not args.no_random_init else None
    cfg = ReportConfig(label=args.label, positions=args.positions, folds=args.folds, train_events=args.train_events,
                       trainer=args.trainer, C=args.C, max_iter=args.max_iter, control_seed=args.control_seed,
                       layers_per_fit=args.layers_per_fit)
    bar = _tqdm("probe", disable=args.no_progress)
    rep = probe_report(store, cfg, random_store, out=args.out, progress=lambda m: bar.set_postfix_str(m))
    bar.close()
    data = rep.to_json()
    if args.out:
        from beliefscope.files import atomic_write_json

        atomic_write_json(os.path.join(args.out, "report.json"), data)
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    print(f"{rep.model}: label={rep.label} positions={rep.positions} prompts={rep.n_prompts} "
          f"tokens={rep.n_rows} folds={rep.folds} (by prompt) trainer={rep.trainer}")
    print(f"majority {rep.majority_accuracy:.3f}  embedding {rep.embedding_accuracy:.3f} "
          f"(control {rep.embedding_control_accuracy:.3f})")
    cols = ["layer", "accuracy", "control_accuracy", "selectivity", "random_init_accuracy",
            "accuracy_event_tokens", "accuracy_other_tokens", "heldout_length_accuracy", "heldout_template_accuracy"]
    cols = [c for c in cols if any(c in r for r in rep.layers)]
    print("  ".join(f"{c[:14]:>14}" for c in cols))
    for r in rep.layers:
        print("  ".join(f"{'-' if r.get(c) is None else r[c]:>14}" for c in cols))
    print(f"best layer: {rep.best_layer}")
    return 0


def steer_run(cfg, progress) -> dict:
    """Every alpha of ``cfg`` on the same prompts: one experiment's dict, or ``{"sweep": [...]}``."""
    from beliefscope.models.load import load_model
    from beliefscope.probes.harvest import HarvestConfig, make_examples
    from beliefscope.probes.linear import LinearProbe
    from beliefscope.probes.steering import SteerConfig, steer_experiment

    probe = LinearProbe.load(cfg.probes)
    hc = dict(probe.meta.get("harvest_config", {}))
    fields = {k: hc[k] for k in HarvestConfig.__dataclass_fields__ if k in hc}
    fields.update(n=cfg.n, seed=cfg.seed, events=cfg.events)
    if fields.get("split") == "train+heldout":
        fields["split"] = "train"
    examples = make_examples(HarvestConfig(**fields))
    model, tok = load_model(cfg.model)
    results = [steer_experiment(model, tok, probe, examples,
                                SteerConfig(layer=cfg.layer, alpha=alpha, n_random=cfg.n_random,
                                            random_seed=cfg.random_seed, include_boundary=cfg.boundary,
                                            batch_size=cfg.batch_size), progress=progress)
               for alpha in cfg.alpha]
    return results[0] if len(results) == 1 else {"sweep": results}


def steer_lines(out: dict) -> list[str]:
    lines = []
    for r in out.get("sweep", [out]):
        rr = r["random"]
        lines.append(f"layer {r['layer']} alpha {r['alpha']} (|v| = {r['added_norm']}): probe flip rate "
                     f"{r['flip_rate']:.3f}; random directions mean {rr['mean']:.3f} (std {rr['std']:.3f}, min "
                     f"{rr['min']:.3f}, max {rr['max']:.3f}, n={rr['n']}); baseline accuracy "
                     f"{r['baseline_accuracy']:.3f}")
    return lines


def register(subparsers) -> None:
    from beliefscope.probes.harvest import add_arguments

    p = subparsers.add_parser("harvest", help="store activations with per-token labels")
    add_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_harvest)

    p = subparsers.add_parser("probe", help="fit linear probes on a store, with controls")
    p.add_argument("--acts", required=True, help="activation store folder")
    p.add_argument("--label", default="state", help="label to probe (state, parity, ...)")
    p.add_argument("--positions", default="after_first_event", choices=["after_first_event", "boundary", "all", "last"])
    p.add_argument("--out", default=None, help="folder for the fitted probes and report.json")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--train-events", default="1-8", help="main split; longer prompts test held-out lengths")
    p.add_argument("--trainer", default="torch", choices=["torch", "sklearn"])
    p.add_argument("--C", type=float, default=1.0, help="inverse L2 strength")
    p.add_argument("--max-iter", type=int, default=300)
    p.add_argument("--control-seed", type=int, default=0)
    p.add_argument("--layers-per-fit", type=int, default=8)
    p.add_argument("--random-init", default=None, help="random-init store (default ACTS/random_init)")
    p.add_argument("--no-random-init", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_probe)

    from beliefscope.config_flags import Command, register_command
    from beliefscope.probes.steering import SteerCommandConfig

    register_command(subparsers, Command(
        name="steer", help="add the probe direction and count answer flips", config=SteerCommandConfig,
        run=steer_run, lines=steer_lines, total=lambda cfg: cfg.n * len(cfg.alpha), unit="steered prompts",
        required=("model", "probes", "layer"),
        epilog="beliefscope steer --model target --probes probes/target-last --layer 3 --alpha 3 --n 100 --json"))
