# Two entry points: `make lab` (install, then JupyterLab on the notebooks, open on the quickstart:
# `rankscope lab`; LAB_OPTIONS go to JupyterLab, e.g. LAB_OPTIONS=--ip=0.0.0.0) and `make test`;
# `make check` is the fast lane of the edit-test loop (lint, and the tests that start no job);
# `make docs` builds the static site into docs/_build/html (docs/make_site.py).
# TORCH is the torch requirement installed into the local environment. The pin keeps the install on
# the CPU wheel; elsewhere pass your own, e.g.
#   make test TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
# make test's pytest workers (pytest-xdist): a job's ranks spend much of the suite's time waiting
# (stall timeouts, a capture), so 2 workers overlap one job's waiting with another's work; one a
# core, so that no job's startup waits behind three others' imports of torch. Tests that share
# something run on one worker (tests/conftest.py's xdist groups). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rankscope-installed
# DeepSpeed's CPU op is compiled for one environment's torch and Python: each environment keeps its
# own build, which the jobs started from make (tests, the lab's kernels) find. Two environments
# sharing one folder would rebuild it in turn, inside a job's time limit.
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions

.PHONY: install lab test check lint format bench docs clean

# The compiled parts (setup.py's extensions: the probe's and the flight-recorder scanner's): a
# change to any of them builds them again.
EXT_SOURCES := $(wildcard src/rankscope/*/*.c src/rankscope/*/*.cpp src/rankscope/*/*.h)

$(STAMP): pyproject.toml setup.py $(EXT_SOURCES) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH) "setuptools>=70.1"
	# Without build isolation the build sees this torch: the probe's tensor reader (_meta.cpp)
	# is compiled against its headers (setup.py).
	$(PY) -m pip install -q --no-build-isolation -e ".[dev,lab,deepspeed,frameworks,docs]"
	# DeepSpeed compiles its CPU communication op on first use (a minute or more on 2 cores):
	# once here, cached in TORCH_EXTENSIONS_DIR, rather than inside a job's time limit.
	# torch waits without end on a build's lock file that a killed build left behind: one older
	# than 15 minutes is such a leftover.
	-find "$$TORCH_EXTENSIONS_DIR" -name lock -mmin +15 -delete 2>/dev/null
	DS_ACCELERATOR=cpu $(PY) -c "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load()" >/dev/null
	touch $(STAMP)

install: $(STAMP)

lab: install
	$(PY) -m rankscope.cli lab notebooks $(LAB_OPTIONS)

test: install
	$(PY) -m ruff check src tests bench docs
	$(PY) -m ruff format --check src tests bench docs
	# Debian's chromium for the browser test, slurm-wlm and munge for the SLURM tests (they skip,
	# saying why, without)
	-sh tests/debian_setup.sh browser
	-sh tests/debian_setup.sh slurm
	# the slowest tests' times, for keeping the suite under 30 minutes
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=40

check: install
	$(PY) -m ruff check src tests bench docs
	$(PY) -m ruff format --check src tests bench docs
	$(PY) -m pytest -q -m "not slow"

lint: install
	$(PY) -m ruff check --fix src tests bench docs
	$(PY) -m ruff format src tests bench docs

docs: install
	$(PY) docs/make_site.py

bench: install
	$(PY) bench/probe_overhead.py
	$(PY) bench/stall_capture.py

clean:
	rm -rf $(VENV) runs .pytest_cache docs/_build docs/guide docs/notebooks docs/recipes docs/api
