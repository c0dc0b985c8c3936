# The two commands: `make demo` (main job) and `make test` (whole suite).
# Each creates or updates the virtual environment .venv by itself.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The float-sensitive tests run a second time with every library lowered to its baseline
# instruction set, as on a machine without AVX2: they must pass on any CPU of this project.
LOWERED_ISA := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 \
	ONEDNN_MAX_CPU_ISA=SSE41 NUMBA_CPU_NAME=generic
FLOAT_TESTS := tests/test_sim_baseline.py tests/test_backends.py tests/test_baseline.py \
	tests/test_backends_device.py tests/test_precision.py

.PHONY: demo test test-lowered venv bench clean docs

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

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -q
	$(MAKE) --no-print-directory docs
	$(MAKE) --no-print-directory test-lowered

test-lowered: $(STAMP)
	env $(LOWERED_ISA) $(BIN)/python -m pytest -q $(FLOAT_TESTS)

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or reference fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q -d site

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_replay.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
