"""Write every generated page of the documentation site: ``python docs/scripts/generate.py``.

The Reference pages come from reference.py; the Results pages from results.py, where that module
exists. The pages are committed: run this after changing a docstring, a config field's comment, a
command's flags or a result, then ``make docs`` (tests/test_docs_site.py checks they are current).
``--out DIR`` writes under DIR instead of docs/ (the tests compare the two); ``--only reference``
writes the Reference pages alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent


def _script(name: str):
    """The module docs/scripts/<name>.py, or None where that file does not exist (yet)."""
    path = HERE / f"{name}.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"beliefscope_docs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def generate(docs_dir: Path, only: str | None = None) -> list[str]:
    """Write the pages of each generator under ``docs_dir``; returns the generators that ran."""
    ran = []
    for name in ("reference", "results"):
        module = None if only not in (None, name) else _script(name)
        if module is not None:
            module.write_pages(docs_dir)
            if name == "results" and docs_dir.resolve() == DOCS.resolve():
                module.write_readme()  # the README's headline table (only for the checkout's own docs)
            ran.append(name)
    return ran


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS, help="docs folder to write into (default: docs/)")
    parser.add_argument("--only", choices=["reference", "results"], help="run one generator")
    args = parser.parse_args(argv)
    ran = generate(args.out, args.only)
    print(f"generated the {' and '.join(ran)} pages under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
