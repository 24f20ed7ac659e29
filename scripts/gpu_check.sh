#!/usr/bin/env bash
# On a GPU machine (torch 2.x with CUDA from pip, cmake, a C++ compiler):
# builds memfit against that torch in build-gpu/, then compares memfit's
# predicted CUDA peaks (made on the CPU) with the GPU's own
# (bench/gpu/compare_cuda.py), and runs real steps at the batch
# find_batch_size fits for the card (bench/gpu/fit_on_card.py). Arguments go
# to compare_cuda.py (--quick, --models mlp,gpt, ...). Results: stdout, and
# $OUT/ when OUT is set (gpu_compare.json, gpu_compare_cli.json,
# gpu_fit_on_card.json, gpu_build.log).
#
#   scripts/gpu_check.sh [--quick]
#   scripts/gpu_check.sh --snapshots [--dry-run] [--only CASE,...]
#   scripts/gpu_check.sh --native [--dry-run] [--only CASE,...]
#
# --snapshots: records CUDA memory snapshots of small training steps
# (bench/gpu/record_snapshots.py: mlp, gpt, cnn, resnet18, a tiny HF Llama,
# Adam, with and without expandable_segments, one ending in an OOM), each
# with its metadata, into $OUT/snapshots/ (else build-gpu/snapshots/); no
# build. Commit them under tests/data/snapshots/: CI replays each. With
# --dry-run (no GPU) it builds every case on the CPU and says what it would
# record.
#
# --native: builds, then for each case of bench/gpu/native_check.py (8: mlp at
# 256 MiB, cnn with cuDNN, gpt, resnet18, HF GPT-2 and Llama from configs, a
# compiled model, an LSTM) find_batch_size with the model on the card, the
# true maximum by plain steps capped at the budget, and Lightning's
# BatchSizeFinder; figures (native.json, native.md) into $OUT/native/ (else
# build-gpu/native/), then snapshots of the default cases into
# $OUT/snapshots/ in the time left. Meant as one call of at most 8 minutes.
# With --dry-run it lists the cases and exits: no GPU, no build, no torch.
#
# Environment: MEMFIT_PYTHON (default python3), MEMFIT_GPU_BUILD (build-gpu),
# JOBS (nproc), MEMFIT_GPU_TIMEOUT (seconds for the comparison, 300),
# MEMFIT_GPU_NO_BUILD=1 (use what is in the build folder already).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

PY=$(command -v "${MEMFIT_PYTHON:-python3}") || { echo "gpu_check: no ${MEMFIT_PYTHON:-python3}" >&2; exit 1; }
BUILD=${MEMFIT_GPU_BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
TIMEOUT=${MEMFIT_GPU_TIMEOUT:-300}
LOGDIR=${OUT:-$BUILD}
mkdir -p "$LOGDIR" "$BUILD"
BUILD_ABS=$(cd "$BUILD" && pwd)
LOG=$LOGDIR/gpu_build.log
: >"$LOG"
start=$(date +%s)

step() { echo "== $* ($(($(date +%s) - start)) s)"; }

SNAPSHOTS=0 NATIVE=0 DRY=0
for a in "$@"; do
  case "$a" in --snapshots) SNAPSHOTS=1 ;; --native) NATIVE=1 ;; --dry-run) DRY=1 ;; esac
done
args=()  # the arguments less the mode
for a in "$@"; do case "$a" in --snapshots | --native) ;; *) args+=("$a") ;; esac; done

NATIVE_OUT=${OUT:-$BUILD}/native
if [ "$NATIVE" = 1 ] && [ "$DRY" = 1 ]; then
  # The list alone (bench/gpu/native_cases.py): no torch, no GPU, no build.
  step "native card check: the cases (dry run)"
  rc=0
  "$PY" bench/gpu/native_cases.py --out "$NATIVE_OUT" ${args[@]+"${args[@]}"} || rc=$?
  step "done (exit $rc)"
  exit "$rc"
fi

step "machine"
"$PY" - <<'EOF' || { echo "gpu_check: $PY cannot import torch" >&2; exit 1; }
import sys, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "CUDA", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version() if torch.cuda.is_available() else None)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("GPU", p.name, "sm_%d%d" % torch.cuda.get_device_capability(0),
          "%.1f GiB" % (p.total_memory / 2**30))
else:
    print("no CUDA device visible to torch")
EOF
command -v nvidia-smi >/dev/null && nvidia-smi -L
cmake --version | head -1
"${CXX:-c++}" --version 2>/dev/null | head -1

if [ "$SNAPSHOTS" = 1 ]; then
  step "record CUDA memory snapshots into ${OUT:-$BUILD}/snapshots"
  rc=0
  timeout "${MEMFIT_GPU_TIMEOUT:-480}" "$PY" bench/gpu/record_snapshots.py --out "${OUT:-$BUILD}/snapshots" \
    ${args[@]+"${args[@]}"} || rc=$?
  ls -l "${OUT:-$BUILD}/snapshots" 2>/dev/null
  step "done (exit $rc)"
  exit "$rc"
fi

# torch as $PY reports it (Note [Torch from Python]): no CUDA toolkit needed.
TORCH_PREFIX=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
PYBIND11_DIR=$("$PY" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null || true)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

configure() {  # configure [extra cmake args...]
  rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  echo "-- configure $*" >>"$LOG"
  cmake -S . -B "$BUILD" ${GEN[@]+"${GEN[@]}"} -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE="$PY" -DMEMFIT_BUILD_TESTS=OFF -DMEMFIT_BUILD_BENCHMARKS=OFF \
    ${LAUNCHER[@]+"${LAUNCHER[@]}"} "$@" >>"$LOG" 2>&1
}

