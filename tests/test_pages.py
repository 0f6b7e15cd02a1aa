"""Every code block of README.md and of the documentation pages runs as written, from a temporary
folder outside the repository.

The pages are README.md, then every page of the site's nav (mkdocs.yml) in nav order, less the
generated Reference and Results pages. ```python blocks of one page run in order in one interpreter
(a later block uses what an earlier one defined); ```bash blocks of every page run in one shared
folder, two lanes at a time (the analyses that read the probes a probe block fitted run after it, in
its lane); ```text blocks are output and do not run. The set-up block (`make demo` / `make test`) is
what CI itself runs. Numbers the pages quote next to a command are checked against its output.

``beliefscope`` commands and python blocks run in forks of one pre-imported interpreter
(tests/forked_cli.py): the same ``main`` with the same arguments, folder and environment, without some
forty fresh imports of torch, transformers and TransformerLens.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from . import forked_cli
from .helpers import ROOT

pytestmark = pytest.mark.slow
README = os.path.join(ROOT, "README.md")
SETUP = "make demo"  # the set-up block: CI runs `make test` (.ci/run), `make demo` is the demo itself
GENERATED = ("reference/", "results/")  # pages written by docs/scripts/generate.py: no blocks to run
RUNS = ("python", "bash")  # the languages that run; ```text (and others listed in OUTPUT) are shown only
OUTPUT = ("text", "console", "json", "yaml", "toml", "html")


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def pages() -> list[str]:
    """README.md, then the site's hand-written pages in nav order (absolute paths)."""
    import yaml

    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        cfg = yaml.safe_load(f)
    docs = os.path.join(ROOT, cfg.get("docs_dir", "docs"))
    return [README] + [os.path.join(docs, p) for p in _nav_pages(cfg["nav"]) if not p.startswith(GENERATED)]


def page_blocks(path: str) -> list[tuple[str, str, str]]:
    """``(section heading, language, code)`` of every fenced block of one page, in order (indented ones too)."""
    blocks, heading = [], ""
    if not os.path.exists(path):
        return blocks
    text = open(path).read()
    for m in re.finditer(r"^(#+ [^\n]*)$|^( *)```(\w+)\n(.*?)^\2```", text, re.M | re.S):
        if m.group(1):
            heading = m.group(1).lstrip("# ")
        else:
            code = "\n".join(line[len(m.group(2)):] for line in m.group(4).splitlines())
            blocks.append((f"{os.path.relpath(path, ROOT)}: {heading}", m.group(3), code))
    return blocks


def readme_blocks() -> list[tuple[str, str, str]]:
    """The blocks of README.md."""
    return page_blocks(README)


