#!/usr/bin/env bash
# build_and_run.sh SOURCE BUILD MEMFIT_DIR TORCH_DIR CXX: configures and builds
# the consumer project with find_package(memfit), runs it, checks its line.
set -euo pipefail
src=$1 bin=$2 memfit_dir=$3 torch_dir=$4 cxx=$5
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src" -B "$bin" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -Dmemfit_DIR="$memfit_dir" -DTorch_DIR="$torch_dir" ${launcher[@]+"${launcher[@]}"} >/dev/null
cmake --build "$bin" >/dev/null
out=$("$bin/consumer")
echo "$out"
[[ "$out" == "mlp batch 8: peak "*" bytes in "* ]] || { echo "unexpected output" >&2; exit 1; }
