"""Command-line flags built from a config dataclass, so that a flag's name, type, default and help
are the field's, written once (a default copied into a flag by hand drifts from its config class).

A field ``n_train: int = 400  # prompts that fit the probes`` becomes ``--n-train N`` with default
400 and the help "prompts that fit the probes"; the comment may go on over following ``#`` lines.
``bool`` fields become switches (``--quick`` when the default is False, ``--no-forced`` when it is
True), ``X | None`` takes an X, and a tuple field takes a comma-separated list.

>>> import argparse, dataclasses
>>> @dataclasses.dataclass
... class Demo:
...     n: int = 3  # prompts
...     names: tuple = ("a", "b")  # comma-separated names
...     forced: bool = True  # draw the forced answers
>>> p = argparse.ArgumentParser()
>>> add_config_flags(p, Demo)
>>> config_from_args(Demo, p.parse_args(["--n", "5", "--names", "x,y", "--no-forced"]))
Demo(n=5, names=('x', 'y'), forced=False)
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import json
import sys
import textwrap
import tokenize
import types
import typing

from beliefscope.base.progress import progress_bar


def field_help(cls) -> dict[str, str]:
    """Each field's comment in the class source (a comment's continuation lines joined to it), a base
    dataclass's fields included; no help at all for a class without a source file (one typed at a prompt)."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            out.update(_own_field_help(base))
    return {**out, **_own_field_help(cls)}


def _own_field_help(cls) -> dict[str, str]:
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef)).body
    fields = {n.end_lineno: n.target.id for n in body if isinstance(n, ast.AnnAssign)}
    comments, code_rows = {}, set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(), tok.line.strip().startswith("#"))
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_rows.add(tok.start[0])
    out, current = {}, None
    for row in range(1, len(src.splitlines()) + 1):
        if row in fields:
            current = fields[row]
            out[current] = comments[row][0] if row in comments and not comments[row][1] else ""
        elif row in comments and comments[row][1] and current:  # a comment line continuing the field's
            out[current] = f"{out[current]} {comments[row][0]}".strip()
        elif row in code_rows:
            current = None
    return out