def all_blocks() -> list[tuple[str, str, str]]:
    """The blocks of every page, README first."""
    return [b for p in pages() for b in page_blocks(p)]


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
    d = tmp_path_factory.mktemp("pages")
    assert not os.path.abspath(d).startswith(ROOT)
    return d


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    """The environment the blocks run in: `forked_cli`'s server started, its ``beliefscope`` first on PATH."""
    d = tmp_path_factory.mktemp("forked")
    env = _env()
    env[forked_cli.SOCKET] = str(d / "socket")
    server = subprocess.Popen([sys.executable, forked_cli.__file__, "--serve", env[forked_cli.SOCKET]], env=env,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert server.stdout.readline().strip() == "ready", "the forked command line did not start"
        env["PATH"] = forked_cli.shim(str(d / "bin")) + os.pathsep + env["PATH"]
        yield env
    finally:
        os.killpg(server.pid, 9)  # the server and any command still running
        server.wait()


def test_pages_have_the_blocks_this_test_runs():
    blocks = readme_blocks()
    assert blocks[0][2].startswith(SETUP) and "make test" in open(os.path.join(ROOT, ".ci", "run")).read()
    assert [lang for _, lang, _ in all_blocks()].count("python") >= 3 and len(all_blocks()) >= 10
    unknown = {(h, lang) for h, lang, _ in all_blocks() if lang not in RUNS + OUTPUT}
    assert not unknown, f"blocks in a language that neither runs nor is listed as output: {unknown}"
    missing = [os.path.relpath(p, ROOT) for p in pages() if not os.path.exists(p)]
    assert not missing, f"pages in mkdocs.yml's nav that do not exist: {missing}"


@pytest.mark.parametrize("page", [os.path.relpath(p, ROOT) for p in pages()])
def test_python_blocks_run_as_written(page, tmp_path, forked):
    code = "\n\n".join(c for _, lang, c in page_blocks(os.path.join(ROOT, page)) if lang == "python")
    if not code:
        pytest.skip(f"{page} has no python block")
    assert not os.path.abspath(tmp_path).startswith(ROOT)
    r = subprocess.run([sys.executable, "-S", forked_cli.__file__, "-c", code], cwd=tmp_path, env=forked,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{page}:\n{r.stderr[-3000:]}"


def _run_bash(heading: str, code: str, workdir, env) -> tuple[str, str, str]:
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=workdir, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, f"block under '{heading}' failed:\n{code}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return heading, code, r.stdout


def bash_lanes() -> list[list[tuple[str, str]]]:
    """The bash blocks, ``(heading, code)``, in lanes that may run side by side: a block that fits probes
    (``beliefscope probe``) starts a lane, and a block that only reads fitted probes (``--probes``) runs
    after the latest such block, in its lane; every other block is a lane of its own. Each block runs
    single-threaded, so two lanes at a time use two cores."""
    lanes, probe_lane = [], None
    for heading, lang, code in all_blocks():
        if lang != "bash" or code.lstrip().startswith(SETUP):
            continue
        fits = "beliefscope probe " in code
        if "--probes" in code and not fits and probe_lane is not None:
            probe_lane.append((heading, code))
            continue
        lanes.append([(heading, code)])
        if fits:
            probe_lane = lanes[-1]
    return sorted(lanes, key=len, reverse=True)  # the longest lane first


def test_bash_lanes_keep_the_probe_blocks_in_order():
    lanes = bash_lanes()
    fits = lambda c: "beliefscope probe " in c
    readers = [lane for lane in lanes if any("--probes" in c and not fits(c) for _, c in lane)]
    assert readers, "no block reads fitted probes: the lane rule is untested"
    for lane in lanes:
        for i, (_, code) in enumerate(lane):
            if "--probes" in code and not fits(code):  # a reader runs after a block of its lane that fits probes
                assert any(fits(c) for _, c in lane[:i]), lane
        assert all(fits(c) or "--probes" in c for _, c in lane[1:])


def test_bash_blocks_run_as_written(workdir, forked):
    from concurrent.futures import ThreadPoolExecutor

    def run_lane(lane):
        return [_run_bash(heading, code, workdir, forked) for heading, code in lane]

    with ThreadPoolExecutor(max_workers=2) as pool:
        ran = [block for lane in pool.map(run_lane, bash_lanes()) for block in lane]
    assert len(ran) >= 6
    # the numbers quoted beside the commands are what the commands print
    out = {code: _json_objects(stdout) for _, code, stdout in ran}
    steer = next(o for objs in out.values() for o in objs if "flip_rate" in o)
    text = "\n".join(open(p).read() for p in pages() if os.path.exists(p))
    quoted = re.search(r"flip_rate ([0-9.]+) along the probe direction \(([0-9.]+) on another CPU\); random directions "
                       r"of the same norm: mean ([0-9.]+)", text)
    assert quoted, "the pages' steering numbers moved: update this test's pattern"
    # the layer-3 direction moves with ~1e-6 changes in the activations (the page's warning): the two CPUs we
    # measured give the two quoted rates, and any other rate is a change to explain
    assert min(abs(steer["flip_rate"] - float(quoted.group(i))) for i in (1, 2)) <= 0.02, steer
    assert abs(steer["random"]["mean"] - float(quoted.group(3))) <= 0.02, steer["random"]
    thinking = next(o for objs in out.values() for o in objs if o.get("events") == "33-64" and "answer_accuracy" in o)
    assert thinking["answer_accuracy"] == thinking["thought_accuracy"] == 1.0  # quoted: "answer_accuracy 1.0, ..."
    det = next(o for objs in out.values() for o in objs if "fast_path_unique_max" in o)
    assert det["verified_unique_max"] == 1
