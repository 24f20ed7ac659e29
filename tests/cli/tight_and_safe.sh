#!/usr/bin/env bash
# End to end: `memfit fit` finds a batch that `memfit train --no-split` runs
# for 3 steps under the same budget, and 5% more (at least 1) runs out of
# memory. Usage: tight_and_safe.sh MEMFIT MODEL BUDGET [model flags...]
set -uo pipefail
memfit=$1 model=$2 budget=$3
shift 3
fit=$("$memfit" fit --model "$model" --budget "$budget" --json "$@") || {
  echo "fit failed"; exit 1; }
max=$(echo "$fit" | sed -n 's/.*"max_batch": \([0-9]*\).*/\1/p')
[ -n "$max" ] && [ "$max" -ge 1 ] || { echo "no max_batch in: $fit"; exit 1; }
over=$((max + (max / 20 > 1 ? max / 20 : 1)))
echo "$model under $budget: max_batch $max; trying $max and $over"
"$memfit" train --model "$model" --batch "$max" --budget "$budget" --steps 3 \
  --no-split --coupled allow "$@" >/dev/null
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: batch $max did not run 3 steps (exit $rc)"; exit 1; }
out=$("$memfit" train --model "$model" --batch "$over" --budget "$budget" --steps 3 \
  --no-split --coupled allow "$@" 2>&1 >/dev/null)
rc=$?
[ $rc -eq 2 ] || { echo "FAIL: batch $over should run out of memory (exit $rc)"; exit 1; }
echo "$out" | grep -q "out of memory" || { echo "FAIL: no 'out of memory' in: $out"; exit 1; }
echo "ok"
