"""Help says what every flag is and its default, and ends with an example that parses."""

from __future__ import annotations

import shlex

import pytest

from beliefscope.cli import build_parser

PARSER = build_parser()
COMMANDS = next(a for a in PARSER._actions if a.dest == "command").choices


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_flag_has_a_sentence_and_the_help_shows_defaults(name):
    p = COMMANDS[name]
    bare = [a.option_strings or [a.dest] for a in p._actions if a.dest != "help" and not (a.help or "").strip()]
    assert not bare, f"{name}: flags without help: {bare}"
    text = " ".join(p.format_help().split())  # wrapping undone
    assert "(default: None)" not in text
    for a in p._actions:
        if a.option_strings and a.default not in (None, False) and a.dest != "help" and a.help != "==SUPPRESS==":
            assert f"(default: {a.default})" in text or "%(default)" in a.help, (name, a.option_strings)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_ends_with_an_example_that_parses(name):
    p = COMMANDS[name]
    assert p.epilog and p.epilog.startswith("example: beliefscope "), name
    argv = shlex.split(p.epilog.removeprefix("example: beliefscope "))
    args = build_parser().parse_args(argv)  # wrong flags or values fail here (SystemExit)
    assert args.command == name and " ".join(p.format_help().split()).endswith(" ".join(p.epilog.split()))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_takes_the_shared_output_flags(name):
    flags = {s for a in COMMANDS[name]._actions for s in a.option_strings}
    assert {"--quiet", "--no-progress"} <= flags, name
