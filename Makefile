# The two commands: `make demo` (main job) and `make test` (whole suite).
# Each creates or updates the virtual environment .venv by itself.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The other arithmetic (make test-arith): torch's kernels, MKL and oneDNN at another
# instruction set than this CPU's, numba for a generic x86-64. Every test marked crosspath
# (two code paths or runs compared) and the float-sensitive tests run again under it: a
# comparison that held only because two different computations happened to round alike on
# this CPU fails here (docs/contributing.md#comparing-floats-across-machines).
OTHER_ARITH := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 \
	ONEDNN_MAX_CPU_ISA=SSE41 NUMBA_CPU_NAME=generic
FLOAT_TESTS := tests/test_sim_baseline.py tests/test_backends.py tests/test_baseline.py \
	tests/test_backends_device.py tests/test_precision.py

# Lower bounds that are tested (make test-lowest): the lowest numpy, numba, scipy,
# pydantic and typer that pyproject.toml allows (tests/lowest.py reads them from there), in a
# virtual environment of their own, built once; torch is the CPU build pinned below. The core
# and training smoke tests run there, with numba's cache apart from .venv's.
LOWEST       := .venv-lowest
LOWEST_STAMP := $(LOWEST)/.installed
LOWEST_TESTS := tests/test_rules.py tests/test_round.py tests/test_replay.py \
	tests/test_experiments_config.py tests/test_cli.py tests/test_data_safe_pickle.py \
	tests/test_sim.py tests/test_internals.py

.PHONY: demo test test-arith test-lowered test-lowest venv bench clean docs stranger

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# CPU build of torch first, pinned, so that the open range in pyproject installs nothing more.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[all,dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/sfg demo

# The suite runs on every core (pytest-xdist, -n auto): its tests are independent (each writes
# under its own tmp_path, networked ones bind port 0 on loopback) and bound their waits by
# counting events, not by wall time.
PYTEST_PAR := -n auto

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -q $(PYTEST_PAR)
	$(MAKE) --no-print-directory docs
	$(MAKE) --no-print-directory test-arith
	$(MAKE) --no-print-directory test-lowest

test-arith: $(STAMP)
	env $(OTHER_ARITH) $(BIN)/python -m pytest -q $(PYTEST_PAR) -m crosspath
	env $(OTHER_ARITH) $(BIN)/python -m pytest -q $(PYTEST_PAR) -m "not crosspath" $(FLOAT_TESTS)

test-lowered: test-arith

$(LOWEST_STAMP): pyproject.toml tests/lowest.py
	test -x $(LOWEST)/bin/python || $(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install -q torch==2.13.0
	$(LOWEST)/bin/python tests/lowest.py --install
	touch $(LOWEST_STAMP)

test-lowest: $(LOWEST_STAMP)
	$(LOWEST)/bin/python tests/lowest.py --check
	env NUMBA_CACHE_DIR=$(LOWEST)/numba-cache timeout 300 \
		$(LOWEST)/bin/python -m pytest -q -p no:cacheprovider $(LOWEST_TESTS)

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or reference fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q -d site

# A stranger's path (not part of make test): a fresh venv, the CPU torch first, then the built
# wheel; the README's and the how-tos' runnable examples and a plugin of one's own, end to end.
stranger: $(STAMP)
	$(BIN)/python tests/stranger.py

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_replay.py

clean:
	rm -rf $(VENV) $(LOWEST) build *.egg-info src/*.egg-info
