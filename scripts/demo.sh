#!/usr/bin/env bash
# make demo: the main job on a built-in model. Explains where a training
# step's memory goes, predicts a bigger batch without running it, writes
# the timeline as an SVG and the whole report as one HTML page, fits and
# trains under a budget, and plans a step that does not fit even at one
# sample.
set -euo pipefail
build=${1:-build}
out=${MEMFIT_DEMO_OUT:-$build/demo}
mkdir -p "$out"

gpt=(--model gpt --layers 2 --width 128 --context 64)
echo "== memfit profile: a GPT-style model, batch 16, Adam; and per rank on 8 ranks =="
"$build/memfit" profile "${gpt[@]}" --batch 16 --optimizer adam --target cuda --world-size 8 \
  --svg "$out/gpt_profile.svg" --html "$out/gpt_profile.html" --budget 256MiB
echo
echo "== memfit profile --predict: batch 256, from probes grown toward it, each checked =="
"$build/memfit" profile "${gpt[@]}" --batch 256 --optimizer adam --predict
echo
echo "== memfit fit: the largest batch under 256 MiB =="
"$build/memfit" fit "${gpt[@]}" --budget 256MiB
echo
echo "== memfit train: batch 512 under 256 MiB, split into micro-batches that fit =="
"$build/memfit" train "${gpt[@]}" --batch 512 --budget 256MiB --steps 2
echo
echo "== memfit advise: batch 8 under 9 MiB, where even one sample does not fit plainly =="
echo "   (checkpointing, Adam's state on the host, micro-batches: each measured)"
"$build/memfit" advise "${gpt[@]}" --batch 8 --budget 9MiB --repeats 1
echo
echo "== the report page (open it in a browser; one file, no network) =="
echo "$(cd "$(dirname "$out/gpt_profile.html")" && pwd)/gpt_profile.html"
