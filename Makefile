# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv web api-types demo test test-static test-quick test-slow lint typecheck proto bench wheel clean

venv: $(STAMP)

# The CPU wheel of torch 2.13.0 lies on this machine's disk; installing it first keeps pip
# from resolving `torch` to a multi-GB CUDA build, and naming it again in the second install
# keeps the framework extras (tests/integrations) from replacing it. The filter hides setuptools'
# note that folders named like a package in the working directory may shadow an editable
# install: SMon's packages live in agent/ and server/, so there are none.
EXTRAS := server,torch,dev,transformers,lightning,accelerate,deepspeed

# pip compiles the installed modules one file at a time (torch alone: 38 s of a 2-core machine's
# set-up); compileall does the same on every core afterwards (torch: 14 s). Like pip, it leaves
# files that do not compile (test data in some packages) as they are.
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile "torch==2.13.0"
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet --no-compile -e ".[$(EXTRAS)]" "torch==2.13.0"
	$(PY) -m compileall -q -j 0 $$($(PY) -c "import sysconfig; print(sysconfig.get_path('purelib'))") > /dev/null || true
	$(PY) -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

# The dashboard (web/) built into the server package, which serves it and ships it in wheels.
WEB_DIST := server/smon_server/dashboard/dist/index.html
WEB_SRC  := $(shell find web/src -type f 2>/dev/null) web/index.html web/package.json \
            web/package-lock.json web/vite.config.ts web/tsconfig.json

web: $(WEB_DIST)

# npm ci installs web/api-types too (an npm workspace: openapi-typescript needs TypeScript 5's
# compiler API, which the dashboard's TypeScript 7 no longer has, so it keeps its own).
web/node_modules/.installed: web/package.json web/package-lock.json web/api-types/package.json
	cd web && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(WEB_DIST): web/node_modules/.installed $(WEB_SRC)
	cd web && npm run --silent build

# The dashboard's response types (web/src/api-schema.d.ts), generated from the server's OpenAPI
# schema: run it after changing a response model and commit the result (tests/web/test_api_types.py
# fails while it is stale).
api-types: venv web/node_modules/.installed
	@mkdir -p build
	$(PY) -m smon_server.api.openapi > build/openapi.json
	web/api-types/node_modules/.bin/openapi-typescript build/openapi.json --output web/src/api-schema.d.ts

demo: venv web
	$(VENV)/bin/smon demo

# Two passes: the quick tests on TEST_WORKERS processes (pytest-xdist), then the tests that time
# real multi-process jobs or kill servers (marked `slow` or `torch`) one at a time, so their
# margins are not shared with other tests' load. A slow test whose assertions do not depend on
# timing (a wheel installed, a fuzzed stream answered, a benchmark run to its report) is also
# marked `parallel` and runs in the first pass. Exit code 5 is "nothing selected" (a
# PYTEST_ARGS that picks tests of one pass only).
# Three workers on two cores: the quick tests wait on servers, databases and sockets more than they
# compute (a whole CI run averages one busy core of two).
TEST_WORKERS ?= 3

test: venv web
	$(MAKE) --no-print-directory -j2 --output-sync=target test-static test-quick
	$(MAKE) --no-print-directory test-slow

# The static checks run beside the quick pass (mypy alone takes ~110 s of one core on a clean
# clone, and the quick pass leaves about one core of two idle).
test-static: venv
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

test-quick: venv web
	$(PY) -m pytest -q -ra --durations=15 -n $(TEST_WORKERS) -m "not (slow or torch) or parallel" $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-slow: venv web
	$(PY) -m pytest -q -ra --durations=25 -p no:xdist -m "(slow or torch) and not parallel" $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: venv
	$(PY) -m mypy

# Regenerate the committed gRPC code from agent/smon/v1/ingest.proto.
proto: venv
	$(PY) -m grpc_tools.protoc -I agent --python_out=agent --pyi_out=agent \
		--grpc_python_out=agent agent/smon/v1/ingest.proto

bench: venv
	$(PY) benchmarks/agent_overhead.py
	$(PY) benchmarks/whatif_speed.py

# A wheel with the dashboard built in (pip users get it without Node). setuptools copies sources
# into build/ and packs what it finds there: a stale build/ would ship modules deleted since.
wheel: venv web
	rm -rf build
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation -w dist .
	@ls dist/smon-*.whl

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache \
		web/node_modules server/smon_server/dashboard/dist
