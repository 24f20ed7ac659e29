#!/usr/bin/env bash
# build.sh BUILD JOBS: builds quietly (no "Entering directory" noise), showing
# progress as one counter, and the compiler's output in full if it fails.
set -uo pipefail
build=$1 jobs=$2
log=$build/build.log
echo "memfit: building in $build (log: $log)"
if [ -t 1 ]; then
  cmake --build "$build" -j"$jobs" 2>&1 | tee "$log" | grep --line-buffered -oE '^\[[0-9]+/[0-9]+\]' \
    | while read -r step; do printf '\rmemfit: building %s' "$step"; done
  status=${PIPESTATUS[0]}
  printf '\r\033[K'
else
  cmake --build "$build" -j"$jobs" >"$log" 2>&1
  status=$?
fi
if [ "$status" -ne 0 ]; then
  grep -E "error|Error" -A5 "$log" | head -80 >&2
  echo "memfit: build failed (full log: $log)" >&2
  exit "$status"
fi
