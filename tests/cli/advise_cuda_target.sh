#!/usr/bin/env bash
# `memfit advise --target cuda` and `memfit fit --target cuda`: the budget
# is a card's, held against the caching allocator's reserved bytes. With a budget between the plain
# step's allocated and reserved peaks, the CPU target plans the plain step
# and the CUDA target does not.
# Usage: advise_cuda_target.sh MEMFIT
set -uo pipefail
memfit=$1
flags=(--model mlp --batch 8 --repeats 0 --quiet)
json=$("$memfit" profile --model mlp --batch 8 --target cuda --json)
allocated=$(echo "$json" | sed -n 's/^  "peak_bytes": \([0-9]*\).*/\1/p')
reserved=$(echo "$json" | sed -n 's/.*"peak_reserved_bytes": \([0-9]*\).*/\1/p')
[ -n "$allocated" ] && [ -n "$reserved" ] || { echo "FAIL: no peaks in profile --json"; exit 1; }
[ "$reserved" -gt "$allocated" ] || { echo "FAIL: reserved $reserved <= allocated $allocated"; exit 1; }
budget=$(( (allocated + reserved) / 2 ))
echo "allocated $allocated B, reserved $reserved B; budget $budget B"

cpu=$("$memfit" advise "${flags[@]}" --budget "$budget" --json) ||
  { echo "FAIL: the CPU target found no plan"; exit 1; }
echo "$cpu" | grep -q '"peaks": "allocated"' || { echo "FAIL: cpu peaks"; exit 1; }
echo "$cpu" | grep -q '"summary": "the plain step"' || { echo "FAIL: cpu plan is not plain"; exit 1; }

card=$("$memfit" advise "${flags[@]}" --budget "$budget" --target cuda --json 2>/dev/null)
rc=$?
[ $rc -eq 0 ] || [ $rc -eq 2 ] || { echo "FAIL: exit $rc"; exit 1; }
echo "$card" | grep -q '"peaks": "cuda_reserved"' || { echo "FAIL: cuda peaks"; exit 1; }
plain=$(echo "$card" | sed -n 's/^  "plain_peak_bytes": \([0-9]*\).*/\1/p')
[ "$plain" = "$reserved" ] || { echo "FAIL: plain peak $plain, profile reserved $reserved"; exit 1; }
if echo "$card" | grep -q '"summary": "the plain step"'; then
  echo "FAIL: the CUDA target planned the plain step, whose reserved bytes are over"; exit 1
fi
bad=$("$memfit" advise "${flags[@]}" --budget "$budget" --target tpu 2>&1)
[ $? -eq 1 ] && echo "$bad" | grep -q -- "--target must be one of cpu, cuda, got 'tpu'" ||
  { echo "FAIL: --target tpu not refused: $bad"; exit 1; }
# memfit fit --target cuda: its answer's reserved bytes are within the budget.
fit=$("$memfit" fit --model mlp --budget 128MiB --target cuda --json --quiet) ||
  { echo "FAIL: fit --target cuda"; exit 1; }
batch=$(echo "$fit" | sed -n 's/^  "max_batch": \([0-9]*\).*/\1/p')
measured=$(echo "$fit" | sed -n 's/^  "measured_peak_bytes": \([0-9]*\).*/\1/p')
at=$("$memfit" profile --model mlp --batch "$batch" --target cuda --json |
  sed -n 's/.*"peak_reserved_bytes": \([0-9]*\).*/\1/p')
echo "fit --target cuda: batch $batch, measured $measured B, profile reserved $at B"
[ "$measured" = "$at" ] && [ "$at" -le $((128 << 20)) ] ||
  { echo "FAIL: fit's answer reserves $at B (fit said $measured) against 128 MiB"; exit 1; }
# profile --predict for a card: what it would reserve at the batch, replayed
# on the step sized from the probes, is what a profile there replays.
predicted=$("$memfit" profile --model mlp --batch 2000 --predict --target cuda --json --quiet |
  sed -n 's/.*"predicted_reserved_bytes": \([0-9]*\).*/\1/p')
at=$("$memfit" profile --model mlp --batch 2000 --target cuda --json |
  sed -n 's/.*"peak_reserved_bytes": \([0-9]*\).*/\1/p')
echo "profile --predict --target cuda at 2000: $predicted B reserved; profiled: $at B"
[ -n "$predicted" ] && [ "$predicted" = "$at" ] ||
  { echo "FAIL: predicted reserve '$predicted' B, profiled $at B"; exit 1; }
# With fixed --probes there are no steps to replay: the note says so.
fixed=$("$memfit" profile --model mlp --batch 64 --predict --probes 4,8,16 --target cuda --quiet)
echo "$fixed" | grep -q "the prediction counts allocated bytes" ||
  { echo "FAIL: --predict --probes --target cuda does not say its bytes are allocated"; exit 1; }
echo "ok"
