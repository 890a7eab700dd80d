# hpcdl: the two commands for a fresh machine are `make demo` and `make test`.
PY ?= python3
PYTEST_ARGS ?=

.PHONY: help setup test unit lint demo docs

help:
	@echo "make demo   - the main job: sandbox cluster, image, a 2-node ResNet run"
	@echo "make test   - install what the tests need, then run lint + all tests"
	@echo "make unit   - fast unit tests only (no Slurm, Apptainer, MPI; not the slow-marked)"
	@echo "make docs   - the documentation site (mkdocs, strict) into site/"

# Everything the tests need, idempotent: each script checks before it installs.
# setup and lint note their seconds in .cache/ for the durations page `make test`
# writes (tests/durations.py: pytest cannot see the stages before it).
setup:
	@mkdir -p .cache; start=$$(date +%s); scripts/setup.sh && echo $$(( $$(date +%s) - start )) > .cache/setup-seconds

lint:
	@mkdir -p .cache; start=$$(date +%s); \
	  $(PY) -m ruff check hpcdl tests $(wildcard bench examples) && $(PY) -m mypy \
	  && echo $$(( $$(date +%s) - start )) > .cache/lint-seconds

# Both tiers keep Python's bytecode in .cache/pycache even where the environment sets
# PYTHONDONTWRITEBYTECODE: recompiling hpcdl, its tests and their imports on every run
# was about a sixth of `make unit`'s time (docs/benchmarks.md), and every `python -m
# hpcdl` the integration tests start (hundreds) recompiled hpcdl, ~0.4 s of CPU each.
# The processes the tests start inherit both variables; the ordinary user's commands run
# with a clean environment (env -i: no prefix, their venv's own __pycache__).
KEEP_BYTECODE = PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/.cache/pycache

# The suite runs in TEST_WORKERS pytest-xdist workers: most of its time is spent waiting
# on Slurm, time limits and node deaths, not computing (docs/testing.md). Tests that share
# a cluster stay in one worker (tests/parallel.py). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 4

test: setup lint
	HPCDL_SETUP_SECONDS=$$(cat .cache/setup-seconds) HPCDL_LINT_SECONDS=$$(cat .cache/lint-seconds) \
	  $(KEEP_BYTECODE) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS) tests

# The fast tier (docs/testing.md says what it leaves to `make test`), in UNIT_WORKERS
# xdist workers: its tests are pure CPU, independent, one core each.
UNIT_WORKERS ?= 2

unit:
	$(KEEP_BYTECODE) $(PY) -m pytest -n $(UNIT_WORKERS) -m "not slow" --hypothesis-profile=unit $(PYTEST_ARGS) tests/unit

demo:
	scripts/demo.sh

# The same strict build tests/unit/project/test_docs.py runs in `make test` (a broken link fails).
docs:
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
