"""Structural counts of a checkout, read from its source alone (nothing is imported or run).

``python -m beliefscope.benchmarks.architecture [--root DIR] [--json]`` measures the tree at ``DIR`` (default:
this checkout), so the same script counts an older commit checked out elsewhere (``git worktree add``). The
counts are the ones the architecture review asks for:

- **branch sites on the model type**: calls of ``writes_thoughts(...)``, reads of ``model_profile(...).thinking``
  and ``isinstance(..., ThinkingStates)`` outside the module that defines them; and, counted apart, the overloads
  that replaced such branches: ``f.register(ThinkingStates ...)`` of a ``functools.singledispatch`` function, where
  the caller no longer asks which kind it holds and the Thinking States case sits in one registered function;
- **third-party surgery**: reads or writes of an underscore attribute that no module of the project defines
  (another library's private member), imports from another library's underscore module, assignments to
  ``__class__``, writes into an object's ``__dict__``, reads of closures (``__closure__``, ``cell_contents``),
  and methods assigned onto an instance (``x.name = types.MethodType(...)``);
- **stashed attributes**: distinct ``_beliefscope_*`` attribute names put on objects;
- **cache classes**: classes that hold keys and values (they derive from transformers' ``Cache``, or serve its
  ``update`` and ``get_seq_length`` without being one layer of a cache);
- **rollback sites outside the engine**: calls of ``.rollback(``, ``.crop(`` and ``.truncate_to(`` in files
  other than ``decoding/engine.py`` and the cache package that defines them;
- **KVCache public names**: the public methods, properties and class attributes of ``KVCache`` and its mixins
  (the project's own classes it derives from), plus the names a ``__getattr__`` forwards;
- **lazy project imports**: import statements of project modules inside a function, and those of them outside
  the command modules (``cli.py``, ``commands.py``: CLI start-up, which the review allows); and function-level
  imports of other modules outside the command modules, with those that say why (``# deferred: reason``);
- **lines**: every ``.py`` file of the installed packages and the benchmarks (tests and docs excluded).
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

PACKAGES = ("beliefscope", "tasks", "models", "hooks", "cache", "decoding", "probes", "analyses", "checkpoints",
            "benchmarks")  # the folders counted (the installed packages, plus the benchmarks)
ROLLBACK_CALLS = ("rollback", "crop", "truncate_to")  # cache methods that drop positions
ENGINE_FILES = ("decoding/engine.py",)  # where a rollback belongs
COMMAND_MODULES = ("cli.py", "commands.py")  # files that register commands
SURGERY_DUNDERS = ("__closure__", "cell_contents")  # reading another function's closure


def python_files(root: Path) -> list[Path]:
    """Every ``.py`` file under the counted folders of ``root``."""
    return sorted(p for pkg in PACKAGES if (root / pkg).is_dir() for p in (root / pkg).rglob("*.py")
                  if "__pycache__" not in p.parts)


def parse_all(root: Path) -> dict[str, ast.Module]:
    """``{relative path: module AST}``."""
    return {str(p.relative_to(root)): ast.parse(p.read_text(), filename=str(p)) for p in python_files(root)}


def _own_private_names(trees: dict[str, ast.Module]) -> set[str]:
    """Underscore names the project defines: functions, classes, assigned attributes and names, parameters and
    ``__slots__`` entries."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif (isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__slots__" for t in node.targets)
                  and isinstance(node.value, (ast.Tuple, ast.List))):
                names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return {n for n in names if n.startswith("_")}


