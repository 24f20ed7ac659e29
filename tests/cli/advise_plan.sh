#!/usr/bin/env bash
# End to end: under a budget where even batch 1 does not fit plainly,
# `memfit train --plan auto` trains 20 steps without running out of memory
# and its losses match the plain unbudgeted run's (same seed).
# Usage: [EXPECT_PLAN=TEXT] advise_plan.sh MEMFIT FRACTION [model flags...]
# EXPECT_PLAN: text the plan's summary must contain.
set -uo pipefail
memfit=$1 fraction=$2
shift 2
flags=(--model gpt "$@")
p1=$("$memfit" profile "${flags[@]}" --batch 1 --json | sed -n 's/^  "peak_bytes": \([0-9]*\).*/\1/p')
[ -n "$p1" ] || { echo "no batch-1 peak"; exit 1; }
budget=$(awk -v p="$p1" -v f="$fraction" 'BEGIN { printf "%d", p * f }')
echo "plain batch-1 peak $p1 B; budget $budget B"
"$memfit" train "${flags[@]}" --batch 1 --steps 1 --budget "$budget" >/dev/null 2>&1
[ $? -eq 2 ] || { echo "FAIL: batch 1 should not fit plainly"; exit 1; }
losses() { sed -n 's/.*"loss": \([-0-9.e+]*\).*/\1/p'; }
plain=$("$memfit" train "${flags[@]}" --batch 4 --steps 20 --seed 0 --budget 1GiB --json | losses)
planned=$("$memfit" train "${flags[@]}" --batch 4 --steps 20 --seed 0 --budget "$budget" \
  --plan auto --json)
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: the plan did not train (exit $rc)"; exit 1; }
echo "$planned" | grep '"plan"'
if [ -n "${EXPECT_PLAN:-}" ]; then
  echo "$planned" | grep '"plan"' | grep -qF "$EXPECT_PLAN" ||
    { echo "FAIL: the plan lacks $EXPECT_PLAN"; exit 1; }
fi
echo "$planned" | grep -q '"ooms_recovered": [1-9]' && { echo "FAIL: OOMs in the plan"; exit 1; }
paste <(echo "$plain") <(echo "$planned" | losses) | awk '
  { n++; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * ($1 < 0 ? -$1 : $1)) bad++ }
  END { if (n != 20 || bad) { print "FAIL: " bad " of " n " losses differ"; exit 1 } print "ok: 20 losses match" }'
