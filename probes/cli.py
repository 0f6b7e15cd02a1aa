"""`beliefscope harvest`, `beliefscope probe` and `beliefscope steer`.

Imports inside the command functions are CLI start-up (said here, as the architecture asks): an area is
imported to register its commands, and each command loads torch and its models only when it runs, so
``beliefscope CMD --help`` answers at once.

Shell::

    beliefscope harvest --model target --n 1000 --events 1-16 --out acts/target
    beliefscope probe --acts acts/target --label state --out probes/target --json
    beliefscope steer --model target --probes probes/target --layer 2 --alpha 1 --json  # a config_flags Command
"""

from __future__ import annotations

import dataclasses
import os
import sys

from beliefscope.base.config_flags import Command, register_command

from .harvest import BY_HAND, CHOICES, HELPS, HarvestRunConfig, add_hand_flags, run_sharded
from .harvest import run as run_harvest
from .report import ProbeCommandConfig


def _tqdm(desc: str, total: int | None = None, disable: bool = False):
    from beliefscope.base.progress import progress_bar

    return progress_bar(desc, total, disable=disable, leave=True)


@dataclasses.dataclass
class HarvestCommandConfig(HarvestRunConfig):
    """`beliefscope harvest`: a `probes.harvest.HarvestRunConfig` and what the terminal shows."""

    progress: bool = True  # a progress bar per store (--no-progress: none)
    quiet: bool = False  # no progress bars or loading messages on stderr (errors still print)


def harvest_run(cfg: HarvestCommandConfig, progress=None) -> dict:
    """Harvest the store(s) ``cfg`` names; the sizes about to be written go to stderr unless ``quiet``."""
    say = None if cfg.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    bars = (lambda out: _tqdm(f"harvest {out}")) if cfg.progress else None
    run_cfg = HarvestRunConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(HarvestRunConfig)})
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # started by torchrun: shard by rank, as the module entry does
        return run_sharded(run_cfg, None, None, bars, say)
    return run_harvest(run_cfg, bars, say=say)


def harvest_lines(result: dict) -> list[str]:
    lines = []
    for out, r in result.items():
        lines.append(f"{out}: {r['n_rows']} tokens, {len(r['hooks'])} hooks, {r['bytes'] / 1e6:.1f} MB, config "
                     f"{r['config_hash']}, complete={r['complete']}")
        if "labels" in r:
            lines.append("  labels: " + "; ".join(f"{k} ({len(v)} classes: {', '.join(v)})"
                                                  for k, v in r["labels"].items()))
    return lines


HARVEST = Command(
    name="harvest", help="store activations with per-token labels", config=HarvestCommandConfig, run=harvest_run,
    lines=harvest_lines, required=("out",), skip=(*BY_HAND, "progress"), choices=CHOICES, helps=HELPS,
    flags=add_hand_flags, from_flags=lambda args: {k: getattr(args, k) for k in BY_HAND}, bars="progress",
    epilog="beliefscope harvest --model target --n 300 --events 1-8 --out acts/target")


def _probe_stores(cfg):
    """The store and its random-init twin (or None) that ``cfg`` names; a bad label is refused before any fit."""
    from .store import ActivationStore

    store = ActivationStore.open(cfg.acts)
    from .report import resolve_label

    resolve_label(store, cfg.label)
    rpath = cfg.random_init or os.path.join(cfg.acts, "random_init")
    twin = ActivationStore.open(rpath) if os.path.exists(rpath) and cfg.random_init_twin else None
    return store, twin


def probe_run(cfg, progress) -> dict:
    from dataclasses import fields

    from .report import ReportConfig, probe_report

    store, twin = _probe_stores(cfg)
    report_cfg = ReportConfig(**{f.name: getattr(cfg, f.name) for f in fields(ReportConfig)})
    data = probe_report(store, report_cfg, twin, out=cfg.out, progress=progress).to_json()
    if cfg.out:
        from beliefscope.base.files import atomic_save, atomic_write_json

        from .chart import probe_layers_figure

        atomic_write_json(os.path.join(cfg.out, "report.json"), data)
        fig, png = probe_layers_figure(data), os.path.join(cfg.out, "probe-layers.png")
        atomic_save(png, lambda tmp: fig.savefig(tmp, dpi=130, format="png"))
        import matplotlib.pyplot as plt

        plt.close(fig)
        data["files"] = [png]
    return data


