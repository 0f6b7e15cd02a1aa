"""The structural counts (`benchmarks/architecture.py`): each counter against a hand-written tree whose counts
are known, and a ratchet on this checkout, so what the architecture work removed does not come back unnoticed."""

from pathlib import Path

from beliefscope.benchmarks import architecture as arch

ROOT = Path(__file__).resolve().parent.parent

TREE = {
    "models/__init__.py": "",
    "models/profile.py": '''
def writes_thoughts(model):
    return False
''',
    "models/use.py": '''
import types
from transformer_lens.model_bridge.sources._bridge_builder import build
from .profile import writes_thoughts, model_profile


class Own:
    __slots__ = ("_slot",)

    def __init__(self):
        self._mine = 1

    def read(self, other):
        import os
        import json  # deferred: a reason
        return self._mine, other._mine, other._theirs, getattr(other, "_also_theirs"), other.__dict__.get("_x")


def branch(model, hf, fn):
    if writes_thoughts(model) or model_profile("x").thinking:
        from ..cache.kv import KVCache  # a lazy project import
    hf.__class__ = object
    hf.__dict__["_stash"] = 1
    hf._beliefscope_mark = True
    hf.generate = types.MethodType(fn, hf)
    return fn.__closure__[0].cell_contents
''',
    "models/cli.py": '''
def main():
    from .use import branch  # CLI start-up
''',
    "models/dispatch.py": '''from functools import singledispatch
from .thinking import ThinkingStates


@singledispatch
def read(model):
    return 0


@read.register(ThinkingStates)
def _(model):
    return 1


read.register(m.ThinkingStates, lambda model: 2)
read.register(int, lambda model: 3)
''',
    "cache/__init__.py": "",
    "cache/kv.py": '''
from transformers import Cache


class Mixin:
    def update(self):
        pass

    def _private(self):
        pass


class KVCache(Mixin, Cache):
    size = 0

    def rollback(self, to):
        pass

    def __getattr__(self, name):
        if name in NAMES:
            return 1
        if name == "summary":
            return 2


class SlotCache(Cache):
    pass


class Writer:
    def update(self):
        pass

    def get_seq_length(self):
        return 0


class Layer(CacheLayerMixin):
    def update(self):
        pass

    def get_seq_length(self):
        return 0


NAMES = frozenset({"events", "rejected"})
''',
    "decoding/__init__.py": "",
    "decoding/engine.py": "def run(cache):\n    cache.rollback(0)\n",
    "decoding/policy.py": ("from ..cache.kv import KVCache\nfrom beliefscope.models.use import branch\n"
                           "from . import engine\ndef commit(cache):\n    cache.rollback(0)\n    cache.crop(1)\n"),
}


def _tree(tmp_path: Path) -> Path:
    for name, text in TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_each_counter_on_a_tree_whose_counts_are_known(tmp_path):
    found = arch.counts(_tree(tmp_path))
    assert [s.split(" ", 1)[1] for s in found["model_type_branches"]] == ["writes_thoughts", "model_profile().thinking"]
    assert [s.split(":")[1] for s in found["thinking_overloads"]] == ["10 read", "15 read"]  # not int's
    cut = found["surgery"]
    # other._mine is ours (Own defines it), other._theirs, "_also_theirs" and "_x" are not; "_stash" is the
    # __dict__ write's key, counted as a write
    assert sorted(s.split(" ", 1)[1] for s in cut["private attribute"]) == ["'_also_theirs'", "'_stash'", "'_x'",
                                                                          "._theirs"]
    private_modules = [s.split(" ", 1)[1] for s in cut["private module"]]
    assert private_modules == ["transformer_lens.model_bridge.sources._bridge_builder"]
    assert len(cut["class swap"]) == len(cut["__dict__ write"]) == len(cut["method replaced"]) == 1
    assert len(cut["closure read"]) == 2  # __closure__ and cell_contents
    assert found["stashed_attributes"] == ["_beliefscope_mark"]
    assert found["cache_classes"] == ["KVCache", "SlotCache", "Writer"]  # Layer is one layer of a cache
    assert [s.split(" ", 1)[1] for s in found["rollback_sites_outside_engine"]] == [".rollback", ".crop"]
    assert found["kvcache_public_names"] == {"own": ["rollback", "size", "update"],
                                             "forwarded": ["events", "rejected", "summary"]}
    lazy = found["lazy_project_imports"]
    assert len(lazy) == 2 and sum(not arch._command_module(s.split(":")[0]) for s in lazy) == 1
    assert found["cross_package_imports"] == {"relative": 1, "absolute": 1}  # `from . import engine`: its own
    assert [len(found["lazy_other_imports"][k]) for k in ("said", "unsaid")] == [1, 1]  # json said, os not
    assert found["lines"] == sum(len(t.splitlines()) for n, t in TREE.items())


def test_the_checkout_keeps_what_the_architecture_work_removed():
    """A ratchet: none of these may grow back (lower them as the work goes on)."""
    found = arch.counts(ROOT)
    assert not found["surgery"]["private module"], found["surgery"]["private module"]
    assert found["stashed_attributes"] == ["_beliefscope_cache_guard"]  # the guard mark (see cache/guard.py)
    assert not found["kvcache_public_names"]["forwarded"], "KVCache forwards names again"
    assert [s for s in found["lazy_project_imports"] if not arch._command_module(s.split(":")[0])] == \
        [s for s in found["lazy_project_imports"] if s.startswith("probes/__init__.py:")]  # its deferred sklearn API
    assert not found["lazy_other_imports"]["unsaid"], "a function-level import without '# deferred: <reason>'"
    assert found["cross_package_imports"].get("absolute", 0) <= 11  # beliefscope/ itself, above the folders
    assert sum(map(len, found["surgery"].values())) <= 13
    assert not found["surgery"]["class swap"] and not found["surgery"]["__dict__ write"], found["surgery"]
    assert not found["surgery"]["closure read"], found["surgery"]["closure read"]
    assert len(found["model_type_branches"]) <= 3 and found["cache_classes"] == ["KVCache"]
    assert len(found["rollback_sites_outside_engine"]) <= 2  # the cache benchmark's: rollback itself, HF's crop
    private = {s.split(":")[0] for s in found["surgery"]["private attribute"]}
    assert private <= {"models/internals.py", "models/packed.py", "beliefscope/cli.py"}, private
