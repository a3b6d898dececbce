# Two entry points for a fresh machine: `make demo` and `make test` (each sets up .venv first).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --no-cache-dir torch==2.13.0
	$(BIN)/pip install -q --no-cache-dir mindspore==2.10.0   # large (~1 GB); the MindSpore adapter and its tests need it
	$(BIN)/pip install -q --no-cache-dir -e '.[test]'
	touch $@

demo: setup
	$(BIN)/python examples/demo.py --out demo_out

test: setup
	sh scripts/ensure_chromium.sh
	$(BIN)/python -m pytest -q -n 2 --dist loadfile   # two workers; a test file stays on one (its module fixtures)

bench: setup
	$(BIN)/python benchmarks/dump_overhead.py

clean:
	rm -rf $(VENV) demo_out dump_path
