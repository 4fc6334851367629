# quantload: the two commands a new user needs are `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL ?= smollm2-135m
PROFILE ?= quick
OUT ?= results
DATASET ?=

.PHONY: run test test-long check venv toolchain clean-venv

$(BIN)/quantload: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

venv: $(BIN)/quantload

toolchain: venv
	$(BIN)/quantload toolchain

## The main job on the embedded default (local processes): prepare, quality, speed, serve, load, report.
run: toolchain
	$(BIN)/quantload run --model $(MODEL) --profile $(PROFILE) --out $(OUT) $(if $(DATASET),--dataset $(DATASET))

## Lint and type checks.
check: venv
	$(BIN)/ruff check --no-cache src tests benchmarks locustfiles
	$(BIN)/mypy src

## The tests: unit, then integration against real llama-server, Prometheus, Locust and Chromium.
test: toolchain
	$(BIN)/python -m pytest -ra

test-long: toolchain  # also the long end-to-end runs (the seven-file run), which `make test` leaves out
	QUANTLOAD_LONG_TESTS=1 $(BIN)/python -m pytest -ra -m long

clean-venv:
	rm -rf $(VENV)
