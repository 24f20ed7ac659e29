#!/usr/bin/env bash
# advise on a model whose BatchNorm layers mix the batch's samples: a plan in
# micro-batches normalizes each with its own statistics, so it is not the
# plain step's numbers. Without --allow-approximate the plan does not split
# the batch and says why; with it, the plan splits and says it changes the
# numbers (as memfit train refuses such a split without --coupled allow).
# Usage: advise_batch_norm.sh MEMFIT
set -uo pipefail
memfit=$1
flags=(advise --model cnn --batch 16 --budget 12MiB --repeats 0)
err=$("$memfit" "${flags[@]}" 2>&1 >/dev/null)
rc=$?
[ $rc -eq 2 ] || { echo "FAIL: expected no exact plan (exit 2), got $rc: $err"; exit 1; }
echo "$err" | grep -qF "micro-batches were not tried: the BatchNorm layers (bn, " ||
  { echo "FAIL: the refusal does not name the BatchNorm layers: $err"; exit 1; }
out=$("$memfit" "${flags[@]}" --allow-approximate 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: --allow-approximate found no plan (exit $rc)"; exit 1; }
plan=$(echo "$out" | grep '^plan:')
echo "$plan"
echo "$plan" | grep -q 'micro-batches of .*changes the numbers' ||
  { echo "FAIL: the split plan does not say it changes the numbers"; exit 1; }
echo "$out" | grep -qF "compute (each micro-batch normalized with its own statistics)" ||
  { echo "FAIL: no note naming what the split changes"; exit 1; }
echo "ok: the split is refused unless allowed, and then said to change the numbers"