def _named_by_string(node: ast.AST) -> str | None:
    """The attribute a string names where the code reaches an attribute by its name: ``getattr(x, "_a")`` (and
    set/has/del), ``x.__dict__["_a"]``, ``x.__dict__.get("_a")``, ``x._modules["_a"]``, ``"_a" in x.__dict__``."""
    def by_name(expr) -> bool:  # another object's namespace (an object's own ``self.__dict__`` is its own)
        return (isinstance(expr, ast.Attribute) and expr.attr in ("__dict__", "_modules")
                and not (isinstance(expr.value, ast.Name) and expr.value.id in ("self", "cls")))

    arg = None
    if isinstance(node, ast.Call):
        name = _call_name(node)
        if name in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2:
            arg = node.args[1]
        elif name in ("get", "pop", "setdefault") and isinstance(node.func, ast.Attribute) and by_name(
                node.func.value) and node.args:
            arg = node.args[0]
    elif isinstance(node, ast.Subscript) and by_name(node.value):
        arg = node.slice
    elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) and by_name(
            node.comparators[0]):
        arg = node.left
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def _is_private(name: str) -> bool:
    """Another object's private name (ours stashed on it, ``_beliefscope_*``, are counted as stashes instead)."""
    return (name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            and not name.startswith("_beliefscope_"))


