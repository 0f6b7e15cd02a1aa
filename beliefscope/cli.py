"""The `beliefscope` command line. Each area registers its own subcommands:

- models/cli.py: train, eval
- decoding/cli.py: generate
- probes/cli.py: harvest, probe, steer
- analyses/commands.py: beliefs, forced, trace, determinism, demo
- benchmarks/cli.py: bench

A module registers with ``register(subparsers)``, adding parsers whose ``func(args) -> int``
runs the command. This module sits at the top of the package, above every area it registers.
``benchmarks`` exists only in a source checkout (it is not installed), so `bench` is listed only
there.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

AREAS = ("beliefscope.models.cli", "beliefscope.decoding.cli", "beliefscope.probes.cli", "beliefscope.analyses.commands", "beliefscope.benchmarks.cli")


class _CommandParser(argparse.ArgumentParser):
    """Every subcommand's help shows each flag's default."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="beliefscope",
        description="Inspect what a language model believes while it generates.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    for mod in AREAS:
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name and (mod == e.name or mod.startswith(e.name + ".")):  # the area itself is absent
                continue
            raise
        module.register(sub)
    for name, p in sub.choices.items():
        add_common_flags(p)
    return parser


def add_common_flags(p: argparse.ArgumentParser) -> None:
    """`--quiet` on every command; `--device` and `--dtype` on every command that loads a model."""
    dests = {a.dest for a in p._actions}
    if "quiet" not in dests:
        p.add_argument("--quiet", action="store_true",
                       help="no progress bars or loading messages on stderr (errors still print)")
    if dests & {"model", "models"} and "device" not in dests:
        p.add_argument("--device", default="auto",
                       help="where the model runs: cpu, cuda, cuda:N or mps; auto is cuda when available, else cpu")
        p.add_argument("--dtype", dest="model_dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                       help="the model's weights and activations dtype")


def _silence_loaders() -> None:
    """transformers' loading bars and warnings off (they go to stderr; `--quiet` wants none)."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def main(argv=None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if getattr(args, "quiet", False):
        args.no_progress = True
        _silence_loaders()
    try:
        from beliefscope.models.load import model_defaults

        device = getattr(args, "device", None)
        with model_defaults(device=None if device == "auto" else device, dtype=getattr(args, "model_dtype", None)):
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
