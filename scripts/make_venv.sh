#!/usr/bin/env bash
# make_venv.sh VENV REQUIREMENTS: makes the virtual environment and installs
# the pinned packages; the stamp VENV/.requirements records that it is done.
set -euo pipefail
venv=$1 req=$2
py=${MEMFIT_BASE_PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "memfit: making $venv with $($py --version 2>&1)"
  "$py" -m venv "$venv"
fi
echo "memfit: installing $req into $venv (torch is large: a minute or two)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" 2>&1 \
  | grep -v "^WARNING: Location .* is ignored" || true
"$venv/bin/python" -c 'import torch' \
  || { echo "memfit: torch does not import in $venv" >&2; exit 1; }
cp "$req" "$venv/.requirements"
