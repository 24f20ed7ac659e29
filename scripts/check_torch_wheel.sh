#!/usr/bin/env bash
# CI on the torch most users have: pip's CUDA wheel (torch 2.14.1, with
# torchvision 0.29.1 and timm: requirements-torch-wheel.txt; the rest pinned
# as in requirements.txt), with no CUDA toolkit on PATH. Installs memfit the
# way the README says, `pip install --no-build-isolation .`, then, from
# outside the checkout (the installed package, not build/): `import memfit`,
# `memfit profile` on the cpu and with --mode meta (what a user tries first;
# this step took over scripts/check_pip_install.sh, which did the same on
# requirements.txt's torch, a second build of what `make test` builds), and
#   1. the Python tests that can differ by torch (Note [Which tests run on
#      the second torch] below);
#   2. a torchvision/timm subset of bench/fit_corpus.py: >= 8 architectures,
#      0 overshoots, found/true >= 0.98 on every fit (scripts/corpus_gate.py);
#   3. meta vs cpu on torchvision's resnet18 and mobilenet_v2
#      (scripts/meta_vs_cpu_torchvision.py).
# Every step's lines start with "[torch X]": the log says what ran on which.
#
#   scripts/check_torch_wheel.sh [VENV]    (default: .venv-torch-wheel)
#
# The venv is made when missing and reused while its requirements are the
# same (stamp VENV/.requirements), as make does with .venv; memfit is
# reinstalled into it on every run. CORPUS_MODELS=a,b,... overrides the corpus
# subset; MEMFIT_WHEEL_STEPS=install,tests,corpus,meta picks steps;
# MEMFIT_WHEEL_TESTS is step 1's -m expression ("" runs every test);
# MEMFIT_WHEEL_REQUIREMENTS names the torch pins in place of
# requirements-torch-wheel.txt (requirements-torch-2.11.txt: the card's).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$src/.venv-torch-wheel}
steps=${MEMFIT_WHEEL_STEPS:-install,tests,corpus,meta}
wheel_requirements=${MEMFIT_WHEEL_REQUIREMENTS:-$src/requirements-torch-wheel.txt}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
quiet() { grep -v "^WARNING: Location .* is ignored" || true; }

# No CUDA toolkit: no nvcc on PATH, no CUDA_HOME (what a new user's GPU box
# with only the driver looks like). memfit must not need them.
keep=()
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do [ -x "$d/nvcc" ] || keep+=("$d"); done
PATH=$(IFS=:; echo "${keep[*]}")
export PATH
unset CUDA_HOME CUDA_PATH CUDA_ROOT CUDAToolkit_ROOT CUDACXX PYTHONPATH

# 1. The venv: requirements.txt less its torch, plus the torch wheel's pins.
{ grep -vE '^torch==' "$src/requirements.txt"; cat "$wheel_requirements"; } \
  >"$work/requirements.txt"
if ! cmp -s "$work/requirements.txt" "$venv/.requirements" 2>/dev/null; then
  "$src/scripts/make_venv.sh" "$venv" "$work/requirements.txt"
fi
py=$venv/bin/python
torch_version=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null)
tag="[torch $torch_version]"
say() { echo "$tag $* ($(($(date +%s) - start)) s)"; }
say "venv $venv; nvcc on PATH: $(command -v nvcc || echo none); CUDA_HOME: ${CUDA_HOME:-unset}"

if [[ $steps == *install* ]]; then
  say "pip install --no-build-isolation $src"
  t0=$(date +%s)
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation "$src" 2>&1 | quiet
  say "installed in $(($(date +%s) - t0)) s"
fi

cd "$work"
"$py" - "$tag" <<'EOF'
import sys
import torch, torchvision, memfit
from memfit import _build_info
print(sys.argv[1], "import torchvision, memfit: ok; torchvision", torchvision.__version__,
      "; memfit built against torch", _build_info.TORCH_VERSION, "from", memfit.__file__)
EOF
"$venv/bin/memfit" profile --model mlp --batch 8 | head -2 | sed "s/^/$tag /"
"$venv/bin/memfit" profile --model mlp --batch 8 --mode meta --json | "$py" -c '
import json, sys
m = json.load(sys.stdin)["mode"]
assert m == "meta", m
print(sys.argv[1], "memfit profile --mode meta: meta")' "$tag"

