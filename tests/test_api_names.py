"""``import beliefscope as bs``: every lazily mapped name is also imported under TYPE_CHECKING, from
the module the lazy map names, so type checkers and "go to definition" find it."""

import ast
from pathlib import Path

import beliefscope


def test_type_checking_imports_cover_the_lazy_api():
    tree = ast.parse(Path(beliefscope.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen = {}
    for node in block.body:
        for alias in node.names:
            seen[alias.name] = node.module
    for name, module in beliefscope._API.items():
        assert name in seen, f"bs.{name} has no TYPE_CHECKING import"
        assert module.startswith(seen[name]) or seen[name].startswith(module.rsplit(".", 1)[0]), (name, seen[name])
        assert getattr(beliefscope, name) is not None
    assert set(beliefscope._SUBPACKAGES) <= set(seen)
