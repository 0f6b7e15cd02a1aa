"""The `beliefscope` command line. Each area registers its own subcommands:

- models/cli.py: train, eval
- decoding/cli.py: generate, datastore
- probes/cli.py: harvest, probe, steer
- analyses/commands.py: beliefs, forced, instrument, interchange, lens, lens-train, trace, determinism, demo, view
- benchmarks/cli.py: bench

A module registers with ``register(subparsers)``, adding parsers whose ``func(args) -> int``
runs the command. This module sits at the top of the package, above every area it registers. Its imports
inside functions are CLI start-up: an area (and torch) is imported only for the command that needs it.
``benchmarks`` exists only in a source checkout (it is not installed), so `bench` is listed only
there.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

AREAS = ("beliefscope.models.cli", "beliefscope.decoding.cli", "beliefscope.probes.cli",
         "beliefscope.analyses.commands", "beliefscope.benchmarks.cli")

# command -> (the area that registers it, the one-line help it registers there), in the order `--help` lists them.
# `beliefscope --help` and `beliefscope CMD ...` import only CMD's area (the others import torch, seconds each);
# tests/test_cli_help.py checks this table against what every area registers.
COMMANDS = {
    "train": (AREAS[0], "train a toy model: GPT-2 presets with a length curriculum, or the RoPE presets (direct-rope, "
                        "cot-rope, thinking) on equal terms; or Thinking States over SmolLM2 (smollm2-thinking: "
                        "resumable, re-run the same command to continue)"),
    "eval": (AREAS[0], "exact match and answer accuracy of a model on a task"),
    "generate": (AREAS[1], "generate with speculative decoding (verify + rollback)"),
    "datastore": (AREAS[1], "build the n-gram store of the retrieval drafter (store:PATH) from the model's own greedy "
                            "outputs on training prompts"),
    "harvest": (AREAS[2], "store activations with per-token labels"),
    "probe": (AREAS[2], "fit linear probes on a store, with controls"),
    "steer": (AREAS[2], "add the probe direction and count answer flips"),
    "beliefs": (AREAS[3], "belief trajectory of one prompt: heatmap + best-layer line"),
    "forced": (AREAS[3], "forced answers vs probe at every event boundary of many prompts"),
    "instrument": (AREAS[3], "validate the belief instrument: probe, forced answer, thought and truth at every event "
                             "boundary, per model and length band, with controls and a causal check"),
    "interchange": (AREAS[3], "is the label used? interchange interventions (whole, probe, mass-mean, random and DAS "
                              "subspaces) and LEACE erasure at every layer and position, on held-out pairs"),
    "lens": (AREAS[3], "when does the answer form? the forced answer through the logit lens (and a tuned lens) at "
                       "every layer and position class: event boundaries, story, question, answer position"),
    "lens-train": (AREAS[3], "train a tuned lens (one affine translator per layer, Belrose et al. 2023) on your text "
                             "or the shipped corpus; held-out KL per layer, tuned vs logit lens"),
    "trace": (AREAS[3], "speculative-decoding trace: cache timeline, acceptance, beliefs"),
    "determinism": (AREAS[3], "unique outputs vs co-batched requests, fast path vs verified (chart)"),
    "demo": (AREAS[3], "every analysis on the shipped checkpoints -> report.html"),
    "view": (AREAS[3], "one self-contained HTML page: every token coloured by the probe's belief, with every layer, "
                       "the truth, forced answer, thought and KV-cache provenance on hover"),
    "bench": (AREAS[4], "speed benchmarks (ratios against a baseline, measured in one run)"),
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each flag's default; the example (epilog) as written; no line break inside a hyphenated word."""

    def _split_lines(self, text, width):
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _CommandParser(argparse.ArgumentParser):
    """Every subcommand's help shows each flag's default and ends with an example."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command``, only that command's area is imported and registered, and the
    other commands are listed by name and help (what `--help` and a mistyped command need)."""
    parser = argparse.ArgumentParser(
        prog="beliefscope",
        description="Inspect what a language model believes while it generates.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    only = COMMANDS[command][0] if command in COMMANDS else None
    for mod in AREAS:
        if command is not None and mod != only:  # listed, not built
            if _area_exists(mod):
                for name, (area, text) in COMMANDS.items():
                    if area == mod:
                        sub.add_parser(name, help=text)
            continue
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name and (mod == e.name or mod.startswith(e.name + ".")):  # the area itself is absent
                continue
            raise
        module.register(sub)
    for name, p in sub.choices.items():
        add_common_flags(p, name)
    return parser


def _area_exists(mod: str) -> bool:
    """``benchmarks`` exists only in a source checkout; the installed areas always do (asking for one would
    import its package, and torch with it)."""
    import importlib.util

    package = mod.rsplit(".", 1)[0]
    return package != "beliefscope.benchmarks" or importlib.util.find_spec(package) is not None


NO_PROGRESS_HELP = "no progress bar"


def add_common_flags(p: argparse.ArgumentParser, name: str = "") -> None:
    """`--quiet` and `--no-progress` on every command; `--device` and `--dtype` on every command that loads a
    model. Every other flag's help, and the example that ends it, is the command's own: its config's field
    comments (``base.config_flags``)."""
    for a in p._actions:
        if a.help and a.help != argparse.SUPPRESS and a.default is None and "%(default)" not in a.help:
            a.help += "%(default).0s"  # required, or the help says what None means: no "(default: None)"
    dests = {a.dest for a in p._actions}
    if "no_progress" not in dests:  # every command takes it, long-running or not, so scripts can pass it blindly
        p.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    if "quiet" not in dests:
        p.add_argument("--quiet", action="store_true",
                       help="no progress bars or loading messages on stderr (errors still print)")
    if (dests & {"model", "models"} or name == "bench") and "device" not in dests:
        p.add_argument("--device", default="auto",
                       help="where the model runs: cpu, cuda, cuda:N or mps; auto is cuda when available, else cpu")
        p.add_argument("--dtype", dest="model_dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                       help="the model's weights and activations dtype")
        p.add_argument("--device-map", default=None,
                       help="place the model over several devices, the CPU and disk with accelerate (a model bigger "
                            "than one GPU): auto, balanced, sequential, or a JSON object / file of module -> device "
                            "(0, cuda:1, cpu, disk); --device is then ignored%(default).0s")
        p.add_argument("--max-memory", default=None,
                       help="with --device-map: memory per device, e.g. 0=20GiB,1=20GiB,cpu=64GiB%(default).0s")
        p.add_argument("--offload-folder", default=None,
                       help="with --device-map: folder for the weights of modules placed on 'disk'%(default).0s")


@contextlib.contextmanager
def _silenced(quiet: bool, no_progress: bool = False):
    """With `--no-progress`, transformers' own bars (loading, "Writing model shards") off too; with `--quiet`, its
    warnings as well (its own switches; the GGUF loader's bar follows them, `models.hf_load`). Our bars are off
    through ``args.no_progress``. Restored after."""
    if not (quiet or no_progress):
        yield
        return
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def main(argv=None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else "")
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    quiet = getattr(args, "quiet", False)
    if quiet:
        args.no_progress = True
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and args.command != "harvest":  # harvest shards by rank
        how = ("run it in one process (only `harvest` shards its records across torchrun's processes)")
        print(f"beliefscope {args.command}: error: started by torchrun (WORLD_SIZE {os.environ['WORLD_SIZE']}), where "
              f"each process would run the whole command (a store would hold every record twice): {how}",
              file=sys.stderr)
        return 2
    try:
        from beliefscope.models.load import model_defaults

        device = getattr(args, "device", None)
        defaults = model_defaults(device=None if device == "auto" else device, dtype=getattr(args, "model_dtype", None),
                                  device_map=getattr(args, "device_map", None),
                                  max_memory=getattr(args, "max_memory", None),
                                  offload_folder=getattr(args, "offload_folder", None))
        with _silenced(quiet, getattr(args, "no_progress", False)), defaults:
            return int(args.func(args) or 0)
    except (ValueError, KeyError, FileNotFoundError, PermissionError, RuntimeError) as e:
        # Library errors carry the bad value and the fix; show them without a traceback.
        if os.environ.get("BELIEFSCOPE_DEBUG"):
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"beliefscope {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
