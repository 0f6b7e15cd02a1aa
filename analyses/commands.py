"""`beliefscope beliefs | forced | instrument | interchange | lens | lens-train | trace | determinism | demo | view`
(registered by beliefscope/cli.py).

Imports inside the command functions are CLI start-up (said here, as the architecture asks): an area is
imported to register its commands, and each command loads torch and its models only when it runs, so
``beliefscope CMD --help`` answers at once.

Each command is a ``beliefscope.base.config_flags.Command``: its config class (whose fields are its flags,
defaults and help), a ``run(cfg, progress) -> dict`` and the ``lines`` it prints without ``--json``.

Shell::

    beliefscope demo --out runs/demo
    beliefscope beliefs --model target --probes runs/demo/probes/target \\
        --prompt "A coin is heads . Alice flips . State ?" --out b.png
    beliefscope forced --model target --probes runs/demo/probes/target --n 50 --out forced.png --json
    beliefscope trace --model target --drafter draft:draft --probes runs/demo/probes/target \\
        --draft-probes runs/demo/probes/draft --out trace.png
"""

from __future__ import annotations

import dataclasses
import os
import time

from beliefscope.base.config_flags import Command, register_command

from . import beliefs, determinism, forced, spec_trace, view
from .beliefs import BeliefsConfig
from .demo import DemoConfig
from .determinism import DeterminismConfig, int_list
from .forced import ForcedConfig
from .instrument import InstrumentConfig
from .interchange_report import InterchangeConfig
from .lens import LensConfig
from .lens_train import LensTrainConfig
from .lens_train import prepare as lens_train_prepare
from .spec_trace import TraceConfig
from .view import ViewConfig

_MODEL = ("checkpoint folder or alias (target, smollm2, thinking, smollm2-thinking); the model the probe was fit "
          "on")


def _files(res: dict) -> list[str]:
    return [f"wrote {p}" for p in res.get("files", [])]



def _beliefs_lines(res: dict) -> list[str]:
    if "thoughts" in res:  # a Thinking States model: its own beliefs
        head = (f"thoughts {' '.join(map(str, res['thoughts']))} (truth {' '.join(res['truth_at_boundaries'])}; "
                f"{res['thought_accuracy']:.0%} right); forced answers {' '.join(res['forced'])}; "
                f"answer {res['answer']}")
    elif res["accuracy_at_layer"] is None:
        last = res["positions"][-1]
        head = (f"layer {res['layer']}: no truth given (pass --data FILE --index I or --events JSON for one); at the "
                f"last token the probe reads {last['pred']} ({max(last['p']):.2f})")
    else:
        head = (f"layer {res['layer']}: the probe's top class is the true one on {res['accuracy_at_layer']:.1%} of "
                f"{res['scored_tokens']} labelled tokens (classes {', '.join(res['state_names'])})"
                + (f"; answer {res['answer']}" if res.get("answer") else ""))
    return [head, *_files(res)]



def _forced_lines(res: dict) -> list[str]:
    head = f"{res['n_boundaries']} event boundaries of {res['n_prompts']} prompts: "
    ci = res.get("intervals") or {}

    def rate(k: str) -> str:
        lo_hi = ci.get(k)
        return f"{res[k]:.1%}" + (f" [{lo_hi[0]:.1%}, {lo_hi[1]:.1%}]" if lo_hi else "")

    chance = f" (chance {ci['chance']:.1%}; 95% intervals over {ci['n_records']} records)" if ci else ""
    if "agreement" not in res:
        return [head + f"the forced answer names the true state on {rate('forced_accuracy')} (argmax over "
                f"{len(res.get('state_names') or ())} answers){chance}", *_files(res)]
    how = ", ".join(f"{n} {k}" for k, n in (res.get("scored_on") or {}).items())
    return [head + f"probe (blocks.{res['layer']}) agrees with the forced answer on {rate('agreement')}; forced "
            f"accuracy {rate('forced_accuracy')}, probe accuracy {rate('probe_accuracy')}{chance}"
            + (f"; the probe read {how} records" if how else ""), *_files(res)]


