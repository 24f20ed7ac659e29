#!/usr/bin/env bash
# Installs the Debian packages memfit builds and tests with that pip does not
# serve (compilers, cmake, GoogleTest, Google Benchmark, ccache), if missing.
# torch and the Python packages come from pip, into .venv (requirements.txt).
# Idempotent and quiet when everything is there.
set -euo pipefail

packages=(cmake g++ make libgtest-dev libbenchmark-dev ccache python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "memfit: installing missing Debian packages: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO=sudo
  else
    echo "memfit: these packages are missing and I am not root: ${missing[*]}" >&2
    echo "memfit: run as root: apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "memfit: packages installed"