step "configure memfit against torch in $TORCH_PREFIX (log: $LOG)"
# pybind11: its CMake config wherever CMake finds one, else pip's; torch's
# wheel ships pybind11's headers but no CMake config.
WITH_PYTHON=1
if [ -n "${MEMFIT_GPU_NO_BUILD:-}" ]; then
  WITH_PYTHON=-1
  echo "not building: MEMFIT_GPU_NO_BUILD is set"
elif [ -n "$PYBIND11_DIR" ] && configure -Dpybind11_DIR="$PYBIND11_DIR"; then
  echo "pybind11 from $PYBIND11_DIR"
elif configure; then
  :
elif configure -DMEMFIT_BUILD_PYTHON=OFF; then
  WITH_PYTHON=0
  echo "gpu_check: configured without the Python module (pybind11 not found): CLI only"
else
  WITH_PYTHON=-2
  echo "gpu_check: cmake could not configure memfit; last lines of $LOG:" >&2
  tail -n 25 "$LOG" >&2
fi

BUILT=none
if [ "$WITH_PYTHON" -ge 0 ]; then
  step "build (-j$JOBS)"
  if cmake --build "$BUILD" -j"$JOBS" >>"$LOG" 2>&1; then
    BUILT=$([ "$WITH_PYTHON" = 1 ] && echo python || echo cli)
  elif cmake --build "$BUILD" -j"$JOBS" --target memfit_cli >>"$LOG" 2>&1; then
    BUILT=cli
    echo "gpu_check: the Python module did not build; CLI only. Errors:" >&2
    grep -m 15 -E 'error|Error' "$LOG" >&2
  else
    echo "gpu_check: memfit did not build against this torch. First errors:" >&2
    grep -m 25 -E 'error|Error' "$LOG" >&2
  fi
fi
if [ "$WITH_PYTHON" = -1 ]; then  # MEMFIT_GPU_NO_BUILD: whatever is there
  if [ -d "$BUILD/python/memfit" ]; then BUILT=python; elif [ -x "$BUILD/memfit" ]; then BUILT=cli; fi
fi
echo "built: $BUILT"

if [ "$NATIVE" = 1 ]; then
  [ "$BUILT" = python ] || { echo "gpu_check: --native needs the Python module" >&2; exit 1; }
  export PYTHONUNBUFFERED=1
  export PYTHONPATH="$BUILD_ABS/python${PYTHONPATH:+:$PYTHONPATH}"
  # 8 minutes in all: what the build left, less a minute for the snapshots.
  left=$((480 - ($(date +%s) - start)))
  [ "$left" -lt 120 ] && left=120  # a slow build: still the check (timeout 0 would mean none)
  step "native card check into $NATIVE_OUT (${left} s left)"
  rc=0
  timeout $((left - 60)) "$PY" bench/gpu/native_check.py --out "$NATIVE_OUT" \
    ${args[@]+"${args[@]}"} || rc=$?
  left=$((480 - ($(date +%s) - start)))
  if [ "$left" -gt 20 ]; then
    step "snapshots of the default cases into ${OUT:-$BUILD}/snapshots (${left} s left)"
    timeout $((left - 10)) "$PY" bench/gpu/record_snapshots.py --out "${OUT:-$BUILD}/snapshots" ||
      echo "gpu_check: snapshots stopped (exit $?): what was written stays"
  fi
  ls -l "$NATIVE_OUT" "${OUT:-$BUILD}/snapshots" 2>/dev/null
  step "done (exit $rc)"
  exit "$rc"
fi

step "compare predicted and measured CUDA peaks"
rc=0
export PYTHONUNBUFFERED=1
export PYTHONPATH="$BUILD_ABS/python${PYTHONPATH:+:$PYTHONPATH}"
timeout "$TIMEOUT" "$PY" bench/gpu/compare_cuda.py --build "$BUILD_ABS" "$@" || rc=$?
if [ "$BUILT" = python ] && [ -x "$BUILD/memfit" ]; then
  # The CLI's own --target cuda, on the built-in models (LibTorch's Adam).
  step "the same through the CLI (built-in models, quick)"
  json=()
  [ -n "${OUT:-}" ] && json=(--json "$OUT/gpu_compare_cli.json")
  dry=()
  for a in "$@"; do [ "$a" = --dry-run ] && dry=(--dry-run); done
  timeout 120 "$PY" bench/gpu/compare_cuda.py --build "$BUILD_ABS" --via cli --quick ${dry[@]+"${dry[@]}"} \
    --models mlp,cnn,gpt,lstm ${json[@]+"${json[@]}"} || { r=$?; [ "$rc" = 0 ] && rc=$r; }
fi
if [ "$BUILT" = python ]; then
  # The fit for a card (reserved bytes), then real steps at its answer: the
  # card's max_memory_reserved must stay within the budget.
  step "find_batch_size(target_device='cuda') checked by real steps on the card"
  dry=()
  for a in "$@"; do [ "$a" = --dry-run ] && dry=(--dry-run); done
  timeout 300 "$PY" bench/gpu/fit_on_card.py ${dry[@]+"${dry[@]}"} || { r=$?; [ "$rc" = 0 ] && rc=$r; }
fi
step "done (exit $rc)"
exit "$rc"
