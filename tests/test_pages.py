"""Every code block of README.md runs as written, from a temporary folder outside the repository.

Python blocks run in order in one interpreter (a later block uses what an earlier one defined);
bash blocks run in one shared folder, two lanes at a time (the analyses that read the probes the
probe block fitted run after it, in its lane). The set-up block (`make demo` / `make test`) is what
CI itself runs. Numbers the README quotes next to a command are checked against its output.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from .helpers import ROOT

pytestmark = pytest.mark.slow
README = os.path.join(ROOT, "README.md")
SETUP = "make demo"  # the set-up block: CI runs `make test` (.ci/run), `make demo` is the demo itself


def readme_blocks() -> list[tuple[str, str, str]]:
    """``(section heading, language, code)`` of every fenced block, in order (indented ones too)."""
    blocks, heading = [], ""
    text = open(README).read()
    for m in re.finditer(r"^(#+ [^\n]*)$|^( *)```(\w+)\n(.*?)^\2```", text, re.M | re.S):
        if m.group(1):
            heading = m.group(1).lstrip("# ")
        else:
            code = "\n".join(line[len(m.group(2)):] for line in m.group(4).splitlines())
            blocks.append((heading, m.group(3), code))
    return blocks


def _json_objects(text: str) -> list[dict]:
    dec, out, i = json.JSONDecoder(), [], 0
    while (i := text.find("{", i)) >= 0:
        try:
            obj, end = dec.raw_decode(text, i)
            out.append(obj)
            i = end
        except json.JSONDecodeError:
            i += 1
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    assert not os.path.abspath(d).startswith(ROOT)
    return d


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def test_readme_has_the_blocks_this_test_runs():
    blocks = readme_blocks()
    assert [lang for _, lang, _ in blocks].count("python") >= 3 and len(blocks) >= 10
    assert blocks[0][2].startswith(SETUP) and "make test" in open(os.path.join(ROOT, ".ci", "run")).read()
    assert {lang for _, lang, _ in blocks} <= {"python", "bash"}


def test_readme_python_blocks_run_as_written(workdir):
    code = "\n\n".join(c for _, lang, c in readme_blocks() if lang == "python")
    r = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=_env(), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]


def _run_bash(heading: str, code: str, workdir) -> tuple[str, str, str]:
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=workdir, env=_env(), capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, f"README block under '{heading}' failed:\n{code}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return heading, code, r.stdout


def bash_lanes() -> list[list[tuple[str, str]]]:
    """The bash blocks, ``(heading, code)``, in lanes that may run side by side: a block that reads
    fitted probes (``--probes``) runs after the block that fits them, in its lane; every other block
    is a lane of its own. Each block runs single-threaded, so two lanes at a time use two cores."""
    lanes, probe_lane = [], None
    for heading, lang, code in readme_blocks():
        if lang != "bash" or code.lstrip().startswith(SETUP):
            continue
        if "--probes" in code and probe_lane is not None:
            probe_lane.append((heading, code))
            continue
        lanes.append([(heading, code)])
        if "beliefscope probe " in code:
            probe_lane = lanes[-1]
    return sorted(lanes, key=len, reverse=True)  # the longest lane first


def test_readme_bash_lanes_keep_the_probe_blocks_in_order():
    lanes = bash_lanes()
    probe = next(lane for lane in lanes if any("beliefscope probe " in c for _, c in lane))
    assert "beliefscope probe " in probe[0][1] and all("--probes" in c for _, c in probe[1:]) and len(probe) >= 2
    assert not [c for lane in lanes if lane is not probe for _, c in lane if "--probes" in c]


def test_readme_bash_blocks_run_as_written(workdir):
    from concurrent.futures import ThreadPoolExecutor

    def run_lane(lane):
        return [_run_bash(heading, code, workdir) for heading, code in lane]

    with ThreadPoolExecutor(max_workers=2) as pool:
        ran = [block for lane in pool.map(run_lane, bash_lanes()) for block in lane]
    assert len(ran) >= 6
    # the numbers quoted beside the commands are what the commands print
    out = {code: _json_objects(stdout) for _, code, stdout in ran}
    steer = next(o for objs in out.values() for o in objs if "flip_rate" in o)
    quoted = re.search(r"flip_rate ([0-9.]+) along the probe direction; random directions of the same norm: mean "
                       r"([0-9.]+)", open(README).read())
    assert quoted, "the README's steering numbers moved: update this test's pattern"
    assert abs(steer["flip_rate"] - float(quoted.group(1))) <= 0.02, steer
    assert abs(steer["random"]["mean"] - float(quoted.group(2))) <= 0.02, steer["random"]
    thinking = next(o for objs in out.values() for o in objs if o.get("events") == "17-32" and "answer_accuracy" in o)
    assert thinking["answer_accuracy"] == 1.0  # quoted: "answer_accuracy 1.0"
    det = next(o for objs in out.values() for o in objs if "fast_path_unique_max" in o)
    assert det["verified_unique_max"] == 1
