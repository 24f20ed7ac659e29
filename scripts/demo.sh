#!/usr/bin/env bash
# make demo: the main job on a built-in model. Explains where a training
# step's memory goes, predicts a bigger batch without running it, and writes
# the timeline as an SVG.
set -euo pipefail
build=${1:-build}
out=${MEMFIT_DEMO_OUT:-$build/demo}
mkdir -p "$out"

echo "== memfit profile: a GPT-style model, batch 8, Adam =="
"$build/memfit" profile --model gpt --batch 8 --optimizer adam --target cuda \
  --svg "$out/gpt_profile.svg"
echo
echo "== memfit profile --predict: batch 256, from probes at 4, 8 and 16 =="
"$build/memfit" profile --model gpt --batch 256 --optimizer adam --predict
