# The task runner. Every target creates/uses .venv, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The ray extra (collect --ray): tests, lint and bench need it; `make run` stays light.
# The telemetry extra (OpenTelemetry, Prometheus) is part of every dev install: its tests run.
RAY_STAMP := $(VENV)/.installed-ray

.PHONY: run test test-fast lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,telemetry]'
	touch $(STAMP)

$(RAY_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,telemetry,ray]'
	touch $(RAY_STAMP)

run: $(STAMP)  ## start the bundled fake deployment, collect the example dataset, print the summary
	$(BIN)/trollout demo

test: $(RAY_STAMP)  ## the whole suite, slow tests included, with the coverage gate
	$(BIN)/pytest -q -rs -p no:cacheprovider --cov --cov-report=term

test-fast: $(STAMP)  ## skip the suites marked slow
	$(BIN)/pytest -q -p no:cacheprovider -m 'not slow'

lint: $(RAY_STAMP)
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/ruff check src tests bench examples
	$(BIN)/mypy

bench: $(RAY_STAMP)  ## print the benchmark figures (never part of make test); slow, noisy machine
	$(BIN)/python bench/collect_cpu.py
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/fake_server_ceiling.py
	$(BIN)/python bench/transport_cpu.py
	$(BIN)/python bench/store_write.py
	$(BIN)/python bench/aggregate.py
	$(BIN)/python bench/resume.py
	$(BIN)/python bench/reply_memory.py
	$(BIN)/python bench/scaleout.py
	$(BIN)/python bench/frontends.py
	$(BIN)/python bench/telemetry.py
	$(BIN)/python bench/retry_days.py
	$(BIN)/python bench/health.py
	$(BIN)/python bench/enrichment.py
	$(BIN)/python bench/view.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage
