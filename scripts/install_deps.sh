#!/usr/bin/env bash
# Installs the Debian packages memfit builds and tests with that pip does not
# serve (compilers, cmake, GoogleTest, Google Benchmark, ccache), if missing,
# and chromium, the headless browser the HTML page's test renders it in.
# torch and the Python packages come from pip, into .venv (requirements.txt).
# Idempotent and quiet when everything is there. chromium is optional: where
# it cannot be installed (not root, or no such package), the build goes on
# and the browser test is skipped, saying why.
set -euo pipefail

packages=(cmake g++ make libgtest-dev libbenchmark-dev ccache python3-venv)
optional=(chromium)
installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}
missing=() missing_optional=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
for p in "${optional[@]}"; do installed "$p" || missing_optional+=("$p"); done
[ ${#missing[@]} -eq 0 ] && [ ${#missing_optional[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  SUDO=
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  SUDO=sudo
else
  if [ ${#missing[@]} -gt 0 ]; then
    echo "memfit: these packages are missing and I am not root: ${missing[*]}" >&2
    echo "memfit: run as root: apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "memfit: ${missing_optional[*]} missing (not root): the browser test of the HTML page will be skipped"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  echo "memfit: installing missing Debian packages: ${missing[*]}"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#missing_optional[@]} -gt 0 ]; then
  echo "memfit: installing ${missing_optional[*]} (the HTML page's browser test)"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing_optional[@]}" >/dev/null \
    || echo "memfit: could not install ${missing_optional[*]}: the browser test will be skipped"
fi
echo "memfit: packages installed"