def _kind(hint) -> tuple[type, bool]:
    """(the value's type, whether it is a tuple) of a field's type hint; ``X | None`` is X."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    origin = typing.get_origin(hint) or hint
    if origin in (tuple, list):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return (args[0] if args else str), True
    return hint, False


def _listed(kind: type):
    def parse(text: str) -> tuple:
        return tuple(kind(x.strip()) for x in str(text).split(",") if x.strip())
    parse.__name__ = f"comma-separated {kind.__name__}"  # argparse names the type in its error
    return parse


def add_config_flags(parser: argparse.ArgumentParser, cls, *, skip=(), required=(), choices=None,
                     helps=None) -> None:
    """One flag per field of the dataclass ``cls`` (not those in ``skip``), with the field's default
    and comment; ``required`` fields have no default, ``choices`` maps a field to its allowed values
    and ``helps`` replaces a field's comment where the command says it better."""
    hints = typing.get_type_hints(cls)
    comments = field_help(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        text = (helps or {}).get(f.name, comments.get(f.name, "")).replace("%", "%%")  # argparse formats help
        default = None if f.default is dataclasses.MISSING else f.default
        if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        kind, listed = _kind(hints[f.name])
        if kind is bool:
            if default:
                parser.add_argument(f"--no-{f.name.replace('_', '-')}", dest=f.name, action="store_false",
                                    help=f"do not {text}%(default).0s")  # the switch's own default says nothing
            else:
                parser.add_argument(flag, action="store_true", help=text)
            continue
        if default in ("", None):  # nothing worth a "(default: )": the comment says what an empty value means
            text += "%(default).0s"
        kw = {"help": text, "choices": (choices or {}).get(f.name)}
        if f.name in required or (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING):
            kw["required"] = True
        else:
            kw["default"] = ",".join(map(str, default)) if listed and default is not None else default
        parser.add_argument(flag, type=_listed(kind) if listed else kind, **kw)


class _Renamed(argparse.Action):
    """A flag that was renamed: using it is an error that names the new spelling."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        raise argparse.ArgumentError(self, f"renamed: use {self.new} (one spelling per concept: --n counts the "
                                           "prompts a command runs, --n-<role> a count with a role)")


def add_renamed_flags(parser: argparse.ArgumentParser, renamed: dict) -> None:
    """Hidden flags ``{old: new}`` that refuse with the new spelling (``--prompts 4`` -> "use --n")."""
    for old, new in renamed.items():
        parser.add_argument(old, action=_Renamed, new=new, dest=f"_renamed_{old.lstrip('-')}", nargs="?",
                            help=argparse.SUPPRESS)


def config_from_args(cls, args: argparse.Namespace, **overrides):
    """The config whose fields are the parsed flags of the same names (``overrides`` win)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**{**given, **overrides})


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand as data: its config class is its flags, ``run`` does the work and returns a
    JSON-able dict, ``lines`` says it on the terminal (or ``--json`` prints the dict)."""

    name: str  # the subcommand, e.g. "forced"
    help: str  # its line in `beliefscope --help`
    config: type  # config dataclass: one flag per field, with the field's default and comment
    run: typing.Callable  # run(cfg, progress) -> dict; progress(n) is called as n units of work are done
    lines: typing.Callable  # lines(result) -> list of strings printed without --json
    total: typing.Callable | None = None  # total(cfg) -> units of work for the progress bar (None: no bar)
    unit: str = ""  # the progress bar's description
    required: tuple = ()  # fields that must be given on the command line
    skip: tuple = ()  # fields that are not flags (set by the command, or not for the command line)
    choices: dict = dataclasses.field(default_factory=dict)  # field -> its allowed values
    helps: dict = dataclasses.field(default_factory=dict)  # field -> help that says it better than the comment
    epilog: str = ""  # a working example, shown at the end of the help
    prepare: typing.Callable | None = None  # prepare(cfg) -> cfg: refuse bad values (naming the flag) and fill
    #   defaults that depend on other fields, before any work
    flags: typing.Callable | None = None  # flags(parser): flags added by hand for `skip`ped fields
    from_flags: typing.Callable | None = None  # from_flags(args) -> {field: value} of those hand-made flags
    bars: str = ""  # a bool field that --no-progress sets to False (a command that draws its own bars)
    renamed: dict = dataclasses.field(default_factory=dict)  # old flag -> its new spelling (the old one refuses)
    notes: typing.Callable | None = None  # notes(result) -> lines for stderr after the result (not with --json)
    json_indent: int | None = 1  # --json's indent (None: the object on one line, as `generate` prints it)
    as_json: typing.Callable | None = None  # as_json(result) -> what --json prints (None: the result itself)
    failure: typing.Callable | None = None  # failure(result) -> None, or a line for stderr: the command then exits
    #   with 1 (with or without --json)


def register_command(subparsers, command: Command) -> argparse.ArgumentParser:
    """Add ``command``'s parser: its config's flags and ``--json``; `--no-progress`, `--quiet`,
    `--device` and `--dtype` come from the command line's common flags."""
    p = subparsers.add_parser(command.name, help=command.help,
                              epilog=f"example: {command.epilog}" if command.epilog else None)
    add_config_flags(p, command.config, skip=command.skip, required=command.required, choices=command.choices,
                     helps=command.helps)
    if command.flags:
        command.flags(p)
    add_renamed_flags(p, command.renamed)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress stays on stderr)")
    p.set_defaults(func=lambda args: run_command(command, args))
    return p


def run_command(command: Command, args: argparse.Namespace) -> int:
    """Build the config from the flags, run it under a progress bar, print the result."""

    quiet = getattr(args, "no_progress", False)
    extra = command.from_flags(args) if command.from_flags else {}
    cfg = config_from_args(command.config, args, **extra, **({command.bars: not quiet} if command.bars else {}))
    if command.prepare:
        cfg = command.prepare(cfg)
    total = command.total(cfg) if command.total else None
    with progress_bar(command.unit or command.name, total, disable=quiet or command.total is None) as bar:
        result = command.run(cfg, bar.update)
    if result is None:  # a process with nothing to say (a torchrun rank other than 0: rank 0 reports)
        return 0
    if getattr(args, "json", False):
        print(json.dumps(command.as_json(result) if command.as_json else result, indent=command.json_indent,
                         default=float))
    else:
        print("\n".join(command.lines(result)))
        for line in command.notes(result) if command.notes else ():
            print(line, file=sys.stderr)
    failed = command.failure(result) if command.failure else None
    if failed:
        print(failed, file=sys.stderr)
    return 1 if failed else 0
