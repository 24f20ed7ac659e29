#!/usr/bin/env bash
# End to end: --progress says each long step on stderr, and stdout is
# byte-identical with and without it (scripts parse stdout); without a
# terminal and without --progress, and with --quiet, stderr stays empty.
# Usage: progress.sh MEMFIT
set -uo pipefail
memfit=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# run NAME EXPECTED_LINE ARGS...: the command plain, with --progress and with --quiet.
run() {
  local name=$1 expect=$2
  shift 2
  "$memfit" "$@" >"$tmp/$name.plain" 2>"$tmp/$name.plain.err" || fail "$name: exit $? plain"
  "$memfit" "$@" --progress >"$tmp/$name.progress" 2>"$tmp/$name.progress.err" ||
    fail "$name: exit $? with --progress"
  "$memfit" "$@" --quiet >"$tmp/$name.quiet" 2>"$tmp/$name.quiet.err" ||
    fail "$name: exit $? with --quiet"
  cmp -s "$tmp/$name.plain" "$tmp/$name.progress" ||
    fail "$name: stdout differs with --progress: $(diff "$tmp/$name.plain" "$tmp/$name.progress" | head -5)"
  cmp -s "$tmp/$name.plain" "$tmp/$name.quiet" || fail "$name: stdout differs with --quiet"
  [ ! -s "$tmp/$name.plain.err" ] || fail "$name: stderr not a terminal, yet: $(head -3 "$tmp/$name.plain.err")"
  [ ! -s "$tmp/$name.quiet.err" ] || fail "$name: --quiet, yet: $(head -3 "$tmp/$name.quiet.err")"
  grep -qE "$expect" "$tmp/$name.progress.err" ||
    fail "$name: no '$expect' on stderr: $(head -5 "$tmp/$name.progress.err")"
  # Every progress line is stamped with the seconds since the command began.
  if grep -vqE '^\[ *[0-9]+\.[0-9]s\] ' "$tmp/$name.progress.err"; then
    fail "$name: an unstamped line: $(grep -vE '^\[ *[0-9]+\.[0-9]s\] ' "$tmp/$name.progress.err" | head -1)"
  fi
  echo "$name: $(wc -l <"$tmp/$name.progress.err") progress lines, stdout identical"
}

run fit '] verify batch [0-9]' fit --model mlp --budget 64MiB --json
run profile_meta '] record batch 8 on (meta|cpu): forward \(iteration 2\)' \
  profile --model mlp --batch 8 --mode meta --json
run predict '] probe batch [0-9]' profile --model mlp --batch 64 --predict --json
run train '] train step 2 of 2, batch 256' train --model mlp --batch 256 --budget 64MiB --steps 2 --seed 1 --json

"$memfit" fit --model mlp --budget 64MiB --progress --quiet >/dev/null 2>"$tmp/both.err"
rc=$?
[ $rc -eq 1 ] || fail "--progress --quiet: exit $rc, not 1"
[ "$(wc -l <"$tmp/both.err")" -eq 1 ] || fail "--progress --quiet: not one line: $(cat "$tmp/both.err")"
echo "ok"
