#!/usr/bin/env bash
# pytest_jobs.sh: how many pytest-xdist workers the Python tests run in
# (make test, scripts/check_torch_wheel.sh): PYTEST_JOBS where set, else one
# per core; 0 (pytest's own process) on one core. Each worker's torch runs
# on its share of the cores (python/tests/conftest.py).
jobs=${PYTEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
[ "$jobs" -gt 1 ] 2>/dev/null || jobs=0
echo "$jobs"
