# resnmt: one command for the main job (`make demo`), one for the tests (`make test`).
# Both create the virtualenv in $(VENV) on first use and install everything pinned.
#
#   make test                 # the test suite (the CI command)
#   make demo                 # prepare Multi30k, train two small models, decode, score, plot
#   make venv                 # only set up the environment
#   make test-slow            # the slow tests (the demo end to end, per-family twins)
#   make coverage             # the default suite under coverage: the functions of resnmt/ it never runs
#   make gpu-bundle           # .gpu/, what a GPU lease carries, rehearsed on the CPU (benchmarks/gpu_job.sh)
#   make TORCH='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128' venv
#                             # a CUDA build of torch on a GPU machine

VENV   ?= .venv
PYTHON ?= python3
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?=
# tests run in parallel, one worker per core (pytest-xdist; worksteal hands each worker a
# contiguous half of the suite, so a file's module fixtures are mostly built once, and an
# idle worker takes tests from the other's end); PYTEST_WORKERS=0 runs them in this process.
# `make test` ends with the 20 slowest tests and their times, so a test that grows is seen there.
PYTEST_WORKERS ?= auto

BIN := $(VENV)/bin
STAMP := $(VENV)/.resnmt-installed

.PHONY: venv test test-slow coverage demo bench gpu-bundle clean-venv

venv: $(STAMP)

EXAMPLE := examples/layerscale

$(STAMP): requirements.txt requirements-fairseq.txt requirements-dev.txt setup.py $(EXAMPLE)/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -r requirements.txt -r requirements-dev.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements-fairseq.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	# the worked example of a connection kind of one's own (registers --residual layerscale)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e $(EXAMPLE)
	$(BIN)/python -c "import torch, fairseq, resnmt; print('torch', torch.__version__, '| fairseq', fairseq.__version__, '| resnmt', resnmt.__version__)"
	touch $@

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist worksteal --durations=20 $(PYTEST_ARGS) tests $(EXAMPLE)/tests

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS) tests

# every process the suite starts writes its own data file beside this one (COVERAGE_FILE is inherited)
coverage: $(STAMP)
	rm -f .coverage .coverage.* coverage.json
	COVERAGE_FILE=$(abspath .coverage) $(BIN)/python -m pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist worksteal \
		--cov --cov-config=$(abspath .coveragerc) --cov-report= $(PYTEST_ARGS) tests $(EXAMPLE)/tests
	# a process that ended after pytest gathered the files: its file too ("No data to combine" when none)
	-COVERAGE_FILE=$(abspath .coverage) $(BIN)/python -m coverage combine --append --rcfile=.coveragerc -q
	COVERAGE_FILE=$(abspath .coverage) $(BIN)/python -m coverage json --rcfile=.coveragerc -q -o coverage.json
	$(BIN)/python tests/never_executed.py coverage.json

demo: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/demo.sh

bench: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" bash benchmarks/run_all.sh

gpu-bundle: $(STAMP)
	PYTHON=$(BIN)/python bash benchmarks/gpu_bundle.sh

clean-venv:
	rm -rf $(VENV)
