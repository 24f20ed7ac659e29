#!/usr/bin/env bash
# What a user does: a new venv with torch, `pip install --no-build-isolation .`,
# then `import memfit` and the `memfit` command from outside the checkout.
#   scripts/check_pip_install.sh [VENV]    (default: a temporary folder)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
venv=${1:-$work/venv}
trap 'rm -rf "$work"' EXIT
torch_pin=$(grep -E '^torch==' "$src/requirements.txt")
echo "pip install check: new venv $venv with $torch_pin"
python3 -m venv "$venv"
quiet() { grep -v "^WARNING: Location .* is ignored" || true; }
"$venv/bin/pip" install --quiet --disable-pip-version-check "$torch_pin" \
  $(grep -E '^(numpy|pybind11|scikit-build-core)==' "$src/requirements.txt") 2>&1 | quiet
echo "pip install check: pip install --no-build-isolation $src"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation "$src" 2>&1 | quiet
cd "$work"
"$venv/bin/python" -c 'import memfit, torch; print("import memfit: ok, torch", torch.__version__)'
"$venv/bin/memfit" profile --model mlp --batch 8 | head -2
"$venv/bin/memfit" profile --model mlp --batch 8 --mode meta --json \
  | "$venv/bin/python" -c 'import json, sys; m = json.load(sys.stdin)["mode"]; assert m == "meta", m; print("memfit profile --mode meta: meta")'
echo "pip install check: passed"
