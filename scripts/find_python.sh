#!/usr/bin/env bash
# Prints the first Python interpreter that can import torch. The python3 first
# on PATH may be another interpreter without it (e.g. pyenv's), so Debian's
# /usr/bin/python3 is tried first. MEMFIT_PYTHON overrides.
set -u
for py in ${MEMFIT_PYTHON:-} /usr/bin/python3 python3 python; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import torch' >/dev/null 2>&1; then
    command -v "$py"
    exit 0
  fi
done
echo "memfit: no Python with torch found (tried ${MEMFIT_PYTHON:-} /usr/bin/python3 python3 python); run scripts/install_deps.sh or set MEMFIT_PYTHON" >&2
exit 1