def probe_lines(rep: dict) -> list[str]:
    cols = ["layer", "accuracy", "mass_mean_accuracy", "control_accuracy", "selectivity", "random_init_accuracy",
            "accuracy_event_tokens", "accuracy_other_tokens", "heldout_length_accuracy", "heldout_template_accuracy",
            "heldout_split_accuracy"]
    cols = [c for c in cols if any(c in r for r in rep["layers"])]
    return [f"{rep['model']}: label={rep['label']} positions={rep['positions']} prompts={rep['n_prompts']} "
            f"tokens={rep['n_rows']} folds={rep['folds']} (by prompt) trainer={rep['trainer']}",
            f"majority {rep['majority_accuracy']:.3f}  embedding {rep['embedding_accuracy']:.3f} "
            + (f"(control {rep['embedding_control_accuracy']:.3f})" if rep.get("embedding_control_accuracy")
               is not None else "(control task left out)"),
            *(f"  baseline {k}: {v['accuracy']:.3f} [{v['interval'][0]:.3f}, {v['interval'][1]:.3f}] "
              f"({v['description']})" for k, v in rep.get("baselines", {}).items()),
            *([f"  control task: {rep['control']['note']}"] if rep.get("control", {}).get("defined") is False else []),
            "  ".join(f"{c[:14]:>14}" for c in cols),
            *("  ".join(f"{'-' if r.get(c) is None else r[c]:>14}" for c in cols) for r in rep["layers"]),
            f"best layer: {rep['best_layer']} (every accuracy {rep.get('scored_on', 'out-of-fold')})",
            *([rep["verdict"]] if rep.get("verdict") else []),
            *(f"fitted here, read on {path} ({t['n_rows']} rows, {t['n_groups']} groups): best {t['best_hook']} "
              + "{accuracy:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]".format(
                  **next(r for r in t["layers"] if r["hook"] == t["best_hook"]))
              for path, t in rep.get("transfer", {}).items())]


def steer_run(cfg, progress) -> dict:
    """Every alpha of ``cfg`` on the same prompts: one experiment's dict, or ``{"sweep": [...]}``."""
    from ..models.load import load_model
    from .harvest import HarvestConfig, make_examples
    from .linear import LinearProbe
    from .steering import SteerConfig, steer_experiment

    probe = LinearProbe.load(cfg.probes)
    hc = dict(probe.meta.get("harvest_config", {}))
    fields = {k: hc[k] for k in HarvestConfig.__dataclass_fields__ if k in hc}
    fields.update(n=cfg.n, seed=cfg.seed, events=cfg.events)
    if fields.get("split") == "train+heldout":
        fields["split"] = "train"
    examples = make_examples(HarvestConfig(**fields))
    model, tok = load_model(cfg.model)
    results = [steer_experiment(model, tok, probe, examples,
                                SteerConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(SteerConfig)
                                               if f.name != "alpha"}, alpha=alpha), progress=progress)
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


def _probe_flags(p) -> None:
    p.add_argument("--no-random-init", action="store_true",
                   help="do not fit the random-init twin's probes, even where the store has one")


def register(subparsers) -> None:
    register_command(subparsers, HARVEST)

    register_command(subparsers, Command(
        name="probe", help="fit linear probes on a store, with controls", config=ProbeCommandConfig,
        run=probe_run, lines=probe_lines, total=lambda cfg: len(_probe_stores(cfg)[0].hooks), unit="layers fitted",
        required=("acts",), skip=("random_init_twin",), flags=_probe_flags,
        from_flags=lambda args: {"random_init_twin": not args.no_random_init},
        choices={"positions": ["auto", "after_first_event", "boundary", "labelled", "all", "last"],
                 "trainer": ["torch", "sklearn"]},
        epilog="beliefscope probe --acts acts/target --label state --positions last --out probes/target-last --json"))

    from .steering import SteerCommandConfig

    register_command(subparsers, Command(
        name="steer", help="add the probe direction and count answer flips", config=SteerCommandConfig,
        run=steer_run, lines=steer_lines, total=lambda cfg: cfg.n * len(cfg.alpha), unit="steered prompts",
        required=("model", "probes", "layer"),
        epilog="beliefscope steer --model target --probes probes/target-last --layer 3 --alpha 3 --n 100 --json"))
