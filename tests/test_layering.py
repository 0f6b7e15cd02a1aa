"""Layering, read from the source with ast: data flows base -> tasks -> hooks -> cache -> models ->
decoding / probes -> analyses -> benchmarks, with the API and the command line (beliefscope/) on top
(hooks sit below models, so a model's own hook points are attached with `hooks.capture.hooked`; the
cache sits below models, built from shapes: it reads a model's shapes through the guard `load_model`
installs, and never installs it).

Every import counts, at module level or inside a function (a lazy import is still a dependency),
and so does ``importlib.import_module("beliefscope.x")`` with a literal name. No package imports a
package above it. ``beliefscope.base`` (atomic writes, the progress bar, flags from a config) sits below
every package and imports none; ``beliefscope.models.profile`` (model shapes and profile) is usable by
every package at or above models.
No module imports a module that (directly or not) imports it back, in any package, counting imports
read by type checkers only: a type-only cycle still ties two modules together. tests/ may import anything.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RANK = {"base": -1, "tasks": 0, "hooks": 1, "cache": 2, "models": 3, "decoding": 4, "probes": 4, "analyses": 5,
        "benchmarks": 6, "cli": 7}
# module -> lowest rank allowed to use it
ANYONE = {"beliefscope.models.profile": 3}

# Imports that break the rule today, in code another package owns: (file, imported package, why).
# Each must still exist (test_known_exceptions_still_exist), so fixing one means deleting its line.
KNOWN: dict = {}


def library_files() -> dict[str, Path]:
    """module name -> file, for every module of the installed package and benchmarks/."""
    out = {}
    for pkg in RANK:
        if pkg in ("cli", "base"):  # both live in beliefscope/, read below
            continue
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = f.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
            out[".".join(["beliefscope", *parts])] = f
    for f in sorted((ROOT / "beliefscope").rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports_of(path: Path, rel: Path | None = None, type_checking: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative ones resolved; those under
    ``if TYPE_CHECKING:`` (read by type checkers only) too when ``type_checking``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if (not type_checking and isinstance(node, ast.If)
                and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"):
            node.body = []
    rel = (rel or path.relative_to(ROOT)).with_suffix("")
    package = ["beliefscope", *rel.parts[:-1]] if rel.parts[0] != "beliefscope" else list(rel.parts[:-1])
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]  # `from pkg import module`
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            out.append((node.lineno, str(node.args[0].value)))
    return out


def package_of(module: str) -> str | None:
    """The layer a module belongs to (``beliefscope.cache.kv`` -> cache; bare ``cache`` too)."""
    parts = module.split(".")
    if parts[0] != "beliefscope" or len(parts) == 1:
        return None  # the root package only maps names lazily: `from beliefscope import hooks` is hooks
    if parts[1] == "__main__":
        return "cli"
    if parts[1] == "base":
        return "base"
    return parts[1] if parts[1] in RANK else None


def rank_of_file(rel: Path) -> int:
    top = rel.parts[0]
    if top == "beliefscope":
        return RANK["base"] if rel.parts[1] == "base" else RANK["cli"]
    return RANK[top]


def file_violations(path: Path, rel: Path) -> list[tuple[str, int, str, str]]:
    """Upward imports of one file; ``rel`` is its path relative to the repository root."""
    me = rank_of_file(rel)
    found = []
    for line, imp in imports_of(path, rel):
        if imp.split(".")[0] in ("tasks", "models", "hooks", "cache", "decoding", "probes", "analyses",
                                 "benchmarks", "tests"):
            found.append((str(rel), line, imp, "bare top-level name (not installed)"))
            continue
        if imp.startswith("beliefscope.tests"):
            found.append((str(rel), line, imp, "tests/ is not part of the package"))
            continue
        allowed = next((r for m, r in ANYONE.items() if imp == m or imp.startswith(m + ".")), None)
        if allowed is not None:
            if me < allowed:
                found.append((str(rel), line, imp, f"{imp} is above rank {me}"))
            continue
        target = package_of(imp)
        if target is not None and RANK[target] > me:
            found.append((str(rel), line, imp, f"{target} is above this package"))
    return found


def violations() -> list[tuple[str, int, str, str]]:
    return [v for path in library_files().values() for v in file_violations(path, path.relative_to(ROOT))]


def test_no_package_imports_one_above_it():
    bad = [v for v in violations() if (v[0], package_of(v[2]) or "") not in KNOWN]
    assert not bad, "imports against the data flow:\n" + "\n".join(f"  {f}:{n} imports {m} ({why})"
                                                                   for f, n, m, why in bad)


def test_known_exceptions_still_exist():
    seen = {(f, package_of(m) or "") for f, _, m, _ in violations()}
    stale = [k for k in KNOWN if k not in seen]
    assert not stale, f"fixed, delete from KNOWN: {stale}"


# Every package is held free of import cycles between its modules (lazy and type-only imports included).
CYCLE_FREE = tuple(RANK)


def test_no_import_cycles_between_modules():
    files = {m: p for m, p in library_files().items() if package_of(m) in CYCLE_FREE}
    graph = {m: set() for m in files}
    for module, path in files.items():
        for _, imp in imports_of(path, type_checking=True):
            while imp and imp not in files:
                imp = imp.rpartition(".")[0]  # `from pkg.mod import name` -> pkg.mod
            if imp and imp != module and not module.startswith(imp + "."):
                graph[module].add(imp)  # a package __init__ importing its own modules is not a cycle
    index, low, on_stack, stack, cycles, counter = {}, {}, set(), [], [], [0]

    def strongconnect(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            strongconnect(v)
    assert not cycles, f"import cycles: {cycles}"


def test_probes_cli_and_harvest_do_not_import_each_other_both_ways():
    files = library_files()
    cli = {imp for _, imp in imports_of(files["beliefscope.probes.cli"])}
    harvest = {imp for _, imp in imports_of(files["beliefscope.probes.harvest"])}
    assert any(i.startswith("beliefscope.probes.harvest") for i in cli)
    assert not any(i.startswith("beliefscope.probes.cli") for i in harvest)


@pytest.mark.parametrize("source", [
    "from beliefscope.analyses.common import progress_bar\n",
    "import importlib\nimportlib.import_module('beliefscope.benchmarks.cli')\n",
    "def f():\n    from ..decoding import speculative\n",
    "import models.load\n",
])
def test_the_checker_sees_upward_imports(tmp_path, source):
    """The rule can fail: an upward import written four ways, in a module placed in cache/."""
    fake = tmp_path / "fake.py"
    fake.write_text(source)
    assert file_violations(fake, Path("cache/fake.py")), f"not seen: {source!r}"
    assert not file_violations(fake, Path("benchmarks/fake.py")) or source.startswith("import models")
