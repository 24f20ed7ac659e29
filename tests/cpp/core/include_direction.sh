#!/usr/bin/env bash
# include_direction.sh ROOT: core's rooms include downward only. render may
# include model and plan, plan may include model, model neither (see
# src/core/CMakeLists.txt). Prints the count of includes between rooms and
# each include that points up; exits 1 if there is one.
set -uo pipefail
root=$1
bad=0
for from in model plan render; do
  files=$(ls "$root"/src/core/$from/*.{h,cpp} "$root"/include/memfit/core/$from/*.h 2>/dev/null)
  for to in model plan render; do
    [ "$from" = "$to" ] && continue
    hits=$(grep -Hn "#include \"memfit/core/$to/" $files)
    n=$(printf '%s' "$hits" | grep -c . || true)
    echo "$from -> $to: $n"
    case "$from>$to" in
      "model>plan" | "model>render" | "plan>render")
        if [ "$n" -gt 0 ]; then echo "$hits" >&2; bad=1; fi ;;
    esac
  done
done
# Nothing under core reaches torch or the other layers.
if grep -Hn '#include [<"]\(torch\|ATen\|c10\|memfit/torch\|memfit/cli\)' \
     "$root"/src/core/*/*.{h,cpp} "$root"/include/memfit/core/*/*.h >&2; then
  bad=1
fi
exit $bad
