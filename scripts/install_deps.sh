#!/usr/bin/env bash
# Installs the Debian packages memfit builds and tests with, if missing.
# Idempotent and quiet when everything is there.
set -euo pipefail

packages=(cmake g++ make libtorch-dev python3-torch pybind11-dev libgtest-dev
          libbenchmark-dev python3-pytest python3-torchvision ccache)
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