def surgery(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Every place the project reaches into another library's objects, by kind: ``"private attribute"``,
    ``"private module"``, ``"class swap"``, ``"__dict__ write"``, ``"closure read"``, ``"method replaced"``."""
    own = _own_private_names(trees)
    found: dict[str, list[str]] = {k: [] for k in ("private attribute", "private module", "class swap",
                                                   "__dict__ write", "closure read", "method replaced")}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            where = f"{path}:{getattr(node, 'lineno', 0)}"
            named = _named_by_string(node)
            if named is not None and _is_private(named) and named not in own:
                found["private attribute"].append(f"{where} {named!r}")
            if isinstance(node, ast.Attribute):
                if _is_private(node.attr) and node.attr not in own and not (
                        isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found["private attribute"].append(f"{where} .{node.attr}")
                if node.attr in SURGERY_DUNDERS:
                    found["closure read"].append(f"{where} .{node.attr}")
                if node.attr == "__class__" and isinstance(node.ctx, ast.Store):
                    found["class swap"].append(where)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if any(_is_private(part) for part in node.module.split(".")[1:]):
                    found["private module"].append(f"{where} {node.module}")
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
                            and target.value.attr == "__dict__"
                            and not (isinstance(target.value.value, ast.Name) and target.value.value.id == "self")):
                        found["__dict__ write"].append(where)
                    if (isinstance(target, ast.Attribute) and isinstance(node.value, ast.Call)
                            and _call_name(node.value) == "MethodType"):
                        found["method replaced"].append(f"{where} .{target.attr}")
    return found


def _call_name(call: ast.Call) -> str:
    fn = call.func
    return fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""


def stashed_attributes(trees: dict[str, ast.Module]) -> list[str]:
    """Distinct ``_beliefscope_*`` names the project puts on objects (attributes or ``setattr`` names)."""
    names = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_beliefscope_"):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(
                    "_beliefscope_") and node.value.isidentifier() and len(node.value) > len("_beliefscope_"):
                names.add(node.value)
    return sorted(names)


def model_type_branches(trees: dict[str, ast.Module]) -> list[str]:
    """Places that ask which kind of model they hold (see the module doc)."""
    sites = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            where = f"{path}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and _call_name(node) == "writes_thoughts":
                sites.append(f"{where} writes_thoughts")
            elif (isinstance(node, ast.Attribute) and node.attr == "thinking" and isinstance(node.value, ast.Call)
                  and _call_name(node.value) == "model_profile"):
                sites.append(f"{where} model_profile().thinking")
            elif (isinstance(node, ast.Call) and _call_name(node) == "isinstance" and len(node.args) == 2
                  and "ThinkingStates" in ast.unparse(node.args[1])):
                sites.append(f"{where} isinstance ThinkingStates")
    return sites


def thinking_overloads(trees: dict[str, ast.Module]) -> list[str]:
    """``singledispatch`` registrations for ``ThinkingStates`` (``@f.register(ThinkingStates)`` or
    ``f.register(ThinkingStates, g)``): where a model-type branch became an overload."""
    sites = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register"
                    and node.args and ast.unparse(node.args[0]).endswith("ThinkingStates")):
                sites.append(f"{path}:{node.lineno} {ast.unparse(node.func.value)}")
    return sites


def _methods(cls: ast.ClassDef) -> set[str]:
    return {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _classes(trees: dict[str, ast.Module]) -> dict[str, ast.ClassDef]:
    return {node.name: node for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def cache_classes(trees: dict[str, ast.Module]) -> list[str]:
    """Classes that hold a model's keys and values: those deriving from transformers' ``Cache`` (directly or
    through a project class), and those that serve its protocol (``update`` and ``get_seq_length``) without
    being one layer of a cache (``CacheLayerMixin``)."""
    classes = _classes(trees)

    def ancestry(name: str, seen=()) -> set[str]:
        cls = classes.get(name)
        if cls is None or name in seen:
            return set()
        bases = {ast.unparse(b).split(".")[-1] for b in cls.bases}
        return bases.union(*(ancestry(b, (*seen, name)) for b in bases))

    return sorted(name for name, cls in classes.items()
                  if "Cache" in ancestry(name) or ({"update", "get_seq_length"} <= _methods(cls)
                                                   and "CacheLayerMixin" not in ancestry(name)))


def rollback_sites(trees: dict[str, ast.Module]) -> list[str]:
    """Calls that drop cache positions, outside the engine and the cache package."""
    sites = []
    for path, tree in trees.items():
        if path in ENGINE_FILES or path.startswith("cache/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ROLLBACK_CALLS:
                sites.append(f"{path}:{node.lineno} .{node.func.attr}")
    return sites


def kvcache_public_names(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """``{"own": [...], "forwarded": [...]}``: KVCache's public names from its project classes, and what its
    ``__getattr__`` forwards (the string names it tests, and the members of a frozenset it tests against)."""
    classes = _classes(trees)
    if "KVCache" not in classes:
        return {"own": [], "forwarded": []}
    own: set[str] = set()
    forwarded: set[str] = set()
    frozensets = {t.id: {e.value for e in v.args[0].elts} for tree in trees.values() for node in tree.body
                  if isinstance(node, ast.Assign) and isinstance(v := node.value, ast.Call)
                  and _call_name(v) == "frozenset" and v.args and isinstance(v.args[0], (ast.Set, ast.Tuple, ast.List))
                  for t in node.targets if isinstance(t, ast.Name)}
    todo = ["KVCache"]
    while todo:
        cls = classes.get(todo.pop())
        if cls is None:
            continue
        todo += [ast.unparse(b).split(".")[-1] for b in cls.bases]
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not node.name.startswith("_"):
                    own.add(node.name)
                elif node.name == "__getattr__":
                    for sub in ast.walk(node):
                        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value.isidentifier():
                            forwarded.add(sub.value)
                        elif isinstance(sub, ast.Name) and sub.id in frozensets:
                            forwarded |= frozensets[sub.id]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                own |= {t.id for t in targets if isinstance(t, ast.Name) and not t.id.startswith("_")}
    return {"own": sorted(own), "forwarded": sorted(forwarded - own)}


def beyond_hf_cache(names: list[str]) -> list[str]:
    """The names transformers' own ``Cache`` does not define (the one import of this module: the installed
    transformers, which every checkout counted runs on)."""
    from transformers import Cache  # deferred: the counts of the other rows read source alone

    return sorted(set(names) - {n for n in dir(Cache) if not n.startswith("_")})


def _is_project_import(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "beliefscope"
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "beliefscope" for a in node.names)
    return False


def _command_module(path: str) -> bool:
    """Whether ``path`` is a command module (its function-level imports are CLI start-up)."""
    return path.rsplit("/", 1)[-1] in COMMAND_MODULES


def lazy_imports(trees: dict[str, ast.Module]) -> list[str]:
    """Project imports inside a function body."""
    sites = []
    for path, tree in trees.items():
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                sites += [f"{path}:{n.lineno}" for n in ast.walk(fn) if _is_project_import(n)]
    return sorted(set(sites))


def lazy_other_imports(root: Path, trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Function-level imports of other modules outside the command modules: ``{"said": [...], "unsaid": [...]}``,
    where a said one carries a ``# deferred: <reason>`` comment (an optional dependency, or a slow import that only
    some calls need)."""
    out: dict[str, list[str]] = {"said": [], "unsaid": []}
    for path, tree in trees.items():
        if _command_module(path):
            continue
        lines = (root / path).read_text().splitlines()
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for n in ast.walk(fn):
                if isinstance(n, (ast.Import, ast.ImportFrom)) and not _is_project_import(n):
                    said = "# deferred:" in lines[n.end_lineno - 1]
                    out["said" if said else "unsaid"].append(f"{path}:{n.lineno}")
    return {k: sorted(set(v)) for k, v in out.items()}