if [[ $steps == *tests* ]]; then
  # A copy of the tests outside the checkout: conftest.py would otherwise put
  # the checkout's build/python first. bench/, examples/ and tests/ (its
  # data: the snapshot fixtures) are what some tests read beside them.
  # Tests that need build/memfit skip, saying so.
  mkdir -p "$work/tree/python"
  cp -r "$src/python/tests" "$work/tree/python/tests"
  ln -s "$src/bench" "$work/tree/bench"
  ln -s "$src/examples" "$work/tree/examples"
  ln -s "$src/tests" "$work/tree/tests"
  # Note [Which tests run on the second torch]
  # `make test` runs every test on requirements.txt's torch; here run those
  # whose outcome a torch version can change: where memfit meets torch
  # (marker torch_api: the allocator hooks, recording by dispatch, meta
  # kernels, lazy's recording, dynamo, FSDP2, checkpointing, FLOP counting,
  # the extension's layout as pip installs it) and numerics (autocast, bf16,
  # GradScaler, gradients equal to the full batch's: torch's kernels). The
  # rest builds on those: searches, plans, the Trainer's accumulation,
  # reports, the doctor's endings, the integrations (their pins are the
  # same in both venvs) run the same code on any torch once the contact
  # points agree, and take 4/5 of the suite's time (826 of 1,064 s on
  # torch 2.13, 2 busy cores; the marked ones 238 s). torchvision's models,
  # which only this venv has, are the corpus and meta-vs-cpu steps below.
  # MEMFIT_WHEEL_TESTS="" runs every test.
  marks=${MEMFIT_WHEEL_TESTS-torch_api or numerics}
  say "python tests (python/tests${marks:+, -m \"$marks\"}) against the installed memfit"
  # In as many processes as make test runs them (scripts/pytest_jobs.sh).
  jobs=$("$src/scripts/pytest_jobs.sh")
  (cd "$work/tree" && "$py" -m pytest -q -p no:cacheprovider -rs -n "$jobs" \
    --dist loadfile ${marks:+-m "$marks"} python/tests) 2>&1 | sed "s/^/$tag /"
  say "python tests passed"
fi

if [[ $steps == *corpus* ]]; then
  # Cheap architectures of different families (see TV_CLASSIFICATION's
  # budget batches in bench/fit_corpus.py), one thread. Two processes, each
  # every other model (the list is ordered so the halves take about as
  # long): the corpus is single-threaded and CI has two cores; the gate
  # reads bytes and batches, which another process beside it does not move.
  models=${CORPUS_MODELS:-tv-mobilenet_v3_small,tv-shufflenet_v2_x0_5,tv-squeezenet1_1,tv-mnasnet0_5,tv-mobilenet_v2,tv-regnet_x_400mf,tv-efficientnet_b0,tv-resnet18,timm-convnext_atto,timm-vit_tiny_patch16_224}
  say "fit corpus, torchvision and timm: $models (two processes)"
  IFS=, read -ra all <<<"$models"
  half=()
  for i in 0 1; do
    part=()
    for ((j = i; j < ${#all[@]}; j += 2)); do part+=("${all[j]}"); done
    [ ${#part[@]} -gt 0 ] || continue
    (IFS=,; "$py" "$src/bench/fit_corpus.py" --groups tv,timm --only "${part[*]}" --threads 1 \
      >"$work/corpus.$i.log" 2>&1 || true) &
    half+=("$work/corpus.$i.log")
  done
  wait
  cat "${half[@]}" >"$work/corpus.log"
  sed "s/^/$tag /" "$work/corpus.log"
  "$py" "$src/scripts/corpus_gate.py" --min-models 8 --min-ratio 0.98 \
    --expect "$models" "$work/corpus.log" | sed "s/^/$tag /"
  say "fit corpus passed"
fi

if [[ $steps == *meta* ]]; then
  say "meta vs cpu: torchvision resnet18, mobilenet_v2"
  "$py" "$src/scripts/meta_vs_cpu_torchvision.py" resnet18 mobilenet_v2 2>&1 | sed "s/^/$tag /"
  say "meta vs cpu passed"
fi
say "check_torch_wheel: passed"
