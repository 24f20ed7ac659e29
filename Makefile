# The two commands of the README: `make demo` and `make test`. Both install
# missing Debian packages, find the Python that has torch, and build.
BUILD ?= build
JOBS ?= 2
BUILD_TYPE ?= Release

.PHONY: all deps configure build test test-cpp test-python demo bench clean format

all: build

deps:
	@scripts/install_deps.sh

$(BUILD)/CMakeCache.txt: | deps
	@PY=$$(scripts/find_python.sh) && \
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DPython_EXECUTABLE=$$PY -DMEMFIT_BUILD_TESTS=ON

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	@cmake --build $(BUILD) -j$(JOBS)

test-cpp: build
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

test-python: build
	@PY=$$(scripts/find_python.sh) && \
	PYTHONPATH=$(BUILD)/python $$PY -m pytest -q python/tests

test: test-cpp test-python

demo: build
	@scripts/demo.sh $(BUILD)

bench: build
	@PY=$$(scripts/find_python.sh) && PYTHONPATH=$(BUILD)/python $$PY bench/run_all.py --build $(BUILD)

clean:
	rm -rf $(BUILD)

format:
	@clang-format -i $$(git ls-files '*.h' '*.cpp')