def cross_package_imports(trees: dict[str, ast.Module]) -> Counter:
    """Top-of-module imports of another top-level package, by how they are written: ``"relative"`` (``from ..cache
    import KVCache``: a static tool follows them without an install) or ``"absolute"`` (``beliefscope.<package>``,
    which only the install maps to its folder). Imports of ``beliefscope.base`` (which lives in ``beliefscope/``)
    are not counted."""
    kinds: Counter = Counter()
    for path, tree in trees.items():
        here = path.split("/")[:-1]  # the file's package, as folders
        for node in tree.body:
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level > 0:
                if node.level - 1 > len(here):
                    continue  # above the checkout's root: not a package of ours
                target = (here[: len(here) - (node.level - 1)] + (node.module or "").split("."))[0]
                if target != here[0]:
                    kinds["relative"] += 1
            elif (node.module or "").startswith("beliefscope.") and node.module.split(".")[1] not in (here[0], "base"):
                kinds["absolute"] += 1
    return kinds


def counts(root: Path) -> dict:
    """Every count of the module doc for the tree at ``root``."""
    trees = parse_all(root)
    cut = surgery(trees)
    names = kvcache_public_names(trees)
    return {
        "model_type_branches": model_type_branches(trees),
        "thinking_overloads": thinking_overloads(trees),
        "surgery": cut,
        "stashed_attributes": stashed_attributes(trees),
        "cache_classes": cache_classes(trees),
        "rollback_sites_outside_engine": rollback_sites(trees),
        "kvcache_public_names": names,
        "lazy_project_imports": lazy_imports(trees),
        "lazy_other_imports": lazy_other_imports(root, trees),
        "cross_package_imports": dict(cross_package_imports(trees)),
        "lines": sum(len(p.read_text().splitlines()) for p in python_files(root)),
    }


def summary(found: dict) -> dict:
    """The counts alone (each list replaced by its length)."""
    return {
        "model-type branch sites": len(found["model_type_branches"]),
        "  Thinking States overloads (singledispatch)": len(found.get("thinking_overloads", ())),
        "third-party surgery sites": sum(map(len, found["surgery"].values())),
        **{f"  {k}": len(v) for k, v in found["surgery"].items()},
        "stashed _beliefscope_ attributes": len(found["stashed_attributes"]),
        "cache classes": len(found["cache_classes"]),
        "rollback sites outside the engine": len(found["rollback_sites_outside_engine"]),
        "KVCache public names (own + forwarded)": len(found["kvcache_public_names"]["own"])
        + len(found["kvcache_public_names"]["forwarded"]),
        "  beyond transformers' Cache": len(beyond_hf_cache(found["kvcache_public_names"]["own"]))
        + len(found["kvcache_public_names"]["forwarded"]),
        "lazy project imports": len(found["lazy_project_imports"]),
        "  outside the command modules": sum(not _command_module(site.split(":")[0])
                                             for site in found["lazy_project_imports"]),
        "other lazy imports (outside command modules)": sum(map(len, found["lazy_other_imports"].values())),
        "  said where (# deferred: reason)": len(found["lazy_other_imports"]["said"]),
        "cross-package imports, absolute": found["cross_package_imports"].get("absolute", 0),
        "cross-package imports, relative": found["cross_package_imports"].get("relative", 0),
        "lines": found["lines"],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout to count (default: this one)")
    parser.add_argument("--json", action="store_true", help="every site, as JSON")
    args = parser.parse_args(argv)
    found = counts(args.root)
    if args.json:
        print(json.dumps(found, indent=1))
        return
    for key, value in summary(found).items():
        print(f"{key:45s} {value}")


if __name__ == "__main__":
    main()
