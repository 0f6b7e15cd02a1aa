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


@pytest.mark.parametrize("argv,new", [
    (["determinism", "--model", "target", "--prompts", "2"], "--n"),
    (["datastore", "--out", "store.json", "--prompts", "2"], "--n"),
    (["train", "--preset", "thinking", "--eval-n", "3", "--out", "run"], "--n-eval"),
])
def test_renamed_flags_refuse_naming_the_new_spelling(argv, new, capsys, tmp_path, monkeypatch):
    """One spelling per count of prompts: an old flag stops before any work and names the new one."""
    from beliefscope.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and f"renamed: use {new} " in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_renamed_flags_stay_out_of_the_usage(name):
    assert "_RENAMED" not in COMMANDS[name].format_usage(), name


@pytest.mark.parametrize("ok", [True, False])
def test_bench_exits_1_naming_a_benchmark_whose_outputs_differ(ok, monkeypatch, capsys):
    """`bench` is a Command: --json prints the summary (headline, seconds, outputs_ok) only, and outputs that
    differ from their baseline make it exit 1 with their name on stderr (the benchmark itself is stubbed: this
    checks the command's wiring, not a measurement)."""
    import json

    import beliefscope.benchmarks.cli as bench
    from beliefscope.cli import main

    monkeypatch.setattr(bench, "run_one", lambda name, quick, no_progress=False, smollm2="smollm2": {
        "quick": quick, "speedup_longest": 1.5, "outputs_identical": ok})
    assert main(["bench", "cache", "--quick", "--json", "--threads", "1"]) == (0 if ok else 1)
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert list(got) == ["cache"] and got["cache"]["speedup_longest"] == 1.5 and got["cache"]["outputs_ok"] is ok
    assert ("outputs differ from the baseline in: cache" in err) is not ok
    assert main(["bench", "cache", "--quick", "--threads", "1"]) == (0 if ok else 1)
    assert "speedup_longest = 1.5" in capsys.readouterr().out


def test_bench_smollm2_folder_is_refused_for_a_benchmark_that_does_not_read_it(capsys):
    from beliefscope.cli import main

    assert main(["bench", "cache", "--quick", "--smollm2", "some/folder"]) == 2
    err = capsys.readouterr().err
    assert "--smollm2 'some/folder' is read by bench overhead and determinism only, not by cache" in err


def test_the_command_table_lists_what_the_areas_register():
    """`beliefscope --help` and `beliefscope CMD` build from `cli.COMMANDS` instead of importing every area: the table
    names each registered command, in order, with the area that registers it and the help it registers."""
    from beliefscope.cli import COMMANDS as TABLE

    sub = next(a for a in PARSER._actions if a.dest == "command")
    registered = {c.dest: c.help for c in sub._choices_actions}
    assert list(registered) == list(TABLE)
    for name, (area, text) in TABLE.items():
        assert registered[name] == text, name
        one = next(a for a in build_parser(name)._actions if a.dest == "command")  # only name's area is built
        assert {c.dest: c.help for c in one._choices_actions} == registered, name
        assert one.choices[name].get_default("func") is not None, f"{name} is not registered by {area}"
        assert one.choices[name].format_help() == COMMANDS[name].format_help(), name
        others = [n for n, (a, _) in TABLE.items() if a != area]
        assert all(one.choices[n].get_default("func") is None for n in others), name


def test_help_and_a_mistyped_command_answer_without_importing_torch():
    import subprocess
    import sys

    code = ("import sys, beliefscope.cli as c\n"
            "for argv in (['--help'], ['genrate'], []):\n"
            "    try:\n"
            "        c.main(argv)\n"
            "    except SystemExit:\n"
            "        pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "generate" in r.stdout and "invalid choice: 'genrate'" in r.stderr


def test_the_command_line_starts_without_scikit_learn():
    """Every command builds the whole parser, and most never fit with scikit-learn: building it, and importing
    `beliefscope.probes`, leaves scikit-learn (about 1 s with SciPy and pandas) unloaded until
    `ProbeClassifier` or a scikit-learn fit asks for it."""
    import subprocess
    import sys

    code = ("import sys, beliefscope.cli as c, beliefscope.probes as p; c.build_parser(); "
            "assert 'sklearn' not in sys.modules, 'sklearn loaded at start-up'; "
            "p.ProbeClassifier; assert 'sklearn' in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("quiet, no_progress", [(False, True), (True, False), (True, True)])
def test_no_progress_also_turns_off_transformers_bars_and_restores_them(quiet, no_progress):
    """`--no-progress` (and `--quiet`) switch transformers' own bars off for the command (its "Writing model
    shards" bar showed under `train --no-progress`); only `--quiet` lowers its logging; both are restored."""
    from transformers.utils import logging as hf_logging

    from beliefscope.cli import _silenced

    verbosity = hf_logging.get_verbosity()
    assert hf_logging.is_progress_bar_enabled()
    with _silenced(quiet, no_progress):
        assert not hf_logging.is_progress_bar_enabled()
        assert (hf_logging.get_verbosity() == hf_logging.ERROR) == quiet or verbosity == hf_logging.ERROR
    assert hf_logging.is_progress_bar_enabled() and hf_logging.get_verbosity() == verbosity