def _instrument_prepare(cfg: InstrumentConfig) -> InstrumentConfig:
    from beliefscope.base.files import check_writable_parent

    from ..tasks import get_task, parse_events_range

    if cfg.data or cfg.acts:
        if cfg.out:
            check_writable_parent(os.path.join(cfg.out, "instrument.json"))
        return dataclasses.replace(cfg, models=tuple(m.strip() for m in cfg.models if m.strip()))
    for n, flag in ((cfg.n_train, "--n-train"), (cfg.n_test, "--n-test"), (cfg.causal_n, "--causal-n")):
        if n < 1:
            raise ValueError(f"{flag} must be at least 1, got {n}")
    if cfg.lens_n < 0:
        raise ValueError(f"--lens-n must be 0 (no lens reading) or more, got {cfg.lens_n}")
    bands = tuple(b.strip() for b in cfg.bands) if cfg.bands else tuple(get_task(cfg.task).bands[:3])
    for b in bands:
        parse_events_range(b)
    if cfg.out:
        check_writable_parent(os.path.join(cfg.out, "instrument.json"))
    return dataclasses.replace(cfg, bands=bands, models=tuple(m.strip() for m in cfg.models if m.strip()))


def _instrument(cfg: InstrumentConfig, progress) -> dict:
    from .instrument import main, write
    from .instrument_data import main_data

    if cfg.acts:
        from .instrument_store import main_store

        res = main_store(cfg, progress=progress)
    else:
        res = main_data(cfg, progress=progress) if cfg.data else main(cfg, progress=progress)
    if cfg.out:
        res["files"] = write(res, cfg.out)
    return res


def _instrument_total(cfg: InstrumentConfig) -> int:
    from .instrument import prompts_read
    from .instrument_data import data_prompts_read

    if cfg.acts:
        return cfg.n  # records whose forced answers are read (None: the bar counts without a total)
    return data_prompts_read(cfg) if cfg.data else prompts_read(cfg)


def _instrument_lines(res: dict) -> list[str]:
    from .instrument import table_lines

    return table_lines(res)



def _trace_lines(res: dict) -> list[str]:
    return [f"acceptance {res['acceptance']}, {res['tokens_per_step']} tokens/step, {res['n_rejections']} rejecting "
            f"steps; draft belief wrong at rejections {res['draft_belief_wrong_at_rejections']} vs base rate "
            f"{res['draft_belief_wrong_base_rate']}", *_files(res)]



def _determinism_total(cfg: DeterminismConfig) -> int:
    shapes = len(int_list(cfg.window, "--window")) * len(int_list(cfg.verify_slots, "--verify-slots"))
    unverified = {"auto": 2, "all": 2, "both": 1, "fast": 1, "invariant": 1}.get(cfg.paths, 0)  # auto: at most 2
    return len(str(cfg.others).split(",")) * (unverified + shapes * (cfg.paths in ("auto", "all", "both", "verified")))


def _determinism_lines(res: dict) -> list[str]:
    return [f"verified unique max {res['verified_unique_max']}, fast path unique max {res['fast_path_unique_max']}, "
            f"batch-invariant fast path unique max {res['fast_path_invariant_unique_max']}", *_files(res)]


def _demo(cfg: DemoConfig, progress) -> dict:
    from ..models.profile import model_profile
    from . import demo, demo_thinking

    t = time.perf_counter()
    if model_profile(cfg.model).thinking:  # a model that writes its belief down: its own report
        s = demo_thinking.main(cfg)
        key = {"instrument_verdicts": [r["verdict"] for r in s["instrument"]["models"].values()]}
    else:
        s = demo.main(cfg)
        key = {"probe_best_layer": s["probe"]["best_layer"]}
    out = os.path.abspath(cfg.out)
    size = os.path.getsize(os.path.join(out, "report.html"))
    return {"out": out, "seconds": round(time.perf_counter() - t, 1), "report_bytes": size, **key}


def _demo_lines(res: dict) -> list[str]:
    return [f"wrote {res['out']}/report.html ({res['report_bytes'] / 1e6:.2f} MB), summary.json and figures/ in "
            f"{res['seconds']:.0f} s"]


def _interchange(cfg, progress):
    from . import interchange_report

    return interchange_report.main(cfg, progress=progress)


def _interchange_lines(res: dict) -> list[str]:
    if "chunks" in res:  # a Thinking States model: its written state swapped
        return [f"{res['n_pairs']} pairs; {res['site']}:", *[
            f"chunk {r['chunk']}: IIA {r['iia_swap']['accuracy']:.2f} {r['iia_swap']['interval']} (random vector at "
            f"the same distance: {r['iia_random']['accuracy']:.2f}; {r['iia_swap']['n_rows']} pairs)"
            for r in res["chunks"]], *_files(res)]
    head = (f"{res['n_heldout_pairs']} held-out pairs of {res['n_pairs']} ({res['source']}); the base answers right on "
            f"{res['base_correct']:.0%}")
    sites = [f"layer {r['layer']:>2} {r['position']:<10} {r['verdict']}" for r in res["sites"]]
    erased = [f"LEACE at layer {x}: accuracy falls {e['drop_leace']['drop']:+.2f} {e['drop_leace']['interval']} vs "
              f"{e['drop_random']['drop']:+.2f} for a random rank-{e['rank']} erasure; a probe refitted after it reads "
              f"{e['probe_after_erasure']['accuracy']:.2f} (majority {e['majority_baseline']['accuracy']:.2f})"
              for x, e in res["erasure"].items()]
    return [head, *sites, *erased, *_files(res)]


