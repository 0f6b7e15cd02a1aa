"""Bad input typed at the command line: one clear line naming the value and the fix, exit code 2,
no traceback, and nothing left on disk. Cases marked `before_load` must fail before any model loads."""

from __future__ import annotations

import os
import shlex

import pytest

from beliefscope.cli import main

PROMPT = "'A coin is heads . State ?'"
# (command line, a fragment the error must contain, fails before any model is loaded)
CASES = [
    ("eval --model target --n 0", "--n must be at least 1", True),
    ("eval --model no-such-model", "shipped names: target, draft", True),
    ("eval --model ./checkpoints/nope", "no checkpoint folder at", True),
    ("eval --model target --events 9-3", "events range 9-3", True),
    ("eval --model target --task nope", "task 'nope' does not exist", True),
    ("eval --model target --device cuda:3", "device 'cuda:3' is not available", True),
    ("eval --model target --device tpu9", "is not a torch device", True),
    (f"generate --model target --gamma 0 --prompt {PROMPT}", "--gamma '0' is invalid", True),
    (f"generate --model target --drafter foo:1 --prompt {PROMPT}", "unknown drafter 'foo:1'", False),
    ("generate --model target --prompt ''", "the prompt is empty", False),
    (f"generate --model target --dtype bfloat16 --packed --prompt {PROMPT}",
     "packed linears need float32 weights on the CPU", False),
    ("harvest --model target --n 5 --out afile/acts", "afile is a file, not a folder", True),
    ("harvest --model target --n 0 --out acts", "harvest at least 1 prompt", True),
    ("probe --acts missing-store --out probes", "activation store 'missing-store' does not exist", True),
    ("steer --model target --probes missing-probes --layer 3", "missing-probes/probe.json is missing", True),
    ("beliefs --model target --probes missing-probes --prompt 'hello world' --out b.png",
     "missing-probes does not exist",
     True),
    ("forced --model target --probes missing-probes --n 0", "n must be at least 1", True),
    ("determinism --model target --others 1,-2", "others='1,-2'", True),
    ("determinism --model target --n 0", "the workload is empty", True),
    ("datastore --model target --n 0 --out store.json", "build the store from at least 1 prompt", True),
    ("determinism --model target --out afile/d.png", "afile is a file, not a folder", True),
    ("train --preset nope --out m", "preset 'nope' is unknown", True),
    ("train --preset thinking --out afile/m", "afile is a file, not a folder", True),
    ("instrument --models target,nope", "model 'nope' is not a shipped name", True),
    ("trace --model target --drafter none --out t.png", "--drafter none drafts nothing", True),
]


@pytest.mark.parametrize("line,fragment,before_load", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line_and_leaves_nothing(line, fragment, before_load, tmp_path, monkeypatch, capsys):
    from beliefscope.models import load

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file where a folder is expected")
    if before_load:
        def refuse(*a, **k):
            raise AssertionError(f"{line!r} loaded a model before rejecting its input")

        monkeypatch.setattr(load, "load_hf", refuse)
        monkeypatch.setattr(load, "load_thinking", refuse)  # the names load_model calls
    argv = shlex.split(line)
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and "Traceback" not in err
    assert lines and lines[-1].startswith(f"beliefscope {argv[0]}: error: ") and fragment in lines[-1], err
    assert sorted(os.listdir(tmp_path)) == ["afile"]  # nothing written, not even a folder
