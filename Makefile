# The two commands of the README: `make demo` and `make test`. Both make the
# virtual environment .venv (torch and the rest pinned in requirements.txt),
# install the few Debian packages pip does not serve, and build.
BUILD ?= build
JOBS ?= 2
BUILD_TYPE ?= Release
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: all deps venv configure build test test-cpp test-python test-numerics test-quick \
	demo bench clean format

all: build

deps:
	@scripts/install_deps.sh

# Rebuilt when requirements.txt changes.
$(VENV)/.requirements: requirements.txt
	@scripts/make_venv.sh $(VENV) requirements.txt

venv: $(VENV)/.requirements

# Unity batches (Note [Unity builds]) where the build is cold: ccache not
# installed, or its cache empty (a new machine, CI; scripts/cold_build.sh);
# per file where ccache holds objects, so an edit recompiles its own file.
# UNITY=ON|OFF decides; PCH=ON adds precompiled torch headers (Note
# [Precompiled torch headers]), which no longer pay beside the batches. Read
# when the build folder is configured: `make clean` to decide again.
PCH ?= OFF
UNITY ?=
$(BUILD)/CMakeCache.txt: | deps venv
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DPython_EXECUTABLE=$(abspath $(PY)) -DMEMFIT_BUILD_TESTS=ON \
	  -DMEMFIT_UNITY_BUILD=$${UNITY:-$$(scripts/cold_build.sh)} -DMEMFIT_PRECOMPILE_HEADERS=$(PCH) \
	  $$(command -v ninja >/dev/null && echo -G Ninja) >/dev/null

configure: $(BUILD)/CMakeCache.txt

build: deps venv configure
	@scripts/build.sh $(BUILD) $(JOBS)

test-cpp: build
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The Python tests in one process per core (pytest-xdist), each test file
# whole in one of them (--dist loadfile: a module's fixtures are made once),
# each worker's torch on its share of the cores (python/tests/conftest.py).
# On 2 cores, 22 of the test files, the same minutes (load 2.4-3.5): 47 and
# 89 s against 132 and 142 s in one process of two threads, where one
# process keeps one core busy with Python and OpenMP's threads spin.
# PYTEST_JOBS=0 runs them in pytest's own process (scripts/pytest_jobs.sh).
PYTEST := PYTHONPATH=$(BUILD)/python $(PY) -m pytest -q -n $$(scripts/pytest_jobs.sh) --dist loadfile

test-python: build
	@$(PYTEST) python/tests

test: test-cpp test-python

# The edit loop (minutes with a warm build): the C++ tests less the
# end-to-end ones (cli.*: the real binary on whole models; consumer.*: a
# project built apart), the sweeps over the built-in models and the two
# long training runs (together 3/4 of ctest's time), then the Python tests
# not marked slow, stopping at the first failure. `make test` runs them all.
QUICK_CPP_SKIP := ^(cli|consumer)\.|^BuiltinModels/|TwoHundredSteps|PlanTrainsWhereOneSampleDoesNotFit
test-quick: build
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -E '$(QUICK_CPP_SKIP)'
	@$(PYTEST) -x -m 'not slow' python/tests

# The tests marked numerics (python/tests/conftest.py) with oneDNN held to
# AVX2: what a CPU without native bf16 runs. .ci/run runs them beside `make
# test`, which runs them on the machine's own ISA.
# In one process: 53 tests, where two workers' collection of the whole
# suite costs more than they save (56 s against 36 s, load 4).
test-numerics: build
	@ONEDNN_MAX_CPU_ISA=AVX2 PYTHONPATH=$(BUILD)/python $(PY) -m pytest -q -m numerics python/tests

demo: build
	@PATH=$(abspath $(VENV))/bin:$$PATH scripts/demo.sh $(BUILD)

bench: build
	@PYTHONPATH=$(BUILD)/python $(PY) bench/run_all.py --build $(BUILD)

clean:
	rm -rf $(BUILD)

format:
	@clang-format -i $$(git ls-files '*.h' '*.cpp')
