# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test lint typecheck proto bench clean

venv: $(STAMP)

# The CPU wheel of torch 2.13.0 lies on this machine's disk; installing it first keeps pip
# from resolving `torch` to a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[server,torch,dev]"
	touch $(STAMP)

demo: venv
	$(VENV)/bin/smon demo

test: venv
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: venv
	$(PY) -m mypy

# Regenerate the committed gRPC code from agent/smon/v1/ingest.proto.
proto: venv
	$(PY) -m grpc_tools.protoc -I agent --python_out=agent --pyi_out=agent \
		--grpc_python_out=agent agent/smon/v1/ingest.proto

bench: venv
	$(PY) benchmarks/agent_overhead.py
	$(PY) benchmarks/whatif_speed.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
