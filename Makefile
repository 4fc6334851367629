# quantload: the two commands a new user needs are `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL ?= smollm2-135m
PROFILE ?= quick
OUT ?= results
DATASET ?=
EXCLUSIVE ?=

.PHONY: run test test-unit test-long check venv toolchain clean-venv

$(BIN)/quantload: pyproject.toml
	@echo "make: creating $(VENV) and installing quantload with its test tools (a minute or two; pip shows each package)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar on --upgrade pip
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar on -e '.[dev]'
	touch $@

venv: $(BIN)/quantload

toolchain: venv
	$(BIN)/quantload toolchain

## The main job on the embedded default (local processes): prepare, quality, speed, serve, load, report.
## DATASET=PATH: WikiText-2's wiki.test.raw when offline; EXCLUSIVE=1: wait for a quiet machine (--exclusive).
run: toolchain
	$(BIN)/quantload run --model $(MODEL) --profile $(PROFILE) --out $(OUT) $(if $(DATASET),--dataset $(DATASET)) $(if $(EXCLUSIVE),--exclusive)

## Lint and type checks.
check: venv
	$(BIN)/ruff check --no-cache src tests benchmarks locustfiles
	$(BIN)/mypy src

## The tests, tier by tier, each tier said as it begins: unit, then integration against real llama-server,
## Prometheus, Locust and Chromium, then end to end (one pytest session: the shared run is made once).
test: toolchain
	$(BIN)/python -m pytest -ra tests/unit tests/integration tests/e2e

## The unit tier alone: pure logic with fakes, no process started (a guard fails a test that starts one),
## no llama.cpp tools needed; spread over the machine's cores (pytest-xdist, at most four workers).
test-unit: venv
	$(BIN)/python -m pytest -ra -n auto --maxprocesses 4 tests/unit

test-long: toolchain  # the long end-to-end runs (compose, five namespace hosts, seven files, ...) `make test` leaves out
	QUANTLOAD_LONG_TESTS=1 $(BIN)/python -m pytest -ra -m long

clean-venv:
	rm -rf $(VENV)