def _lens(cfg, progress):
    from . import lens

    return lens.main(cfg, progress=progress)


def _lens_lines(res: dict) -> list[str]:
    out = []
    for name, rates in res["in_place"].items():
        at = res["forms_at"][name]
        where = ", ".join(f"{k} from layer {v}" for k, v in at.items() if v is not None) or "nowhere"
        last = {k: v[-1] for k, v in {**rates, **({"forced": res["forced"][name]} if name in res["forced"] else {})}
                .items() if v}
        ci = res.get("intervals", {}).get(name, {})
        out.append(f"{name} lens on {res['n_stories']} stories: the answer becomes readable at {where}; last-layer "
                   "accuracy " + ", ".join(f"{k} {v:.2f} {ci[k][-1] if ci.get(k) else ''} (majority "
                                           f"{res['majority'][k]:.2f})" for k, v in last.items()))
    att = res.get("attention") or {}
    if att.get("n_scored"):
        best = max(range(len(att["evidence_mass"])), key=lambda i: att["evidence_mass"][i] - att["distractor_mass"][i])
        out.append(f"attention of the answer position ({att['n_scored']} stories where the evidence and the last-named "
                   f"distractor differ; {att['n_skipped']} not): at layer {best} evidence "
                   f"{att['evidence_mass'][best]:.3f} {att['evidence_interval'][best]} vs distractor "
                   f"{att['distractor_mass'][best]:.3f} {att['distractor_interval'][best]} (mean over heads)")
    return [*out, *_files(res)]


def _lens_train(cfg, progress):
    from . import lens_train

    return lens_train.train_main(cfg, progress=progress)


def _lens_train_lines(res: dict) -> list[str]:
    from .lens_train import kl_lines

    return kl_lines(res)


def _view_flags(p) -> None:
    p.add_argument("--model", default="thinking,target", help="comma-separated models shown side by side")
    p.add_argument("--prompt", action="append", default=None,
                   help="a story as text instead of sampled ones (repeat the flag for several)")


def _view_from_flags(args) -> dict:
    return {"models": tuple(m.strip() for m in args.model.split(",") if m.strip()),
            "prompts": tuple(args.prompt or ())}



def _view_lines(res: dict) -> list[str]:
    lines = [f"{name}: probe at layer {m['best_layer']} follows the truth on {m['probe_accuracy_at_best']:.1%} of "
             "tokens after the first event" for name, m in res["models"].items()]
    return [*lines, f"wrote {res['out']} ({res['bytes']:,} bytes, {res['n_stories']} stories) in {res['seconds']} s",
            *[f"wrote {p}" for p in res["files"][1:]]]


COMMANDS = (
    Command(name="beliefs", help="belief trajectory of one prompt: heatmap + best-layer line", config=BeliefsConfig,
            run=lambda cfg, progress: beliefs.main(cfg), lines=_beliefs_lines, required=("model",),
            choices={"task": ["coinflip", "cups", "variables"]},
            helps={"model": _MODEL,
                   "probes": "probe folder from `beliefscope probe --out` (same model); optional for Thinking States "
                             "models, whose thoughts and forced answers are drawn",
                   "prompt": 'e.g. "A coin is heads . Alice flips . Bob stays . State ?"',
                   "forced": "draw forced answers on the line plot"},
            epilog='beliefscope beliefs --model target --probes probes/target --out b.png --prompt "A coin is heads '
                   '. Alice flips . State ?"'),
    Command(name="forced", help="forced answers vs probe at every event boundary of many prompts", config=ForcedConfig,
            run=lambda cfg, progress: forced.main(cfg, progress=progress), lines=_forced_lines,
            total=lambda cfg: cfg.n if cfg.n is not None else (None if cfg.data else 50), unit="forced answers",
            required=("model",), choices={"rendering": ["toy", "natural"], "format": ["records", "boxes"]},
            helps={"model": _MODEL},
            epilog="beliefscope forced --model smollm2 --data stories.jsonl --events-field location "
                   "--question ' Where is it now? It is in the' --answers kitchen,garden,hall,bedroom --json"),
    Command(name="instrument", help="validate the belief instrument: probe, forced answer, thought and truth at every "
            "event boundary, per model and length band, with controls and a causal check", config=InstrumentConfig,
            run=_instrument, lines=_instrument_lines, total=_instrument_total, unit="prompts read",
            prepare=_instrument_prepare, choices={"format": ["records", "boxes"]},
            helps={"bands": "event-count bands of the held-out prompts (default: the task's first three, "
                            "1-8,9-16,17-32 for coinflip and cups, 1-10,10-25,25-50 for variables)"},
            epilog="beliefscope instrument --models target,thinking --n-train 60 --n-test 30 --out runs/instrument"),
    Command(name="interchange", help="is the label used? interchange interventions (whole, probe, mass-mean, random "
            "and DAS subspaces) and LEACE erasure at every layer and position, on held-out pairs",
            config=InterchangeConfig, run=_interchange, lines=_interchange_lines, unit="interventions",
            total=lambda cfg: None,  # a counter with its rate: the rows depend on the pairs each site scores
            choices={"rendering": ["toy", "natural"], "pair_by": ["group", "events"], "format": ["records", "boxes"]},
            helps={"model": _MODEL},
            epilog="beliefscope interchange --model target --n 100 --das-layers 2,3 --erase-layers 3 --out "
                   "runs/interchange"),
    Command(name="lens", help="when does the answer form? the forced answer through the logit lens (and a tuned "
            "lens) at every layer and position class: event boundaries, story, question, answer position",
            config=LensConfig, run=_lens, lines=_lens_lines, unit="stories read",
            total=lambda cfg: cfg.n if cfg.n is not None else (None if cfg.data else 40),
            choices={"rendering": ["toy", "natural"], "format": ["records", "boxes"]}, helps={"model": _MODEL},
            epilog="beliefscope lens --model target --n 40 --out runs/lens/target"),
    Command(name="lens-train", help="train a tuned lens (one affine translator per layer, Belrose et al. 2023) on "
            "your text or the shipped corpus; held-out KL per layer, tuned vs logit lens",
            config=LensTrainConfig, run=_lens_train, lines=_lens_train_lines, unit="texts captured, then steps",
            total=lambda cfg: None, prepare=lens_train_prepare,
            choices={"rendering": ["toy", "natural"]}, helps={"model": _MODEL},
            epilog="beliefscope lens-train --model target --steps 200 --out runs/lens/target-tuned"),
    Command(name="trace", help="speculative-decoding trace: cache timeline, acceptance, beliefs", config=TraceConfig,
            run=lambda cfg, progress: spec_trace.main(cfg, progress=progress), lines=_trace_lines,
            total=lambda cfg: cfg.n + (1 if cfg.prompt else 0),
            unit="speculative trace", required=("model",), choices={"fmt": ["cot", "direct"],
                                                                    "rendering": ["toy", "natural"]},
            epilog="beliefscope trace --model target --drafter draft:draft --probes probes/target --out trace.png"),
    Command(name="determinism", help="unique outputs vs co-batched requests, fast path vs verified (chart)",
            config=DeterminismConfig, run=lambda cfg, progress: determinism.main(cfg, progress=progress),
            lines=_determinism_lines, total=_determinism_total,
            unit="determinism", required=("model",),
            choices={"fast_dtype": ["float32", "bfloat16"],
                     "paths": ["auto", "all", "both", "fast", "invariant", "verified"]},
            renamed={"--prompts": "--n"},
            epilog="beliefscope determinism --model smollm2 --n 2 --others 0,3 --max-new-tokens 16 --json"),
    Command(name="demo", help="every analysis on the shipped checkpoints -> report.html", config=DemoConfig,
            run=_demo, lines=_demo_lines, skip=("progress",), bars="progress",
            helps={"model": "target (toy checkpoints) or smollm2 (the real model); a Thinking States model (thinking, "
                            "smollm2-thinking) gets its own report: answers and thoughts by band, the instrument "
                            "beside the same model without thoughts, one story token by token, the causal check"},
            epilog="beliefscope demo --out runs/demo"),
    Command(name="view", help="one self-contained HTML page: every token coloured by the probe's belief, with every "
            "layer, the truth, forced answer, thought and KV-cache provenance on hover", config=ViewConfig,
            run=lambda cfg, progress: view.main(cfg, progress=progress), lines=_view_lines,
            total=lambda cfg: (len(cfg.prompts) or cfg.n) * (len(cfg.models)
                                                            + (1 if cfg.decode and not cfg.data else 0)),
            unit="stories read", skip=("models", "prompts"),
            flags=_view_flags, from_flags=_view_from_flags,
            choices={"task": ["coinflip", "cups", "variables"], "format": ["records", "boxes"]},
            epilog="beliefscope view --model thinking,target --task coinflip --events 9-16 --n 6 --out view.html"),
)


def register(subparsers) -> None:
    for command in COMMANDS:
        register_command(subparsers, command)
